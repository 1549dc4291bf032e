"""The README documents every exported metric and every configuration key."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.config import _SPECS
from exporter.metrics import METRICS

README = (Path(__file__).parent.parent / "README.md").read_text()


@pytest.mark.parametrize("spec", METRICS, ids=lambda s: s.name)
def test_every_metric_is_in_the_readme_table(spec: object) -> None:
    name = spec.full + ("_total" if spec.kind == "counter" else "")  # type: ignore[attr-defined]
    assert f"| `{name}` | {spec.kind} |" in README  # type: ignore[attr-defined]


@pytest.mark.parametrize("key", [s.key for s in _SPECS])
def test_every_config_key_is_in_the_readme_table(key: str) -> None:
    assert f"| `{key}` |" in README
