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
    assert set(doc["summary"]) == {"shipped", "held-out", "lofo", "loeo", "naive"}
    assert len(doc["families"]) >= 3
    assert all("lofo_err_pct" in row for row in doc["rows"])


def test_out_of_family_median_error_beats_the_naive_budget(
    capsys: pytest.CaptureFixture[str],
) -> None:
    plan_accuracy.main(["--output", "json"])
    summary = json.loads(capsys.readouterr().out)["summary"]
    assert summary["lofo"]["median_abs_error_pct"] < summary["naive"]["median_abs_error_pct"]


def test_a_start_that_prints_its_weights_refits_the_compile_transient_not_the_sampler() -> None:
    # Llama-3.1-8B on an A100 (0.31) prints weights and KV memory: what they, the counted
    # forward and sampler, the graph estimate and non-torch memory leave of the ceiling is
    # the cold torch.compile's transient, which no code sizes and so is refit; the sampler's
    # bytes are vLLM's code count and the graph estimate the printed estimates' median, and
    # both stay as they are.
    from benchmarks.sizing_points import load_points

    plan_accuracy.load_notes()
    row = next(
        p
        for p in load_points()
        if p.model == "meta-llama/Llama-3.1-8B-Instruct" and p.request.release.label == "0.31.0"
    )
    refit = plan_accuracy.fit([row], plan_accuracy.PRIOR)
    assert refit.compile_bytes > plan_accuracy.PRIOR.compile_bytes == 0
    assert refit.cuda_graph == plan_accuracy.PRIOR.cuda_graph
    assert refit.sampler_kernel_bytes == plan_accuracy.PRIOR.sampler_kernel_bytes
    assert refit.sampler_v2_bytes == plan_accuracy.PRIOR.sampler_v2_bytes


def test_leave_one_release_era_out_reports_the_newest_era_on_its_own(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert plan_accuracy.main(["--output", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    newest = doc["newest_era"]
    assert newest["era"] == plan_accuracy.NEWEST_ERA
    assert newest["rows"] == sum(1 for r in doc["rows"] if r["era"] == plan_accuracy.NEWEST_ERA)
    assert newest["rows"] >= 5
    assert set(newest) >= {"lofo", "loeo"}
    assert sum(g["rows"] for g in doc["loeo_by_era"].values()) == len(doc["rows"])


def test_a_held_out_era_is_predicted_without_its_own_rows() -> None:
    # Held out, the 0.27+ era's non-torch memory cannot come from its own Llama-3.1-8B
    # 0.31 row: the refit on the other eras keeps the prior's figure for that era.
    from benchmarks.sizing_points import load_points

    plan_accuracy.load_notes()
    points = [p for p in load_points() if not p.kv_memory_set]
    others = [p for p in points if plan_accuracy.release_era(p) != plan_accuracy.NEWEST_ERA]
    refit = plan_accuracy.fit(others, plan_accuracy.PRIOR)
    newest_single = dict(refit.non_torch_single_by_era)[(0, 27, 0)]
    assert newest_single == dict(plan_accuracy.PRIOR.non_torch_single_by_era)[(0, 27, 0)]


def test_the_shipped_residuals_are_the_refit_on_every_gpu_start() -> None:
    # The documented procedure: the two residuals (non-torch memory per era, the 0.20+
    # compile transient per layer × MLP width) ship as the refit on every GPU start of the
    # fixture, to the two decimals the docs give; a row added without refitting fails here.
    from benchmarks.sizing_points import load_points
    from exporter.capacity.gpus import GIB
    from exporter.capacity.memory import OverheadModel

    plan_accuracy.load_notes()
    points = [p for p in load_points() if not p.kv_memory_set]
    refit, shipped = plan_accuracy.fit(points, plan_accuracy.PRIOR), OverheadModel()

    def gib(value: int) -> float:
        return round(value / GIB, 2)

    assert gib(int(refit.compile_bytes)) == gib(int(shipped.compile_bytes))
    for table in ("non_torch_single_by_era", "non_torch_tp_by_era"):
        assert [(since, gib(b)) for since, b in getattr(refit, table)] == [
            (since, gib(b)) for since, b in getattr(shipped, table)
        ]


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
