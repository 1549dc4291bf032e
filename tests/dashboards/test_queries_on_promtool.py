"""Dashboard queries evaluated by Prometheus's engine (``promtool test rules``) on small
synthetic series: the scoping, joining and clamping work as the panels assume."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

from dashboards import generate
from tests.dashboards.test_metric_lint import promtool

STATIC = 'job="kv-headroom", instance="10.0.0.1:9847"'
K8S = 'job="vllm/kv-headroom", instance="10.0.0.2:9847", namespace="llm", pod="vllm-0"'


def query(panel: str, legend: str = "{{target}}") -> str:
    """The one query of that panel (of a multi-query panel: the one with that legend)."""
    boards = [json.loads(t) for t in generate.rendered().values()]
    found: list[str] = [
        t["expr"]
        for b in boards
        for p in generate.panels(b)
        if p["title"] == panel
        for t in p.get("targets", [])
        if t["legendFormat"] == legend or len(p["targets"]) == 1
    ]
    assert len(found) == 1, (panel, legend)
    return found[0]


def evaluate(
    tmp_path: Path,
    series: dict[str, str],
    expr: str,
    expected: list[dict[str, Any]],
    **variables: str,
) -> None:
    test = {
        "rule_files": [],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": [{"series": s, "values": v} for s, v in series.items()],
                "promql_expr_test": [
                    {
                        "expr": generate.runnable(expr, variables),
                        "eval_time": "2m",
                        "exp_samples": expected,
                    }
                ],
            }
        ],
    }
    path = tmp_path / "test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    done = subprocess.run(
        [promtool(), "test", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def info(target: str, model: str) -> str:
    return f'kv_headroom_info{{{target}, model="{model}", vllm_version="0.32.0"}}'


def test_a_static_target_is_named_by_its_instance(tmp_path: Path) -> None:
    evaluate(
        tmp_path,
        {
            f'kv_headroom_preemption_risk{{{STATIC}, engine="0"}}': "0.25x10",
            info(STATIC, "llama"): "1x10",
        },
        query("Preemption risk"),
        [{"labels": f'{{{STATIC}, model="llama", target="10.0.0.1:9847"}}', "value": 0.25}],
    )


def test_a_kubernetes_target_is_named_by_its_pod(tmp_path: Path) -> None:
    evaluate(
        tmp_path,
        {
            f'kv_headroom_preemption_risk{{{K8S}, engine="0"}}': "0.75x10",
            info(K8S, "llama"): "1x10",
        },
        query("Preemption risk"),
        [{"labels": f'{{{K8S}, model="llama", target="vllm-0"}}', "value": 0.75}],
    )


def test_the_model_variable_keeps_only_that_models_targets(tmp_path: Path) -> None:
    evaluate(
        tmp_path,
        {
            f'kv_headroom_kv_free_tokens{{{STATIC}, engine="0"}}': "100x10",
            info(STATIC, "llama"): "1x10",
            f'kv_headroom_kv_free_tokens{{{K8S}, engine="0"}}': "200x10",
            info(K8S, "qwen"): "1x10",
        },
        query("Free KV room", "{{target}} free tokens"),
        [{"labels": f'{{{K8S}, model="qwen", target="vllm-0"}}', "value": 200}],
        model="qwen",
    )


def test_data_parallel_engines_add_up_to_one_series_per_target(tmp_path: Path) -> None:
    evaluate(
        tmp_path,
        {
            f'kv_headroom_kv_free_tokens{{{STATIC}, engine="0"}}': "100x10",
            f'kv_headroom_kv_free_tokens{{{STATIC}, engine="1"}}': "50x10",
            info(STATIC, "llama"): "1x10",
        },
        query("Free KV room", "{{target}} free tokens"),
        [{"labels": f'{{{STATIC}, model="llama", target="10.0.0.1:9847"}}', "value": 150}],
    )


def test_time_to_exhaustion_clamps_infinity_to_an_hour(tmp_path: Path) -> None:
    evaluate(
        tmp_path,
        {
            f'kv_headroom_seconds_to_exhaustion{{{STATIC}, engine="0"}}': " ".join(["Inf"] * 10),
            info(STATIC, "llama"): "1x10",
        },
        query("Time to KV exhaustion"),
        [
            {
                "labels": f'{{{STATIC}, model="llama", target="10.0.0.1:9847"}}',
                "value": generate.EXHAUSTION_CLAMP_SECONDS,
            }
        ],
    )


def test_forecast_usage_takes_the_worst_engine_and_shows_an_overflow_above_1(
    tmp_path: Path,
) -> None:
    evaluate(
        tmp_path,
        {
            f'kv_headroom_forecast_usage_ratio{{{STATIC}, engine="0"}}': "0.4x10",
            f'kv_headroom_forecast_usage_ratio{{{STATIC}, engine="1"}}': "1.25x10",
            info(STATIC, "llama"): "1x10",
        },
        query("Forecast KV usage"),
        [{"labels": f'{{{STATIC}, model="llama", target="10.0.0.1:9847"}}', "value": 1.25}],
    )


def test_vllm_served_from_a_path_matches_the_model_directory_name(tmp_path: Path) -> None:
    vllm_target = 'job="vllm", instance="10.0.0.1:8000"'
    evaluate(
        tmp_path,
        {
            f'vllm:num_requests_running{{{vllm_target}, engine="0", '
            f'model_name="/models/llama"}}': "3x10",
            f'vllm:num_requests_running{{{vllm_target}, engine="0", '
            f'model_name="/models/not-llama"}}': "5x10",
        },
        query("Requests per second vs running", "{{target}} running"),
        [{"labels": f'{{{vllm_target}, target="10.0.0.1:8000"}}', "value": 3}],
        model="llama",
    )
