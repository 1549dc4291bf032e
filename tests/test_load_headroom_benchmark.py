"""benchmarks/load_headroom.py: how it scores the live ratio against the replayed truth."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.load_headroom import (
    below_one_since,
    misjudge_steps,
    summarise,
    truths_from,
    window_traffic,
)
from exporter.capacity.steptime import step_times
from exporter.plan.traffic import Traffic
from exporter.replay import Replay, Tick
from exporter.simulator.scenario import Arrival
from exporter.simulator.simulation import load_scenario, size


def run(first: float | None, lead: float | None, windows: list[tuple[float, float]]) -> Any:
    return {
        "first_preemption_seconds": first,
        "lead_seconds": lead,
        "below_one_minutes": 0.0,
        "windows": [
            {"live": live, "true": true, "true_binding": "kv_cache"} for live, true in windows
        ],
    }


def test_the_error_counts_only_windows_whose_truth_is_above_one_point_two() -> None:
    result = summarise([run(None, None, [(2.2, 2.0), (3.0, 2.0), (0.1, 0.9)])])
    assert result["windows_true_above_1_2"] == 2
    assert result["relative_error"]["median"] == pytest.approx(0.5)


def test_the_error_is_also_reported_over_windows_whose_live_ratio_is_above_one_point_two() -> None:
    result = summarise([run(None, None, [(2.2, 2.0), (3.0, 1.0), (0.1, 1.5)])])
    assert result["windows_live_above_1_2"] == 2
    assert result["relative_error_live_above_1_2"]["median"] == pytest.approx(2.0)


def test_real_traffic_and_synthetic_errors_are_reported_apart_with_their_sign() -> None:
    real = {**run(None, None, [(1.0, 2.0), (1.5, 2.0)]), "real_traffic": True}
    synthetic = run(None, None, [(3.0, 2.0)])
    split = summarise([real, synthetic])["relative_error_by_traffic"]
    assert split["real_traffic"]["windows"] == 2
    assert split["real_traffic"]["share_below_truth"] == 1.0
    assert split["real_traffic"]["signed_median"] == pytest.approx(-0.25)
    assert split["synthetic"]["signed_median"] == pytest.approx(0.5)


def test_an_overload_run_counts_as_warned_only_with_a_positive_lead() -> None:
    result = summarise([run(600.0, 30.0, []), run(600.0, -10.0, []), run(600.0, None, [])])
    assert result["overload_runs"] == 3
    assert result["below_one_before_first_preemption"] == 1


def tick(t: float, ratio: float | None) -> Tick:
    return Tick(t, 0.5, 0.0, 0, 1.0, 0.0, 0.0, 60.0, 0.0, load_headroom_ratio=ratio,
                load_headroom_resource="kv_cache")  # fmt: skip


def test_below_one_must_hold_for_the_whole_hold_time() -> None:
    ratios = [1.5, 0.9, 1.1, 0.9, 0.8, 0.7, 0.6]
    ticks = [tick(2.0 * i, r) for i, r in enumerate(ratios)]
    rep = Replay(load_scenario("steady"), ticks, None)
    assert below_one_since(rep, hold=4.0) == 6.0


def test_a_window_is_its_arrivals_from_zero_repeated() -> None:
    traffic = Traffic.of("t", [Arrival(float(t), 100, 10) for t in range(0, 100, 10)])
    piece = window_traffic(traffic, 20.0, 30.0, laps=2)
    assert [a.time for a in piece.base] == [0.0, 10.0, 20.0, 30.0, 40.0, 50.0]


def test_truths_of_an_earlier_run_are_found_by_scenario_seed_and_window(tmp_path: Path) -> None:
    earlier = {"runs": [{"name": "s", "seed": 3, "windows": [
        {"start_seconds": 300.0, "true": 2.5, "true_binding": "compute"}]}]}  # fmt: skip
    (tmp_path / "run.json").write_text(json.dumps(earlier))
    assert truths_from(tmp_path / "run.json") == {("s", 3, 300.0): (2.5, "compute")}


def test_a_misjudging_sidecar_takes_the_asked_multiple_of_the_step_times(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import exporter.snapshot

    monkeypatch.setattr(exporter.snapshot, "step_times", step_times)  # restored after
    planned = size(load_scenario("steady")).plan
    misjudge_steps(2.0, 0.5)
    wrong = exporter.snapshot.step_times(planned)  # type: ignore[attr-defined]
    right = step_times(planned)
    assert wrong.per_prefill_token_s == pytest.approx(2 * right.per_prefill_token_s)
    assert wrong.per_kv_token_s == pytest.approx(0.5 * right.per_kv_token_s)
    assert wrong.base_s == right.base_s
