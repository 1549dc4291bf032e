"""The simulated engine's ``/metrics``, as vLLM 0.32 writes it: names, help texts, labels,
buckets and ``cache_config_info`` labels of a real 0.32 page (the fixture
``vllm-0.32-cpu-preempted.txt``), a subset of its families and nothing it lacks."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.utils import floatToGoString

from exporter.simulator.engine import Engine, Hist

# (name, type, help) in the order vLLM 0.32 registers them.
_COUNTERS = (
    ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", "preemptions"),
    ("vllm:prompt_tokens", "Number of prefill tokens processed.", "prompt_tokens"),
    ("vllm:generation_tokens", "Number of generation tokens processed.", "generation_tokens"),
)
_HISTOGRAMS = (
    ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", "prompt_len"),
    ("vllm:request_generation_tokens", "Number of generation tokens processed.", "generation_len"),
    ("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", "iteration_tokens"),
    ("vllm:request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens.", "max_generation"),
    ("vllm:request_params_n", "Histogram of the n request parameter.", "n_param"),
    ("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", "max_tokens_param"),
    ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", "ttft"),
    ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", "itl"),
    ("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.", "tpot"),
    ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", "e2e"),
    ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", "queue"),
    ("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", "inference"),
    ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", "prefill"),
    ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", "decode"),
    ("vllm:request_num_preemptions", "Histogram of the number of times a request was preempted.", "request_preemptions"),
    ("vllm:request_prefill_kv_computed_tokens", "Histogram of new KV tokens computed during prefill (excluding cached tokens).", "prefill_kv_computed"),
)  # fmt: skip
_WAITING_HELP = (
    "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
    "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV "
    "transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting."
)

# cache_config_info labels of 0.32 that do not depend on the deployment.
CACHE_CONFIG_FIXED = {
    "_block_size_resolved": "True",
    "cache_hit_alignment_tokens": "None",
    "enable_mamba_shared_prefix_checkpoint": "False",
    "hash_block_size": "None",
    "is_attention_free": "False",
    "kv_cache_dtype_skip_layers": "[]",
    "kv_cache_layout": "None",
    "kv_offloading_backend": "native",
    "kv_offloading_size": "None",
    "kv_sharing_fast_prefill": "False",
    "mamba_block_size": "None",
    "mamba_cache_dtype": "auto",
    "mamba_cache_mode": "none",
    "mamba_page_size_padded": "None",
    "mamba_ssm_cache_dtype": "auto",
    "num_cpu_blocks": "None",
    "prefix_cache_retention_interval": "0",
    "prefix_caching_hash_algo": "sha256",
    "prefix_match_unit": "None",
    "replayssm_buffer_len": "16",
    "skip_page_size_padded": "None",
    "sliding_window": "None",
    "swa_bounded_replay": "True",
    "use_kda_recoverssm": "False",
    "use_replayssm": "False",
    "user_specified_block_size": "False",
}


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(value: float) -> str:
    return str(floatToGoString(value))  # type: ignore[no-untyped-call]


def cache_config_labels(
    engine: Engine,
    *,
    cache_dtype: str,
    gpu_memory_utilization: float,
    kv_cache_memory_bytes: int | None,
    num_gpu_blocks_override: int | None,
    kv_cache_size_tokens: int,
    kv_cache_max_concurrency: float,
) -> dict[str, str]:
    cfg = engine.config
    labels = dict(CACHE_CONFIG_FIXED)
    labels.update(
        block_size=str(cfg.block_size),
        cache_dtype=cache_dtype,
        effective_attention_block_size=str(cfg.block_size),
        enable_prefix_caching=str(cfg.enable_prefix_caching),
        gpu_memory_utilization=str(gpu_memory_utilization),
        kv_cache_max_concurrency=str(kv_cache_max_concurrency),
        kv_cache_memory_bytes=str(kv_cache_memory_bytes),
        kv_cache_size_tokens=str(kv_cache_size_tokens),
        num_gpu_blocks=str(cfg.num_blocks),
        num_gpu_blocks_override=str(num_gpu_blocks_override),
    )
    return labels


def render_page(
    engine: Engine,
    *,
    model_name: str,
    cache_config: Mapping[str, str],
    start_time: float,
    engine_index: str = "0",
) -> str:
    """The page vLLM 0.32 would serve for this engine now."""
    s = engine.stats
    base = f'engine="{engine_index}",model_name="{_esc(model_name)}"'
    out: list[str] = [
        "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.",
        "# TYPE process_start_time_seconds gauge",
        f"process_start_time_seconds {_num(start_time)}",
    ]

    def gauge(name: str, help_text: str, rows: list[tuple[str, float]]) -> None:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} gauge")
        out.extend(f"{name}{{{labels}}} {_num(v)}" for labels, v in rows)

    waiting = float(len(engine.waiting))
    gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
          [(base, float(len(engine.running)))])  # fmt: skip
    gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
          [(base, waiting)])  # fmt: skip
    gauge(
        "vllm:num_requests_waiting_by_reason",
        _WAITING_HELP,
        [(f'{base},reason="capacity"', waiting), (f'{base},reason="deferred"', 0.0)],
    )
    gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
          [(base, engine.usage)])  # fmt: skip
    counters = [
        ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", s.prefix_queries),
        ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", s.prefix_hits),
        *((name, help_text, getattr(s, attr)) for name, help_text, attr in _COUNTERS),
    ]  # fmt: skip
    for name, help_text, value in counters:
        out.append(f"# HELP {name}_total {help_text}")
        out.append(f"# TYPE {name}_total counter")
        out.append(f"{name}_total{{{base}}} {_num(value)}")
        out.append(f"# HELP {name}_created {help_text}")
        out.append(f"# TYPE {name}_created gauge")
        out.append(f"{name}_created{{{base}}} {_num(start_time)}")
    out.append("# HELP vllm:prompt_tokens_by_source_total Number of prompt tokens by source.")
    out.append("# TYPE vllm:prompt_tokens_by_source_total counter")
    for source, value in (
        ("local_compute", s.prompt_local_compute),
        ("local_cache_hit", s.prompt_cache_hit),
        ("external_kv_transfer", 0.0),
    ):
        out.append(f'vllm:prompt_tokens_by_source_total{{{base},source="{source}"}} {_num(value)}')
    out.append("# HELP vllm:request_success_total Count of successfully processed requests.")
    out.append("# TYPE vllm:request_success_total counter")
    for reason in ("stop", "length", "abort", "error", "repetition"):
        value = s.finished if reason == "length" else 0.0  # every request runs to max_tokens
        out.append(
            f'vllm:request_success_total{{engine="{engine_index}",finished_reason="{reason}",'
            f'model_name="{_esc(model_name)}"}} {_num(value)}'
        )
    for name, help_text, attr in _HISTOGRAMS:
        h: Hist = getattr(s, attr)
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} histogram")
        cumulative = h.cumulative()
        for bound, count in zip((*h.bounds, float("inf")), cumulative, strict=True):
            le = "+Inf" if bound == float("inf") else _num(bound)
            out.append(
                f'{name}_bucket{{engine="{engine_index}",le="{le}",model_name="{_esc(model_name)}"}} {_num(count)}'
            )
        out.append(f"{name}_count{{{base}}} {_num(h.count)}")
        out.append(f"{name}_sum{{{base}}} {_num(h.sum)}")
    out.append("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig")
    out.append("# TYPE vllm:cache_config_info gauge")
    labels = {**cache_config, "engine": engine_index}
    pairs = ",".join(f'{k}="{_esc(v)}"' for k, v in sorted(labels.items()))
    out.append(f"vllm:cache_config_info{{{pairs}}} 1.0")
    return "\n".join(out) + "\n"
