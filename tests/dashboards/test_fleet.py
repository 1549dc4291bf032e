"""The fleet overview's figures, evaluated by Prometheus's engine: the same replicas the
recording rule gives (rules/tests/traffic.test.yml has the same pods)."""

from __future__ import annotations

from pathlib import Path

from tests.dashboards.test_queries_on_promtool import evaluate, info, query

POD_A = 'job="kv-headroom", instance="pod-a:9847"'
POD_B = 'job="kv-headroom", instance="pod-b:9847"'
RATIO = "kv_headroom_load_headroom_ratio"


def fleet() -> dict[str, str]:
    return {
        info(POD_A, "m"): "1x20",
        info(POD_B, "m"): "1x20",
        f'{RATIO}{{{POD_A}, engine="0"}}': "2x20",
        f'{RATIO}{{{POD_A}, engine="1"}}': "4x20",
        f'{RATIO}{{{POD_B}, engine="0"}}': "0.8x20",
    }


def test_replicas_needed_match_the_recording_rule(tmp_path: Path) -> None:
    # 0.375 + 1.25 pods' worth of traffic × 1.5, rounded up: 3, as the rule's test says.
    expr = query("Replicas needed vs pods", "{{model}} needed")
    evaluate(tmp_path, fleet(), expr, [{"labels": '{model="m"}', "value": 3}])


def test_the_fleet_headroom_is_the_tightest_pod(tmp_path: Path) -> None:
    evaluate(tmp_path, fleet(), query("Fleet load headroom"), [{"labels": "{}", "value": 0.8}])
