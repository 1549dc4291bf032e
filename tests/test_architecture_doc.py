"""docs/architecture.md names every module of the package, the dashboards and the rules'
generator, each with what it owns, and nothing that is gone: a newcomer reads one sentence
per module there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = ("exporter", "dashboards", "rules")
# A package's __init__ holds its docstring only, and __main__ only calls cli.main: neither
# owns anything a row could name.
NOT_OWNERS = frozenset({"__init__.py", "__main__.py"})
ROW = re.compile(r"^\| `([^`]+\.py)` \| (.*) \|$", re.M)


def modules() -> set[str]:
    return {
        path.relative_to(ROOT).as_posix()
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if path.name not in NOT_OWNERS
    }


def rows() -> dict[str, str]:
    return dict(ROW.findall(DOC.read_text()))


def test_every_module_has_a_row() -> None:
    assert sorted(modules() - rows().keys()) == []


def test_every_row_names_a_module_that_exists() -> None:
    assert sorted(rows().keys() - modules()) == []


def test_every_row_says_what_its_module_owns() -> None:
    assert [name for name, owns in rows().items() if len(owns.strip()) < 20] == []
