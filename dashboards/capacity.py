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
    Q,
    agg,
    expected_and_observed,
    ours,
    sel,
    with_model,
)


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
        .build()
    )
