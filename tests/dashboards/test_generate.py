"""dashboards/generate.py: the committed JSON is what the code generates, and stays so."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dashboards import generate
from tests.dashboards.conftest import FOLDER


def test_committed_json_equals_a_fresh_generation() -> None:
    for name, text in generate.rendered().items():
        assert (FOLDER / name).read_text() == text, f"{name}: run python dashboards/generate.py"


def test_generation_is_deterministic() -> None:
    assert generate.rendered() == generate.rendered()


def test_check_passes_on_the_committed_files() -> None:
    assert generate.main(["--check"]) == 0


def test_check_fails_on_a_stale_file_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in generate.DASHBOARDS:
        shutil.copy(FOLDER / name, tmp_path / name)
    stale = tmp_path / "gpu-memory.json"
    stale.write_text(stale.read_text().replace("GPU memory", "GPU memroy"))
    before = stale.read_text()
    assert generate.main(["--check", "--out", str(tmp_path)]) == 1
    assert stale.read_text() == before
    assert "gpu-memory.json" in capsys.readouterr().err


def test_check_fails_on_a_missing_file(tmp_path: Path) -> None:
    assert generate.main(["--check", "--out", str(tmp_path)]) == 1


def test_generate_writes_every_dashboard(tmp_path: Path) -> None:
    assert generate.main(["--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(generate.DASHBOARDS)


def test_panel_queries_lists_every_query_of_the_committed_files() -> None:
    from_files = generate.panel_queries(FOLDER)
    assert from_files == generate.panel_queries()
    assert len(from_files) > 40
    assert {board for board, _, _ in from_files} == {
        "KV cache capacity",
        "KV cache pressure",
        "Context lengths",
        "GPU memory",
        "Fleet overview",
    }


def test_runnable_replaces_every_dashboard_variable() -> None:
    for _, _, expr in generate.panel_queries():
        text = generate.runnable(expr)
        for name in ("$namespace", "$model", "$pod", "$__rate_interval", "$__range", "${"):
            assert name not in text


def test_runnable_keeps_label_replace_references() -> None:
    expr = 'label_replace(foo{pod=~"$pod"}, "target", "$1", "pod", "(.+)")'
    assert generate.runnable(expr) == 'label_replace(foo{pod=~".*"}, "target", "$1", "pod", "(.+)")'


def test_runnable_takes_other_values() -> None:
    expr = 'rate(foo{pod=~"$pod"}[$__rate_interval])'
    assert generate.runnable(expr, {"pod": "vllm-0", "__rate_interval": "2m"}) == (
        'rate(foo{pod=~"vllm-0"}[2m])'
    )
