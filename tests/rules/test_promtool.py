"""The rule files load in Prometheus and pass their promtool unit tests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.rules.rulefiles import RULE_FILES, TEST_FILES


def promtool(*args: str | Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    # A missing promtool fails the test rather than skipping it: a run without it must not
    # pass the rules unchecked (as in tests/dashboards/test_metric_lint.py).
    path = shutil.which("promtool")
    assert path, "promtool is missing: install Debian's prometheus package (.ci/run does)"
    return subprocess.run(
        [path, *map(str, args)], capture_output=True, text=True, timeout=timeout, check=False
    )


def test_rule_files_pass_promtool_check() -> None:
    assert RULE_FILES, "no rules/*.rules.yml"
    result = promtool("check", "rules", *RULE_FILES)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("test_file", TEST_FILES, ids=lambda p: p.name)
def test_promtool_unit_tests_pass(test_file: Path) -> None:
    result = promtool("test", "rules", test_file)
    assert result.returncode == 0, result.stdout + result.stderr
