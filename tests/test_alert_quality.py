"""benchmarks/alert_quality.py: Prometheus's for: semantics, lead times, and its JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.alert_quality import RULES, Rule, episodes, lead, main
from exporter.simulator.replay import Tick


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
    assert (
        main(["--no-library", "--seeds", "1", "--scenario", str(scenario), "--output", "json"]) == 0
    )
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
