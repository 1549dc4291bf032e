"""benchmarks/plan_accuracy.py reports the out-of-family error next to the other predictors."""

from __future__ import annotations

import json

import pytest

from benchmarks import plan_accuracy


def test_accuracy_report_has_a_leave_one_family_out_predictor(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert plan_accuracy.main(["--output", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["summary"]) == {"shipped", "held-out", "lofo", "naive"}
    assert len(doc["families"]) >= 3
    assert all("lofo_err_pct" in row for row in doc["rows"])


def test_out_of_family_median_error_beats_the_naive_budget(
    capsys: pytest.CaptureFixture[str],
) -> None:
    plan_accuracy.main(["--output", "json"])
    summary = json.loads(capsys.readouterr().out)["summary"]
    assert summary["lofo"]["median_abs_error_pct"] < summary["naive"]["median_abs_error_pct"]


def test_a_start_that_prints_its_weights_refits_the_sampler() -> None:
    # gpt-oss-20b on an A100 (0.19) prints weights and KV memory but no profile breakdown:
    # what they leave of the ceiling is the sampler-dominated peak, so the refit of the
    # 0.17+ sampler path moves off the code count.
    from benchmarks.sizing_points import load_points

    plan_accuracy.load_notes()
    row = next(p for p in load_points() if p.model == "openai/gpt-oss-20b")
    refit = plan_accuracy.fit([row], plan_accuracy.PRIOR)
    assert refit.sampler_kernel_bytes > plan_accuracy.PRIOR.sampler_kernel_bytes


def test_every_exactness_row_is_reproduced_and_cpu_rows_stay_out_of_the_error_figures(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from benchmarks.sizing_points import load_points

    assert plan_accuracy.main(["--output", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    points = load_points()
    # The CPU rows' KV memory is VLLM_CPU_KVCACHE_SPACE: set, not measured, so only exactness.
    assert len(doc["rows"]) == sum(1 for p in points if not p.kv_memory_set)
    assert doc["exactness"]["rows"] >= 11
    assert doc["exactness"]["within_0.01pct"] == doc["exactness"]["rows"]


def test_leave_one_family_out_is_broken_down_by_family_gpu_and_release(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert plan_accuracy.main(["--output", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = len(doc["rows"])
    for key in ("family", "gpu", "release"):
        groups = doc["lofo_by"][key]
        assert sum(g["rows"] for g in groups.values()) == rows
        assert all(g["max_abs_error_pct"] >= g["median_abs_error_pct"] for g in groups.values())
    assert set(doc["lofo_by"]["family"]) == set(doc["families"])
