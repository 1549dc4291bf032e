"""The sidecar, Prometheus and the alerts on real vLLM 0.32 (CPU), per architecture.

Every figure is compared with what vLLM itself reports or with what the workload sent,
never with fixed counts: scheduling jitter moves when things happen, not what they are.
"""

from __future__ import annotations

import json
import math
import re

import pytest

from exporter.risk.model import WARNING_FOR_SECONDS, WARNING_THRESHOLD
from tests.e2e.gauges import timeline, value
from tests.e2e.stack import (
    AFTER_PREEMPTION_S,
    ARCHITECTURES,
    LIKELY,
    PREEMPTING,
    PROBE,
    ArchRun,
    StackRun,
    alert_fired_at,
    held_at,
)

pytestmark = pytest.mark.vllm
ARCHS = [a.name for a in ARCHITECTURES]
# vLLM's token-length histograms bound their buckets 1-2-5 up to max_model_len (2,048).
BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, math.inf)


@pytest.fixture(params=ARCHS)
def arch(request: pytest.FixtureRequest, stack: StackRun) -> ArchRun:
    return stack.archs[request.param]


def cache_config(vllm_text: str) -> dict[str, str]:
    line = next(ln for ln in vllm_text.splitlines() if ln.startswith("vllm:cache_config_info{"))
    return dict(re.findall(r'(\w+)="([^"]*)"', line))


def bytes_per_token(config: dict[str, int]) -> int:
    """KV bytes per token from the config alone (bf16, TP 1): the arithmetic of the two
    attention kinds, independently of exporter/capacity."""
    layers = config["num_hidden_layers"]
    if "kv_lora_rank" in config:  # MLA: one latent vector + the rope key per layer
        return layers * (config["kv_lora_rank"] + config["qk_rope_head_dim"]) * 2
    return layers * 2 * config["num_key_value_heads"] * config["head_dim"] * 2


def test_observed_capacity_is_what_vllm_reports(arch: ArchRun) -> None:
    info = cache_config(arch.vllm_text)
    text = arch.sidecar_text
    assert value(text, "kv_headroom_kv_capacity_blocks", source="observed", engine="0") == int(
        info["num_gpu_blocks"]
    )
    assert value(text, "kv_headroom_kv_capacity_tokens", source="observed", engine="0") == int(
        info["kv_cache_size_tokens"]
    )
    assert int(info["kv_cache_size_tokens"]) == int(info["num_gpu_blocks"]) * int(
        info["block_size"]
    )


def test_expected_capacity_from_config_and_flags_equals_observed(arch: ArchRun) -> None:
    text = arch.sidecar_text
    for name in ("kv_headroom_kv_capacity_blocks", "kv_headroom_kv_capacity_tokens"):
        expected = value(text, name, source="expected", engine="0")
        assert expected is not None, name
        assert expected == value(text, name, source="observed", engine="0"), name
    assert value(text, "kv_headroom_budget_drift_ratio", engine="0") == 1.0


def test_bytes_per_token_follow_the_attention_kind(arch: ArchRun) -> None:
    config = json.loads(arch.arch.config.read_text())
    assert value(arch.sidecar_text, "kv_headroom_kv_bytes_per_token") == bytes_per_token(config)


def test_tokens_per_running_sequence_match_the_streamed_request_within_a_block(
    arch: ArchRun,
) -> None:
    block = int(cache_config(arch.vllm_text)["block_size"])
    assert arch.probe, "no reading while exactly one request ran"
    for per_seq, before, after in arch.probe:
        # The sequence held its prompt and what it had generated, in whole blocks; the
        # sidecar's poll saw vLLM between the two stream positions (stack._probe_once).
        low = math.ceil((PROBE.prompt_tokens + max(0, before - 1)) / block) * block
        high = math.ceil((PROBE.prompt_tokens + after + 1) / block) * block
        assert low - 1e-6 <= per_seq <= high + 1e-6, (per_seq, before, after, block)
        assert abs(per_seq / block - round(per_seq / block)) < 1e-6, (per_seq, block)


def bucket(tokens: float) -> int:
    return next(i for i, bound in enumerate(BUCKETS) if tokens <= bound)


def test_context_quantiles_match_the_workload_within_one_bucket(arch: ArchRun) -> None:
    contexts = sorted(
        [p + c for _, p, c in arch.context_completions]
        + [PROBE.prompt_tokens + PROBE.max_tokens] * arch.probes_streamed
    )
    assert len(contexts) >= 10
    for label, q in (("p50", 0.50), ("p95", 0.95), ("p99", 0.99)):
        truth = contexts[min(len(contexts) - 1, math.ceil(q * len(contexts)) - 1)]
        seen = value(arch.context_text, "kv_headroom_context_tokens", percentile=label, engine="0")
        assert seen is not None, label
        assert abs(bucket(seen) - bucket(truth)) <= 1, (label, seen, truth)


def test_the_risk_stays_below_the_threshold_while_the_load_is_safe(arch: ArchRun) -> None:
    safe = arch.started + arch.safe
    said = "sidecar's gauges, seconds into the run:\n" + timeline(arch.readings, arch.started, safe)
    assert arch.safe_risk
    assert max(arch.safe_risk) < WARNING_THRESHOLD, said
    # nor does the page or the warning (threshold held for its for:) fire while safe
    calm = [r for r in arch.risk if r[0] <= safe]
    assert alert_fired_at(calm) is None, said
    assert alert_fired_at(calm, warning=True) is None, said


# Neither alert is asserted before the first preemption: by the frontier's own measure the
# page warns 57-76 % of drawn overloads before their first one and the warning 76-86 %
# (docs/risk-model.md), so on one steep ramp each is a coin toss, weighted. Stop 54 measured
# it here: with the trend in place, the warning came before the first preemption on 9 of 10
# ramps and 4 s after it on the tenth, where the score had held above 0.99 for 35 s and the
# cache jumped from 0.70 to 0.89 in one poll. Both leads are measured and printed (stack
# summary). What must come first is what the model knows: the score, above the warning's
# threshold for the warning's for:, before vLLM counts its first preemption.
def test_the_score_holds_above_the_warning_threshold_before_vllm_counts_its_first_preemption(
    arch: ArchRun,
) -> None:
    preempted = arch.first_preemption
    assert preempted is not None, "the workload never made vLLM preempt"
    said = "sidecar's gauges, seconds into the run:\n" + timeline(
        arch.readings, arch.started, preempted + AFTER_PREEMPTION_S, last=120.0
    )
    above = held_at(arch.risk, lambda g: g[1] > WARNING_THRESHOLD, WARNING_FOR_SECONDS)
    assert above is not None, f"the score never held above the warning's threshold\n{said}"
    assert above < preempted, said


def test_the_warning_fires_before_the_page(arch: ArchRun) -> None:
    warned, fired = alert_fired_at(arch.risk, warning=True), alert_fired_at(arch.risk)
    assert warned is not None, f"risk never held above the warning: {arch.risk[-40:]}"
    assert fired is None or warned <= fired


def test_the_load_headroom_falls_below_one_before_vllm_counts_its_first_preemption(
    arch: ArchRun,
) -> None:
    preempted = arch.first_preemption
    assert preempted is not None, "the workload never made vLLM preempt"
    said = "sidecar's gauges, seconds into the run:\n" + timeline(
        arch.readings, arch.started, preempted
    )
    below = [r.t for r in arch.readings if r.load_headroom is not None and r.load_headroom < 1]
    assert below, said
    assert below[0] < preempted, said


# Prometheus evaluates the rules as written (rules/), on the sidecar's series scraped each
# second, every 5 s: its warning comes when the sidecar's own series has it, give or take an
# evaluation, a poll and a scrape: 0.4-4.6 s later on four ramps here (up to 15.4 s while
# the group was evaluated every 15 s).
PROMETHEUS_LAG_S = 10.0


def test_prometheus_fires_likely_when_the_sidecars_own_series_does(
    stack: StackRun, arch: ArchRun
) -> None:
    likely, warned = stack.first(LIKELY, arch), alert_fired_at(arch.risk, warning=True)
    assert warned is not None, f"the warning's condition never held: {arch.risk[-40:]}"
    said = f"{stack.alerts}\nsidecar's gauges, seconds into the run:\n" + timeline(
        arch.readings, arch.started, warned + PROMETHEUS_LAG_S, last=120.0
    )
    assert likely is not None, said
    assert abs(likely - warned) <= PROMETHEUS_LAG_S, (likely - warned, said)


def test_prometheus_fires_preempting_once_vllm_counts_a_preemption(
    stack: StackRun, arch: ArchRun
) -> None:
    preempting = stack.first(PREEMPTING, arch)
    assert preempting is not None, stack.alerts
    assert arch.first_preemption is not None
    assert preempting >= arch.first_preemption - PROMETHEUS_LAG_S, stack.alerts


def test_both_alerts_resolve_after_the_load_stops(stack: StackRun) -> None:
    assert stack.quiet_at is not None, f"still firing: {stack.alerts}"
    assert stack.quiet_at > stack.load_stopped
