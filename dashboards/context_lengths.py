"""context-lengths.json: The live context-length distribution the ceilings are computed for."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dashboard_b
from grafana_foundation_sdk.models import dashboard as dashboard_m

from dashboards.lib.frame import frame
from dashboards.lib.panels import heatmap, timeseries
from dashboards.lib.queries import (
    Q,
    ours,
)


def context_lengths() -> dashboard_m.Dashboard:
    return (
        frame(
            "Context lengths",
            "kv-headroom-context",
            "How long requests are — prompt, generation and both — since every capacity "
            "figure depends on it, and how much prefix caching and n > 1 change it.",
        )
        .with_row(dashboard_b.Row("Distributions"))
        .with_panel(
            heatmap(
                "Prompt length distribution",
                "Finished requests per second in each prompt-length bucket, from vLLM's "
                "request_prompt_tokens histogram. A band moving up means longer prompts: "
                "fewer sequences fit.",
                "vllm:request_prompt_tokens_bucket",
            )
        )
        .with_panel(
            heatmap(
                "Generation length distribution",
                "Finished requests per second in each generated-length bucket, from vLLM's "
                "request_generation_tokens histogram. Long generations grow the KV cache "
                "after admission, which is what preempts.",
                "vllm:request_generation_tokens_bucket",
            )
        )
        .with_row(dashboard_b.Row("Percentiles over the window"))
        .with_panel(
            timeseries(
                "Context length (prompt + generation) percentiles",
                "p50, p95 and p99 of prompt + generation tokens of the requests that "
                "finished over the sidecar's window (10 min by default). The capacity "
                "figures use these; a rising p95 shrinks what fits.",
                "short",
                [
                    Q(
                        ours(
                            "max",
                            "kv_headroom_context_tokens",
                            'percentile=~"p50|p95|p99"',
                            by=("percentile",),
                        ),
                        "{{target}} {{percentile}}",
                    ),
                    Q(ours("max", "kv_headroom_context_mean_tokens"), "{{target}} mean"),
                ],
                span=12,
            )
        )
        .with_panel(
            timeseries(
                "Prompt and generation p95",
                "p95 of prompt tokens and of generated tokens over the window. Which of the "
                "two moved tells whether inputs (RAG, chat history) or outputs (max_tokens) "
                "changed.",
                "short",
                [
                    Q(
                        ours("max", "kv_headroom_prompt_tokens", 'percentile="p95"'),
                        "{{target}} prompt p95",
                    ),
                    Q(
                        ours("max", "kv_headroom_generation_tokens", 'percentile="p95"'),
                        "{{target}} generation p95",
                    ),
                ],
                span=12,
            )
        )
        .with_row(dashboard_b.Row("What changes the footprint"))
        .with_panel(
            timeseries(
                "Sequences per request",
                "Mean n (parallel samples) per request over the window: each sequence holds "
                "its own KV cache, so users that fit = sequences that fit ÷ this.",
                "short",
                [Q(ours("max", "kv_headroom_sequences_per_request"))],
                span=6,
            )
        )
        .with_panel(
            timeseries(
                "Prefix cache hit ratio",
                "Share of prompt tokens served from vLLM's prefix cache over the window. "
                "Hits skip prefill; shared prefixes also share KV blocks between running "
                "requests. Zero with prompts that share a prefix: check "
                "--enable-prefix-caching and whether the shared part spans a whole block.",
                "percentunit",
                [Q(ours("avg", "kv_headroom_prefix_cache_hit_ratio"))],
                span=6,
                max_val=1,
            )
        )
        .with_panel(
            timeseries(
                "Extra sequences from prefix sharing",
                "How many more p95 sequences fit when the cached share of each prompt is "
                "shared rather than stored per request.",
                "short",
                [Q(ours("sum", "kv_headroom_prefix_cache_extra_sequences"))],
                span=6,
            )
        )
        .with_panel(
            timeseries(
                "Requests in the window",
                "Finished requests the percentiles are computed from. With only a handful, "
                "the percentiles (and every capacity figure at p95) are rough.",
                "short",
                [Q(ours("max", "kv_headroom_context_requests"))],
                span=6,
            )
        )
        .build()
    )
