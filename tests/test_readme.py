"""The README is a short front page; the reference lives in docs/, the tables generated.

The metric and configuration tables in docs/ are written by ``docs/generate.py`` from
``exporter.metrics.METRICS`` and the config specs; ``--check`` fails when a page differs
from what the code would write, so a metric or setting added in code cannot go undocumented.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from exporter.cli import main
from exporter.config import _SPECS
from exporter.metrics import METRICS

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_generate", DOCS / "generate.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generated_reference_pages_match_the_code() -> None:
    proc = subprocess.run(
        [sys.executable, str(DOCS / "generate.py"), "--check"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr


def test_the_generator_check_fails_on_a_stale_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gen = generator()
    monkeypatch.setattr(gen, "DOCS", tmp_path)
    assert gen.main([]) == 0  # writes both pages into tmp_path
    assert gen.main(["--check"]) == 0
    page = tmp_path / "metrics.md"
    page.write_text(page.read_text().replace("kv_headroom_preemption_risk", "kv_headroom_risk"))
    assert gen.main(["--check"]) == 1


@pytest.mark.parametrize("spec", METRICS, ids=lambda s: s.name)
def test_every_metric_is_in_the_metrics_page(spec: object) -> None:
    name = spec.full + ("_total" if spec.kind == "counter" else "")  # type: ignore[attr-defined]
    assert f"| `{name}` | {spec.kind} |" in (DOCS / "metrics.md").read_text()  # type: ignore[attr-defined]


@pytest.mark.parametrize("key", [s.key for s in _SPECS])
def test_every_config_key_is_in_the_configuration_page(key: str) -> None:
    assert f"| `{key}` |" in (DOCS / "configuration.md").read_text()


def test_the_readme_is_a_front_page_not_a_manual() -> None:
    assert len(README.splitlines()) <= 250


def test_the_readme_shows_the_status_page_on_its_first_screen() -> None:
    first_screen = "\n".join(README.splitlines()[:24])
    picture = re.search(r"!\[[^\]]*\]\((docs/[^)]+\.png)\)", first_screen)
    assert picture
    assert (ROOT / picture.group(1)).is_file()


def test_the_readme_carries_no_test_counts() -> None:
    # Counts go stale with every test added; the README says how to run them instead.
    assert not re.search(r"\b\d[\d,]* tests\b", README)


def _links(path: Path) -> list[str]:
    return re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text())


@pytest.mark.parametrize(
    "page", [ROOT / "README.md", *sorted(DOCS.glob("*.md"))], ids=lambda p: p.name
)
def test_every_relative_link_resolves(page: Path) -> None:
    missing = [
        link for link in _links(page) if "://" not in link and not (page.parent / link).exists()
    ]
    assert missing == []


PLAN_EXAMPLE = re.compile(r"```\n\$ kv-headroom (plan (?:[^\n]*\\\n)*[^\n]+)\n(.*?)\n```", re.S)


def _is_excerpt(shown: list[str], printed: list[str]) -> bool:
    """Whether ``shown`` is ``printed`` with each "…" line standing for any lines (none too):
    the runs between them appear in order, each whole, and a run at either end of ``shown``
    is anchored to that end of ``printed``."""
    runs: list[list[str]] = [[]]
    for line in shown:
        if line.strip() == "…":
            runs.append([])
        else:
            runs[-1].append(line)
    if len(runs) == 1:
        return shown == printed
    first, *middle, last = runs
    if printed[: len(first)] != first or (last and printed[len(printed) - len(last) :] != last):
        return False
    at, end = len(first), len(printed) - len(last)
    for run in middle:
        found = next(
            (j for j in range(at, end - len(run) + 1) if printed[j : j + len(run)] == run), None
        )
        if found is None:
            return False
        at = found + len(run)
    return at <= end


def _examples() -> list[tuple[str, str, str]]:
    """(page, command, output shown) of every ``$ kv-headroom plan`` block of the pages."""
    return [
        (page.name, m.group(1), m.group(2))
        for page in (ROOT / "README.md", DOCS / "plan-flags.md")
        for m in PLAN_EXAMPLE.finditer(page.read_text())
    ]


def test_every_page_with_plan_output_shows_its_command() -> None:
    assert [page for page, _, _ in _examples()] == ["README.md"] + ["plan-flags.md"] * 3


@pytest.mark.parametrize(
    ("page", "command", "shown"),
    [pytest.param(*e, id=f"{e[0]}-{i}") for i, e in enumerate(_examples())],
)
def test_a_plan_example_is_what_plan_prints(
    page: str, command: str, shown: str, capsys: pytest.CaptureFixture[str]
) -> None:
    main(command.replace("\\\n", " ").split())  # its exit status is the example's to show
    printed = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert _is_excerpt([line for line in shown.splitlines() if line.strip()], printed)


def test_an_excerpt_keeps_its_runs_whole_and_in_order() -> None:
    printed = ["a", "b", "c", "d"]
    assert _is_excerpt(["a", "b", "c", "d"], printed)
    assert _is_excerpt(["a", "…", "d"], printed)
    assert _is_excerpt(["…", "b", "c", "…"], printed)
    assert not _is_excerpt(["a", "b", "c"], printed)  # no "…": the whole output
    assert not _is_excerpt(["…", "c", "b", "…"], printed)
    assert not _is_excerpt(["…", "b", "d", "…"], printed)
    assert not _is_excerpt(["b", "…"], printed)  # a first run starts the output


def _alert_row(section: str, rule: str) -> tuple[str, str, str]:
    """(median lead, worst lead, false-alarm minutes per safe hour) of ``rule`` in one
    section of ``docs/traffic/alert-quality.txt``, leads with the README's minus sign."""
    text = (DOCS / "traffic" / "alert-quality.txt").read_text()
    block = text.split(f"\n{section}\n", 1)[1]
    m = re.search(rf"^{rule}\s+[\d.]+\s+([+-]\d+) s\s+([+-]\d+) s\s+([\d.]+)", block, re.M)
    assert m, f"no {rule} row under {section!r}"
    lead, worst, fa = m.groups()
    return lead.lstrip("+").replace("-", "−"), worst.lstrip("+").replace("-", "−"), fa


def test_the_readmes_alert_figures_are_the_benchmarks_last_output() -> None:
    page, page_real = (
        _alert_row("all scenarios", "kv_headroom"),
        _alert_row("real traffic", "kv_headroom"),
    )
    warn = _alert_row("all scenarios", "kv_headroom_warning")
    warn_real = _alert_row("real traffic", "kv_headroom_warning")
    quoted = (
        f"a median {page[0]} s before the first preemption ({page_real[0]} s on real traffic; "
        f"{page[1]} s at worst) for {page[2]} false-alarm minutes per safe hour ({page_real[2]} "
        f"real), the warning {warn[0]} s ({warn_real[0]} s) ahead for {warn[2]} ({warn_real[2]})"
    )
    assert quoted in " ".join(README.split())
