"""kv-cache-capacity.json: The capacity chain: GPU memory → ceiling → weights → overhead → KV
budget → tokens → sequences → users, expected beside observed."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dashboard_b
from grafana_foundation_sdk.models import common as common_m
from grafana_foundation_sdk.models import dashboard as dashboard_m
from grafana_foundation_sdk.models import prometheus as prometheus_m

from dashboards.lib.frame import frame
from dashboards.lib.panels import stat, table, timeseries
from dashboards.lib.queries import (
    INFO,
    RUNWAY_MODEL,
    Q,
    agg,
    expected_and_observed,
    ours,
    sel,
    with_model,
)


def _runway(name: str) -> str:
    """A capacity-runway record (rules/kv-headroom.rules.yml) for the selected models."""
    return f"{name}{{{RUNWAY_MODEL}}}"


# The trend the runway extrapolates, as a line over the panel's range: the weekday peak
# and growth of the range's end (`@ end()`), at the growth per week before and after it.
# Read from the last value in 31 days, so a range that reaches past now (now-8w to
# now+30d) draws it ahead to where it meets the capacity.
FORECAST = (
    f"last_over_time({_runway('model:kv_headroom_load:peak_now')}[31d] @ end())"
    " + clamp_min(last_over_time("
    f"{_runway('model:kv_headroom_load_growth:median3w_delta1w')}[31d] @ end()), 0)"
    " * (time() - max_over_time(timestamp("
    f"{_runway('model:kv_headroom_load:peak_now')})[31d:1h] @ end())) / 604800"
)
RUNWAY_TICKET_DAYS = 14  # VllmKvCacheRunwayShort
# The runway row's panels: they read weeks of history (docs/rules.md#capacity-runway), so a
# stack started minutes ago leaves them empty; tests/rules/test_runway_e2e.py runs them on
# backfilled weeks instead.
RUNWAY_PANELS = ("Weekday peak against capacity", "Runway (days)", "Replicas needed in 30 days")


def capacity() -> dashboard_m.Dashboard:
    per_model = (
        "sum by (model) ("
        + with_model(agg("sum", sel("kv_headroom_max_users", 'context="p95"')))
        + ")"
    )
    return (
        frame(
            "KV cache capacity",
            "kv-headroom-capacity",
            "How much KV cache each vLLM has and what it holds: GPU memory → ceiling → "
            "weights → overhead → KV budget → tokens → sequences → users, expected from the "
            "model and flags against what vLLM allocated.",
        )
        .with_row(dashboard_b.Row("Deployments"))
        .with_panel(
            table(
                "Deployments",
                "One row per sidecar: the model, attention kind, KV cache dtype, block size, "
                "tensor and pipeline parallel sizes and vLLM version it sees. A blank model "
                "or version means the sidecar could not read it: check its model.path and "
                "kv_headroom_source_up.",
                "short",
                [Q(INFO, "", instant=True, fmt=prometheus_m.PromQueryFormat.TABLE)],
                span=16,
            )
        )
        .with_panel(
            stat(
                "Concurrent users that fit per model (p95 context)",
                "Requests of today's p95 context that fit at once in the KV caches of all "
                "selected replicas of each model. When demand outgrows it, add replicas or "
                "memory (a larger GPU, more tensor parallelism, an fp8 KV cache).",
                "short",
                [Q(per_model, "{{model}}")],
                span=8,
                height=6,
            )
        )
        .with_row(dashboard_b.Row("Memory chain (per GPU)"))
        .with_panel(
            timeseries(
                "Memory chain per GPU",
                "Per GPU: the ceiling vLLM may use (total × gpu_memory_utilization), the "
                "weights, the activation/non-torch/CUDA-graph overhead, and the KV budget "
                "left for the cache, expected from the flags and observed from what vLLM "
                "allocated. Ceiling − weights − overhead ≈ KV budget. To grow the budget, "
                "raise gpu_memory_utilization, quantise weights or spread them wider (TP).",
                "bytes",
                [
                    Q(ours("max", "kv_headroom_memory_ceiling_bytes"), "{{target}} ceiling"),
                    Q(ours("max", "kv_headroom_weights_bytes"), "{{target}} weights"),
                    Q(ours("max", "kv_headroom_overhead_bytes"), "{{target}} overhead"),
                    *expected_and_observed("max", "kv_headroom_kv_budget_bytes", "KV budget "),
                ],
                span=16,
                height=9,
            )
        )
        .with_panel(
            timeseries(
                "KV bytes per token",
                "KV cache bytes one token of context costs on one GPU, all layers. It is set "
                "by the architecture (layers × KV heads × head size), the KV dtype and the "
                "tensor-parallel split; an fp8 KV cache halves it.",
                "bytes",
                [Q(ours("max", "kv_headroom_kv_bytes_per_token"))],
                span=8,
                height=9,
            )
        )
        .with_row(dashboard_b.Row("Capacity: expected vs observed"))
        .with_panel(
            timeseries(
                "KV capacity in tokens",
                "KV cache size in tokens as vLLM counts it (its 'KV cache size' line), "
                "summed over data-parallel engines: expected from model and flags, observed "
                "from vLLM. A gap means vLLM sized its cache differently than predicted; see "
                "budget drift.",
                "short",
                expected_and_observed("sum", "kv_headroom_kv_capacity_tokens"),
                span=8,
            )
        )
        .with_panel(
            timeseries(
                "KV capacity in blocks",
                "KV cache blocks (vLLM's num_gpu_blocks, one reserved), summed over "
                "data-parallel engines, expected vs observed.",
                "short",
                expected_and_observed("sum", "kv_headroom_kv_capacity_blocks"),
                span=8,
            )
        )
        .with_panel(
            timeseries(
                "Budget drift",
                "Observed ÷ expected KV blocks: 100 % means vLLM sized its cache as "
                "predicted. A step after a restart means a flag changed or the overhead "
                "grew (a new vLLM release, another process on the GPU): check the GPU "
                "memory dashboard and the deployed flags.",
                "percentunit",
                [Q(ours("max", "kv_headroom_budget_drift_ratio"))],
                span=8,
                min_val=None,
                thresholds=((None, "red"), (0.9, "green"), (1.1, "yellow")),
                threshold_style=common_m.GraphThresholdsStyleMode.DASHED,
            )
        )
        .with_row(dashboard_b.Row("What fits"))
        .with_panel(
            timeseries(
                "Sequences that fit, by context length",
                "Whole sequences the KV cache holds at once when each has the p50, p95 or "
                "p99 context of the requests that finished over the last window, or "
                "max_model_len (the worst case vLLM's own max concurrency reports).",
                "short",
                [
                    Q(
                        ours(
                            "sum",
                            "kv_headroom_max_sequences",
                            'context=~"p50|p95|p99|max_model_len"',
                            by=("context",),
                        ),
                        "{{target}} {{context}}",
                    )
                ],
                span=8,
            )
        )
        .with_panel(
            timeseries(
                "Concurrent users that fit",
                "Requests that fit at once at the p50, p95 and p99 context: sequences ÷ "
                "sequences per request (the n parameter). Compare with the concurrency your "
                "clients send; below it, requests queue or get preempted.",
                "short",
                [
                    Q(
                        ours(
                            "sum",
                            "kv_headroom_max_users",
                            'context=~"p50|p95|p99"',
                            by=("context",),
                        ),
                        "{{target}} {{context}}",
                    )
                ],
                span=8,
            )
        )
        .with_panel(
            timeseries(
                "max_num_seqs overcommit",
                "max_num_seqs ÷ the sequences that fit at the p95 context. Above 1 (the "
                "line) vLLM admits more sequences than its cache holds once they grow, and "
                "will preempt under full load: lower --max-num-seqs towards the "
                "recommendation, or add KV memory.",
                "short",
                [Q(ours("max", "kv_headroom_config_overcommit_ratio"))],
                span=8,
                thresholds=((None, "green"), (1, "red")),
                threshold_style=common_m.GraphThresholdsStyleMode.LINE,
            )
        )
        .with_panel(
            stat(
                "Recommended max_num_seqs",
                "The most sequences that fit at today's p95 context: set --max-num-seqs to "
                "this (per engine) to stop preemptions at the price of queueing, or keep "
                "a higher value and watch the preemption risk.",
                "short",
                [Q(ours("max", "kv_headroom_recommended_max_num_seqs"))],
                span=24,
                height=5,
                decimals=0,
            )
        )
        .with_row(dashboard_b.Row("Capacity runway (weeks ahead)"))
        .with_panel(
            timeseries(
                RUNWAY_PANELS[0],
                "Per model, over the last 8 weeks: the daily peak (the busiest hour of "
                "each day) and the weekly peak, in pods' worth of traffic, against the "
                "capacity the runway is measured against (the declared ceiling, else the "
                "pods running now). The forecast is the weekday-peak trend the runway "
                "extrapolates; set the range past now (now-8w to now+30d) to draw it ahead "
                "to where it meets the capacity. The method needs five weeks of history "
                "(docs/rules.md, capacity-runway).",
                "short",
                [
                    Q(_runway("model:kv_headroom_load:max1d"), "{{model}} daily peak"),
                    Q(_runway("model:kv_headroom_load:max1w"), "{{model}} weekly peak"),
                    Q(_runway("model:kv_headroom_pods:capacity"), "{{model}} capacity"),
                    Q(FORECAST, "{{model}} forecast"),
                ],
                span=14,
                height=9,
            ).time_from("8w")
        )
        .with_panel(
            stat(
                RUNWAY_PANELS[1],
                "Days until each model's weekday peak reaches its capacity at the growth "
                "of the last three weeks; VllmKvCacheRunwayShort opens a ticket under 14. "
                "No value: the peak is not growing (flat, falling, a one-off step), or "
                "there are under five weeks of history. What to do: rules/RUNBOOK.md.",
                "d",
                [Q(_runway("model:kv_headroom_runway_days"), "{{model}}")],
                span=5,
                height=9,
                thresholds=((None, "red"), (RUNWAY_TICKET_DAYS, "yellow"), (30, "green")),
                decimals=0,
            )
        )
        .with_panel(
            stat(
                RUNWAY_PANELS[2],
                "The replicas each model's weekday peak will need 30 days from now at its "
                "growth, at the same 1.5 target headroom as the replicas needed now (the "
                "second figure), which is for today's traffic.",
                "short",
                [
                    Q(
                        _runway("model:kv_headroom_replicas_needed_in_30d:ceil"),
                        "{{model}} in 30 d",
                    ),
                    Q(_runway("model:kv_headroom_replicas_needed:ceil"), "{{model}} now"),
                ],
                span=5,
                height=9,
                decimals=0,
            )
        )
        .build()
    )
