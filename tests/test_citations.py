"""Shipped code cites what any reader can open: a path inside this repository or a public
source (vLLM's tree at a release, an issue, a commit), never a checkout beside it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted((ROOT / "exporter").rglob("*.py"))
# A relative path that climbs out of the repository, such as ``../shared/reference/x.md``.
OUTSIDE = re.compile(r"\.\./[\w.-]+/")


@pytest.mark.parametrize("module", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_shipped_module_cites_no_path_outside_the_repository(module: Path) -> None:
    cited = [
        f"line {n}: {line.strip()}"
        for n, line in enumerate(module.read_text(encoding="utf-8").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert cited == []
