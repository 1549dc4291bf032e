"""benchmarks/alert_quality.py: Prometheus's for: semantics, lead times, and its JSON."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from benchmarks.alert_quality import main, plot
from benchmarks.alert_scoring import (
    RULES,
    Rule,
    episodes,
    evaluate,
    held_longest,
    lead,
    near_miss_seconds,
    targets,
)
from exporter.replay import Replay, Tick, gauge_resource
from exporter.risk.model import ALERT_FOR_SECONDS, HORIZON
from exporter.simulator.scenario import parse_scenario


def ticks(values: list[float], every: float = 5.0) -> list[Tick]:
    return [
        Tick(t=(i + 1) * every, usage=v, preemptions_counted=0.0, preempted=0, running=0.0,
             waiting=0.0, preemption_risk=v, seconds_to_exhaustion=float("inf"),
             overcommit_ratio=0.0)
        for i, v in enumerate(values)
    ]  # fmt: skip


ABOVE = Rule("above", "x > 0.5 for 10s", lambda ts, i: ts[i].preemption_risk > 0.5, 10.0)


def test_an_alert_fires_once_its_condition_held_for_the_whole_for_duration() -> None:
    # Evaluations every 5 s: true at 10, 15, 20, 25, then false at 30.
    series = ticks([0, 1, 1, 1, 1, 0, 0])
    assert episodes(series, ABOVE) == [(20.0, 30.0)]


def test_one_false_evaluation_resets_the_pending_alert() -> None:
    series = ticks([1, 1, 0, 1, 1, 0])
    assert episodes(series, ABOVE) == []


def test_an_alert_still_firing_at_the_end_lasts_until_the_last_evaluation() -> None:
    assert episodes(ticks([1, 1, 1, 1]), ABOVE) == [(15.0, 20.0)]


def test_lead_counts_from_the_episode_covering_the_event() -> None:
    assert lead([(100.0, 200.0)], 160.0) == 60.0


def test_lead_is_negative_when_the_alert_fires_only_after_the_event() -> None:
    assert lead([(10.0, 20.0), (170.0, 200.0)], 160.0) == -10.0


def test_the_shipped_rule_is_named_kv_headroom() -> None:
    assert RULES[0].name == "kv_headroom"


SHORT = """\
name: tiny-overload
expect: overload
duration: 6m
seed: 3
deployment: {model: meta-llama/Llama-3.1-8B-Instruct, gpu: L4, max_model_len: 8192}
phases:
  - {duration: 6m, rate: 0.5, rate_to: 2.0, prompt: {median: 900, sigma: 0.5, min: 32, max: 6000},
     generation: {median: 300, sigma: 0.6, min: 8, max: 1500}}
"""


def test_json_output_has_the_documented_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(SHORT)
    argv = ["--no-library", "--seeds", "1", "--jobs", "1", "--scenario", str(scenario)]
    assert main([*argv, "--output", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["rules"]) == {r.name for r in RULES}
    for row in out["rules"].values():
        assert {
            "recall",
            "median_lead_seconds",
            "worst_lead_seconds",
            "false_alarm_minutes",
        } <= set(row)
    assert [s["name"] for s in out["scenarios"]] == ["tiny-overload"]
    assert out["scenarios"][0]["first_preemption_seconds"] is not None


SAFE = """\
name: tiny-safe
expect: safe
duration: 3m
seed: 3
deployment: {model: meta-llama/Llama-3.1-8B-Instruct, gpu: H100-80GB, max_model_len: 8192}
phases:
  - {duration: 3m, rate: 0.2, prompt: {median: 300}, generation: {median: 50}}
"""


def test_a_benchmark_where_no_run_preempts_reports_recall_as_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = tmp_path / "safe.yaml"
    scenario.write_text(SAFE)
    args = ["--no-library", "--seeds", "1", "--jobs", "1", "--scenario", str(scenario)]
    assert main(args) == 0
    table = capsys.readouterr().out
    assert "n/a" in table
    assert main([*args, "--output", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rules"]["kv_headroom"]["recall"] is None
    assert out["rules"]["kv_headroom"]["safe_hours"] == 0.05


def run(
    name: str,
    ticks_: list[Tick],
    first: float | None,
    request_seconds: dict[str, float] | None = None,
    **extra: object,
) -> Replay:
    scenario = parse_scenario(SAFE.replace("tiny-safe", name), f"{name}.yaml")
    scenario = dataclasses.replace(scenario, **extra)  # type: ignore[arg-type]
    return Replay(scenario, ticks_, first, request_seconds or {})


def test_false_alarms_are_minutes_per_hour_of_runs_that_never_preempted() -> None:
    # 12 polls every 5 s = one minute; the risk is high for the last 40 s of it.
    quiet_then_high = ticks([0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1])
    result = evaluate([run("a", quiet_then_high, None, tags=("busy", "real-traffic"))])
    row = result["classes"]["busy"]["rules"]["kv_headroom"]
    firing_minutes = (60 - (25 + ALERT_FOR_SECONDS)) / 60
    assert row["false_alarm_minutes_per_safe_hour"] == round(firing_minutes * 60, 2)
    assert result["real_traffic"]["kv_headroom"]["safe_runs"] == 1


def test_near_miss_minutes_are_the_firing_within_the_horizon_after_a_poll_near_full() -> None:
    # Usage 0.96 at 10 s and again at 20 s: the horizon after them, once, is what counts.
    series = ticks([0.5, 0.96, 0.5, 0.96, 0.5])
    firing = [(5.0, 20.0 + HORIZON + 30.0)]
    assert near_miss_seconds(series, firing) == 20.0 + HORIZON - 10.0


def test_firing_away_from_any_near_miss_is_not_counted_as_one() -> None:
    series = ticks([0.5, 0.94, 0.5])
    assert near_miss_seconds(series, [(0.0, 100.0)]) == 0.0


def test_untagged_scenarios_are_the_synthetic_class() -> None:
    result = evaluate([run("a", ticks([0, 0]), None)])
    assert list(result["classes"]) == ["synthetic"]
    assert result["real_traffic"] == {}


def test_bottleneck_accuracy_is_na_until_the_sidecar_has_the_gauge() -> None:
    result = evaluate([run("a", ticks([0, 0, 0]), None)])
    assert result["bottleneck_accuracy"] is None
    main = "bottleneck gauge names the main reason requests waited on, every run"
    assert (main, None) in targets(result)


def test_bottleneck_accuracy_counts_polls_where_the_gauge_names_the_truth() -> None:
    polls = [
        dataclasses.replace(t, truth=truth, gauge=gauge)
        for t, truth, gauge in zip(
            ticks([0, 0, 0, 0]),
            ["none", "compute", "compute", "kv_cache"],
            ["none", "compute", "kv_cache", "kv_cache"],
            strict=True,
        )
    ]
    assert evaluate([run("a", polls, None)])["bottleneck_accuracy"] == 0.75


def test_a_run_is_right_when_the_gauge_named_the_reason_most_request_seconds_waited_on() -> None:
    # Polls every 5 s: 2 requests waiting on compute, then 10 on kv_cache (as the gauge
    # says); the simulator counts 30 request-seconds on compute and 90 on kv_cache.
    polls = [
        dataclasses.replace(t, waiting=waiting, gauge=gauge)
        for t, waiting, gauge in zip(
            ticks([0, 0, 0, 0]),
            [0, 2, 2, 10],
            ["none", "compute", "compute", "kv_cache"],
            strict=True,
        )
    ]
    waited = {"compute": 30.0, "kv_cache": 90.0, "none": 500.0}
    right = evaluate([run("a", polls, None, request_seconds=waited)])
    entry = right["scenarios"][0]["bottleneck"]
    assert entry["waited_share"] == {"compute": 0.25, "kv_cache": 0.75}
    assert entry["named_share"] == {"compute": 0.286, "kv_cache": 0.714}
    assert entry["names_main_reason"] is True
    assert right["bottleneck_main_reason"] == [1, 1]
    wrong = evaluate([run("a", polls, None, request_seconds={"compute": 100.0, "kv_cache": 1.0})])
    assert wrong["scenarios"][0]["bottleneck"]["names_main_reason"] is False


def test_a_resource_that_bound_longest_counting_the_steps_it_shared_is_the_main_reason() -> None:
    # compute alone 40, kv_cache alone 35, both at once 25 (labelled kv_cache: 60 vs 40).
    binding = {"compute": 40.0, "kv_cache": 35.0, "kv_cache+compute": 25.0}
    assert held_longest("compute", binding)  # 65 held, kv_cache without it 35
    assert held_longest("kv_cache", binding)  # 60 held, compute without it 40
    assert not held_longest("max_num_seqs", {**binding, "max_num_seqs": 10.0})


def test_a_resource_another_outlasted_without_it_is_not_the_main_reason() -> None:
    binding = {"compute": 30.0, "kv_cache": 50.0, "kv_cache+compute": 10.0}
    assert not held_longest("compute", binding)  # 40 held, kv_cache without it 50


def test_a_run_is_judged_on_what_bound_and_counted_apart_by_the_simulators_label() -> None:
    polls = [dataclasses.replace(t, waiting=4.0, gauge="compute") for t in ticks([0, 0, 0, 0])]
    waited = {"compute": 40.0, "kv_cache": 60.0}
    binding = {"compute": 40.0, "kv_cache": 35.0, "kv_cache+compute": 25.0}
    replay = dataclasses.replace(run("a", polls, None, request_seconds=waited),
                                 binding_seconds=binding)  # fmt: skip
    result = evaluate([replay])
    entry = result["scenarios"][0]["bottleneck"]
    assert entry["names_main_reason"] is True
    assert entry["names_main_reason_by_label"] is False
    assert entry["jointly_bound_share"] == 0.25
    assert result["bottleneck_main_reason"] == [1, 1]
    assert result["bottleneck_main_reason_by_label"] == [0, 1]


def test_a_stall_flagged_after_a_minute_fails_the_stall_check() -> None:
    late = [dataclasses.replace(t, gauge="stalled" if t.t >= 80 else "none")
            for t in ticks([0] * 20)]  # fmt: skip
    result = evaluate([run("a", late, None, stalls=((10.0, 90.0),))])
    assert result["stall_flagged_after_seconds"] == [70.0]
    assert ("every stall flagged as stalled within 60 s", False) in targets(result)


def test_a_run_where_nobody_waited_is_not_judged_on_the_main_reason() -> None:
    result = evaluate([run("a", ticks([0, 0]), None, request_seconds={"none": 10.0})])
    assert result["scenarios"][0]["bottleneck"]["names_main_reason"] is None
    assert result["bottleneck_main_reason"] == [0, 0]


def test_a_stall_is_timed_from_its_start_to_the_first_poll_saying_stalled() -> None:
    polls = [
        dataclasses.replace(t, gauge="stalled" if t.t >= 20 else "none") for t in ticks([0] * 6)
    ]
    entry = evaluate([run("a", polls, None, stalls=((12.0, 30.0),))])["scenarios"][0]
    assert entry["bottleneck"]["stall_flagged_after_seconds"] == [8.0]


def test_the_gauge_is_read_whatever_shape_it_takes() -> None:
    assert gauge_resource("compute") == "compute"
    assert gauge_resource({"kv_cache": 0.0, "stalled": 1.0}) == "stalled"
    assert gauge_resource(None) is None


def test_fast_mode_runs_a_library_scenario_on_one_seed_cut_to_ten_minutes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--fast", "--only", "scheduler-stall", "--jobs", "1", "--output", "json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    [entry] = out["scenarios"]
    assert entry["duration_seconds"] == 600.0
    assert entry["bottleneck"]["truth_share"]["stalled"] > 0


def test_plot_draws_the_real_traffic_scenarios_only(tmp_path: Path) -> None:
    real = run("real", ticks([0, 1]), None, tags=("busy", "real-traffic"))
    synthetic = run("synthetic", ticks([0, 1]), None)
    result = evaluate([real, synthetic])
    written = plot([real, synthetic], result, tmp_path)
    assert [p.name for p in written] == ["real.png"]
    assert (tmp_path / "real.png").stat().st_size > 0
