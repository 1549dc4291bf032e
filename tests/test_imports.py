"""The import rules of docs/architecture.md, read from the code with ``ast``: no import loop
anywhere in the package, none between ``exporter/deployment.py`` and ``exporter/sources/``,
``metrics`` imports no source, and the poller imports no capacity module.

Every import statement of a module counts, wherever it is written: at the top, under
``if TYPE_CHECKING:`` (a type-only import is still a dependency a reader has to follow, and
the loops issue 29 found among ``sources/*`` were type-only ones), and inside a function (a
deferred import is a loop put off, not removed). ``from exporter import snapshot`` counts as
an import of ``exporter.snapshot``; a package's ``__init__`` is a docstring and adds nothing.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "exporter"

DEPLOYMENT = "exporter.deployment"
SOURCES = "exporter.sources"
METRICS = "exporter.metrics"
POLLER = "exporter.poller"
CAPACITY = "exporter.capacity"


@dataclass(frozen=True)
class Import:
    target: str  # a module of the package
    line: int
    where: str  # "top", "TYPE_CHECKING" or "function"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((ROOT / PACKAGE).rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _statements(tree: ast.Module) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement, with where it is written."""

    def walk(node: ast.AST, where: str) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child, where
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                yield from walk(child, "function")
            elif isinstance(child, ast.If) and _is_type_checking(child) and where == "top":
                yield from walk(child, "TYPE_CHECKING")
            else:
                yield from walk(child, where)

    yield from walk(tree, "top")


def imports_in(source: str, name: str, known: frozenset[str]) -> list[Import]:
    """The package modules a module's source imports; ``name`` is its dotted name."""
    package = name if name in known and _is_package(name) else name.rpartition(".")[0]
    out = []
    for node, where in _statements(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        for target in targets:
            while target and target not in known:  # `import exporter.x.y` of a name in y
                target = target.rpartition(".")[0]
            if target and target != name:
                out.append(Import(target, node.lineno, where))
    return out


def _is_package(name: str) -> bool:
    return modules().get(name, Path()).name == "__init__.py"


@cache
def graph() -> dict[str, tuple[Import, ...]]:
    known = frozenset(modules())
    return {
        name: tuple(imports_in(path.read_text(encoding="utf-8"), name, known))
        for name, path in modules().items()
    }


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def path_between(start: str, goal: str) -> list[str] | None:
    """The shortest chain of imports from start to a module where goal(module), or None."""
    seen, frontier = {start}, [[start]]
    while frontier:
        nxt = []
        for chain in frontier:
            for imp in graph()[chain[-1]]:
                if imp.target == goal:
                    return [*chain, goal]
                if imp.target not in seen:
                    seen.add(imp.target)
                    nxt.append([*chain, imp.target])
        frontier = nxt
    return None


def _show(imports: list[tuple[str, Import]]) -> list[str]:
    return [f"{m} line {i.line} ({i.where}): {i.target}" for m, i in imports]


# --- the reader itself ---------------------------------------------------------------------

SAMPLE = """\
from __future__ import annotations
import os
from typing import TYPE_CHECKING
from exporter import snapshot as snapshots, __version__
from exporter.sources.vllm_page import CacheConfig
from . import labels
from .risk import model
if TYPE_CHECKING:
    from exporter.config import Config
def later() -> None:
    import exporter.capacity.plan
"""


def test_the_reader_sees_every_kind_of_import() -> None:
    known = frozenset(
        {
            "exporter",
            "exporter.snapshot",
            "exporter.sources",
            "exporter.sources.vllm_page",
            "exporter.labels",
            "exporter.risk",
            "exporter.risk.model",
            "exporter.config",
            "exporter.capacity",
            "exporter.capacity.plan",
            "exporter.metrics",
        }
    )
    found = {(i.target, i.where) for i in imports_in(SAMPLE, "exporter.metrics", known)}
    assert found == {
        ("exporter.snapshot", "top"),
        ("exporter", "top"),
        ("exporter.sources.vllm_page", "top"),
        ("exporter.labels", "top"),
        ("exporter.risk.model", "top"),
        ("exporter.config", "TYPE_CHECKING"),
        ("exporter.capacity.plan", "function"),
    }


def test_the_reader_reads_the_package() -> None:
    assert {DEPLOYMENT, METRICS, POLLER, "exporter.sources.base"} <= set(graph())
    assert any(i.target == "exporter.snapshot" for i in graph()[POLLER])


# --- the rules -----------------------------------------------------------------------------


def test_no_module_imports_itself_back() -> None:
    loops = []
    for name, imports in graph().items():
        back = next((c for c in (path_between(i.target, name) for i in imports) if c), None)
        if back is not None:
            loops.append(" -> ".join([name, *back]))
    assert loops == []


def test_no_loop_between_deployment_and_sources() -> None:
    # sources/ counts as one room: deployment reaching any source while any source reaches
    # deployment is the loop, even when no single module lies on both chains.
    in_sources = [m for m in graph() if _within(m, SOURCES)]
    there = [c for c in (path_between(DEPLOYMENT, m) for m in in_sources) if c]
    back = [c for c in (path_between(m, DEPLOYMENT) for m in in_sources) if c]
    if there and back:
        shortest = min(there, key=len), min(back, key=len)
        raise AssertionError(" -> ".join(shortest[0]) + " and " + " -> ".join(shortest[1]))


def test_metrics_imports_no_source() -> None:
    bad = [(METRICS, i) for i in graph()[METRICS] if _within(i.target, SOURCES)]
    assert _show(bad) == []


def test_the_poller_imports_no_capacity_module() -> None:
    bad = [(POLLER, i) for i in graph()[POLLER] if _within(i.target, CAPACITY)]
    assert _show(bad) == []
