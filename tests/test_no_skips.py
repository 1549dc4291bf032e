"""No test skips where what it checks cannot run: it fails (``tests.conftest.require``).

A skip reads as a pass in a green run, so a missing promtool, kubectl or vLLM would hide
the check it guards (issue 29). The one exception is a pair that splits on the machine
itself: NVML with a driver and without one, each checked where it applies.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# Both halves of one check: with an NVIDIA driver, and without one (the usual CI machine).
ALLOWED = {"sources/test_nvml.py": 2}


def skips_in(source: str) -> int:
    """Calls of pytest.skip, pytest.importorskip and marks skip/skipif in one file."""
    names = {"skip", "skipif", "importorskip"}
    return sum(
        1
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute)
        and node.attr in names
        and isinstance(node.value, ast.Name | ast.Attribute)
        and (
            getattr(node.value, "id", None) == "pytest" or getattr(node.value, "attr", "") == "mark"
        )
    )


def test_skips_in_finds_each_form_of_skip() -> None:
    source = (
        "import pytest\npytest.skip('x')\n@pytest.mark.skipif(True, reason='y')\ndef f(): pass\n"
    )
    source += "pytest.importorskip('z')\n"
    assert skips_in(source) == 3


def test_no_test_skips_except_the_nvml_pair() -> None:
    found = {}
    for path in sorted(TESTS.rglob("*.py")):
        rel = path.relative_to(TESTS).as_posix()
        if path.name == Path(__file__).name:
            continue
        if n := skips_in(path.read_text(encoding="utf-8")):
            found[rel] = n
    assert found == ALLOWED
