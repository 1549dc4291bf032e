"""Every metric the sidecar exports — name, type, help, labels — and the collector that
renders one snapshot. The README's metric table is checked against ``METRICS``.

All names carry the ``kv_headroom_`` prefix and base units; no target labels (pod and
namespace come from service discovery). Values are computed by the poll loop; a scrape
renders the latest snapshot and does no I/O.
"""

from __future__ import annotations

import math
import platform
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import cast

from prometheus_client.utils import floatToGoString as _untyped_go_float

from exporter import __version__
from exporter.labels import (
    MAX_CACHE_CONFIG_LABELS,
    MAX_ENGINES,
    MAX_GPUS,
    MAX_LABEL_VALUE_LENGTH,
    cut_label,
    escape_label,
)
from exporter.risk.bottleneck import RESOURCES
from exporter.risk.headroom import RESOURCES as HEADROOM_RESOURCES
from exporter.risk.model import (
    ALERT_THRESHOLD,
    ALERT_USAGE,
    ALERT_USAGE_WINDOW_SECONDS,
    EDGE_FOR_SECONDS,
    EDGE_THRESHOLD,
    WARNING_CERTAIN,
    WARNING_THRESHOLD,
    WARNING_USAGE,
    WARNING_USAGE_WINDOW_SECONDS,
)
from exporter.settings import show_duration
from exporter.snapshot import EngineView, Snapshot

PREFIX = "kv_headroom_"
# Values are written exactly as prometheus_client writes them (Go's float format).
floatToGoString = cast(Callable[[float], str], _untyped_go_float)


@dataclass(frozen=True)
class Spec:
    name: str  # without the prefix
    kind: str  # gauge | counter
    labels: tuple[str, ...]
    help: str
    unit: str  # for the README: bytes, tokens, ratio, seconds, sequences, count, info
    source: str  # where the value comes from, for the README

    @property
    def full(self) -> str:
        return PREFIX + self.name


_E = ("engine",)

# The alerts' usage gates, named by their windows as PromQL writes a duration (1m, 30s;
# rules/kv-headroom.rules.yml reads them).
USAGE_PEAK_PAGE = f"kv_usage_max_{show_duration(ALERT_USAGE_WINDOW_SECONDS)}_ratio"
USAGE_PEAK_WARNING = f"kv_usage_max_{show_duration(WARNING_USAGE_WINDOW_SECONDS)}_ratio"
METRICS: tuple[Spec, ...] = (
    # capacity
    Spec("kv_bytes_per_token", "gauge", (), "KV cache bytes one token of context costs on one GPU (all its layers).", "bytes", "config (or implied: kv_cache_memory_bytes ÷ tokens)"),
    Spec("memory_ceiling_bytes", "gauge", (), "Per-GPU memory vLLM may use: ceil(CUDA total × gpu_memory_utilization).", "bytes", "expected"),
    Spec("weights_bytes", "gauge", (), "Model weights loaded on one GPU (tightest stage).", "bytes", "model dir / estimate"),
    Spec("overhead_bytes", "gauge", (), "Activation peak + non-torch + CUDA-graph memory vLLM subtracts before the KV cache (model).", "bytes", "expected"),
    Spec("kv_budget_bytes", "gauge", ("engine", "source"), "KV cache memory per GPU: expected from flags and model, observed from what vLLM allocated.", "bytes", "expected / vLLM"),
    Spec("kv_capacity_tokens", "gauge", ("engine", "source"), "KV cache size in tokens as vLLM counts them (its 'KV cache size' figure).", "tokens", "expected / vLLM"),
    Spec("kv_capacity_blocks", "gauge", ("engine", "source"), "KV cache blocks (vLLM num_gpu_blocks; one is reserved).", "blocks", "expected / vLLM"),
    Spec("budget_drift_ratio", "gauge", _E, "Observed ÷ expected KV blocks; 1 means vLLM sized its cache as predicted.", "ratio", "derived"),
    Spec("max_sequences", "gauge", ("engine", "context"), "Whole sequences of the given context the KV cache holds at once.", "sequences", "derived"),
    # load
    Spec("kv_usage_ratio", "gauge", _E, "KV cache blocks held by live requests, 0-1 (vLLM kv_cache_usage_perc).", "ratio", "vLLM"),
    Spec(USAGE_PEAK_PAGE, "gauge", _E, f"vLLM's KV usage at its highest over the sidecar's polls of the last {ALERT_USAGE_WINDOW_SECONDS:g} s, 0-1: the page's gate (a Prometheus scraping every 15 s sees four samples a minute and misses the peaks between them).", "ratio", "vLLM"),
    Spec(USAGE_PEAK_WARNING, "gauge", _E, f"vLLM's KV usage at its highest over the sidecar's polls of the last {WARNING_USAGE_WINDOW_SECONDS:g} s, 0-1: the warning's gate.", "ratio", "vLLM"),
    Spec("kv_used_tokens", "gauge", _E, "KV slots held by live requests (usage × usable blocks × block size).", "tokens", "vLLM + derived"),
    Spec("kv_free_tokens", "gauge", _E, "KV slots free now.", "tokens", "vLLM + derived"),
    Spec("free_sequences", "gauge", ("engine", "context"), "Sequences of the given context that still fit in the free KV cache.", "sequences", "derived"),
    Spec("tokens_per_running_sequence", "gauge", _E, "KV tokens held per running sequence (used tokens ÷ running).", "tokens", "derived"),
    Spec("requests_running", "gauge", _E, "Requests in the running batch.", "requests", "vLLM"),
    Spec("requests_waiting", "gauge", _E, "Requests waiting to be scheduled.", "requests", "vLLM"),
    Spec("requests_waiting_for_capacity", "gauge", _E, "Requests waiting for scheduling capacity (vLLM 0.20+).", "requests", "vLLM"),
    Spec("preemptions", "counter", _E, "Preemptions vLLM reported since the sidecar started, across vLLM restarts.", "count", "vLLM"),
    Spec("context_tokens", "gauge", ("engine", "percentile"), "Prompt + generation tokens per finished request over the window, by percentile.", "tokens", "vLLM histograms"),
    Spec("context_mean_tokens", "gauge", _E, "Mean prompt + generation tokens per finished request over the window.", "tokens", "vLLM histograms"),
    Spec("prompt_tokens", "gauge", ("engine", "percentile"), "Prompt tokens per finished request over the window, by percentile.", "tokens", "vLLM histograms"),
    Spec("generation_tokens", "gauge", ("engine", "percentile"), "Generated tokens per finished request over the window, by percentile.", "tokens", "vLLM histograms"),
    Spec("context_requests", "gauge", _E, "Finished requests the context distribution is computed from.", "requests", "vLLM histograms"),
    Spec("sequences_per_request", "gauge", _E, "Sequences per request (mean of the n parameter over the window).", "ratio", "vLLM histograms"),
    Spec("max_users", "gauge", ("engine", "context"), "Concurrent requests that fit: max sequences ÷ sequences per request.", "requests", "derived"),
    Spec("config_overcommit_ratio", "gauge", _E, "max_num_seqs ÷ sequences that fit at p95 context; above 1 the configuration will preempt.", "ratio", "derived"),
    Spec("recommended_max_num_seqs", "gauge", _E, "The most sequences that fit at the observed p95 context.", "sequences", "derived"),
    Spec("prefix_cache_hit_ratio", "gauge", _E, "Prompt tokens served from the prefix cache over the window, 0-1.", "ratio", "vLLM"),
    Spec("prefix_cache_extra_sequences", "gauge", _E, "Extra p95 sequences that fit when the hit share of each prompt is shared.", "sequences", "derived"),
    # risk
    Spec("overcommit_ratio", "gauge", _E, "Expected remaining growth of the running sequences (committed_tokens) over the free KV tokens; above 1 the running batch will not fit.", "ratio", "risk model"),
    Spec("committed_tokens", "gauge", _E, "KV tokens the running sequences are still expected to add: running × mean remaining generation length.", "tokens", "risk model"),
    Spec("seconds_to_exhaustion", "gauge", _E, "When the risk score's own forecast crosses the KV capacity: from the occupancy now to the forecast level 3 minutes ahead, then along the trend; +Inf when it never does (not on this trend).", "seconds", "risk model"),
    Spec("forecast_usage_ratio", "gauge", _E, f"The risk score's forecast KV level 3 minutes ahead over the capacity (0-1; above 1 it overflows); above {EDGE_THRESHOLD:g} for {EDGE_FOR_SECONDS / 60:g} minutes the server runs at the edge (a ticket, not a page).", "ratio", "risk model"),
    Spec("preemption_risk", "gauge", _E, f"Score 0-1 that vLLM preempts within about 3 minutes (forecast KV level with trend and the queue as fast as it is admitted vs capacity, capped by max_num_seqs, and the running batch's overcommit); the warning fires above {WARNING_THRESHOLD:g} while the cache was over {WARNING_USAGE:.0%} full within the last {WARNING_USAGE_WINDOW_SECONDS:g} s (or above {WARNING_CERTAIN:g}), the page above {ALERT_THRESHOLD:g} while it was over {ALERT_USAGE:.0%} full within the last minute.", "ratio", "risk model"),
    Spec("preemption_probability", "gauge", _E, "How often, on this engine since its last restart, a preemption_risk in the band of the current one was followed by a preemption within about 3 minutes (a prior from the fuzz tier to start, decaying with a one-day half-life); a calibrated probability for dashboards, not what the alerts read.", "ratio", "risk model"),
    Spec("risk_history_seconds", "gauge", _E, "How much history (since the sidecar or vLLM started) the risk figures rest on; below 120 priors stand in for the trend and the request mix.", "seconds", "risk model"),
    Spec("load_headroom_ratio", "gauge", _E, "How many times today's traffic (arrival rate, same request mix) the engine holds before the forecast KV level reaches the preemption alert point or the batch fills max_num_seqs, counting that a busier engine steps more slowly (KV reads, prefill); below 1: scale out. Absent without traffic.", "ratio", "risk model"),
    Spec("load_headroom_resource", "gauge", ("engine", "resource"), "Which limit load_headroom_ratio hits first: 1 for the binding resource (kv_cache, max_num_seqs), 0 for the other.", "bool", "risk model"),
    Spec("bottleneck", "gauge", ("engine", "resource"), "What keeps waiting requests from being admitted: 1 for the binding resource (kv_cache, max_num_seqs, compute, stalled, none), 0 for the others.", "bool", "risk model"),
    # gpu
    Spec("gpu_memory_total_bytes", "gauge", ("gpu",), "GPU memory total (NVML).", "bytes", "NVML"),
    Spec("gpu_memory_used_bytes", "gauge", ("gpu",), "GPU memory used by every process (NVML).", "bytes", "NVML"),
    Spec("gpu_memory_foreign_bytes", "gauge", ("gpu",), "GPU memory used beyond this vLLM's expected footprint (ceiling + CUDA context).", "bytes", "NVML + expected"),
    Spec("gpu_info", "gauge", ("gpu", "uuid", "name"), "The GPUs this vLLM uses; value 1.", "info", "NVML"),
    # self
    Spec("source_up", "gauge", ("source",), "1 when the source answered the last poll (vllm, nvml, model).", "bool", "sidecar"),
    Spec("source_last_success_timestamp_seconds", "gauge", ("source",), "When the source last answered (Unix time).", "seconds", "sidecar"),
    Spec("source_poll_duration_seconds", "gauge", ("source",), "How long the source's part of the last poll took, answered or not.", "seconds", "sidecar"),
    Spec("source_missing_info", "gauge", ("source", "what"), "What an answering source lacks that the sidecar reads (e.g. vllm cache_config_info: no observed capacity); value 1, absent when nothing is missing.", "info", "sidecar"),
    Spec("poll_errors", "counter", ("source",), "Polls in which the source failed.", "count", "sidecar"),
    Spec("poll_duration_seconds", "gauge", (), "Duration of the last poll, sources to snapshot.", "seconds", "sidecar"),
    Spec("cardinality_limited", "gauge", ("limit",), f"What a cardinality limit left out of the last poll: engines beyond {MAX_ENGINES}, gpus beyond {MAX_GPUS}, cache_config_labels beyond {MAX_CACHE_CONFIG_LABELS} per engine, label_values cut to {MAX_LABEL_VALUE_LENGTH} characters; 0 within the limits.", "count", "sidecar"),
    Spec("build_info", "gauge", ("version", "python_version"), "The sidecar's version; value 1.", "info", "sidecar"),
    Spec("info", "gauge", ("model", "attention_kind", "kv_cache_dtype", "block_size", "tensor_parallel_size", "pipeline_parallel_size", "vllm_version"), "The deployment as the sidecar sees it; value 1.", "info", "deployment"),
    Spec("deployment_flag_info", "gauge", ("flag", "value", "source"), "Each deployed vLLM flag and where the sidecar learnt it; value 1.", "info", "deployment"),
)  # fmt: skip
BY_NAME = {s.name: s for s in METRICS}
LIMITS = ("engines", "gpus", "cache_config_labels", "label_values")


class _Families:
    """Samples by metric, in METRICS order; a metric with no sample is left out entirely."""

    def __init__(self) -> None:
        self._samples: dict[str, list[tuple[tuple[str, ...], float]]] = {}
        self.cut = 0  # label values shortened to MAX_LABEL_VALUE_LENGTH

    def add(self, name: str, labels: Iterable[str], value: float | None) -> None:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return
        values = tuple(labels)
        # The last line of defence for values from outside (GPU names, versions, flags):
        # no label value leaves the sidecar longer than the parser keeps its own. (The
        # longest, found by map in C: ~500 samples a poll at 8 engines.)
        if values and max(map(len, values)) > MAX_LABEL_VALUE_LENGTH:
            self.cut += sum(len(v) > MAX_LABEL_VALUE_LENGTH for v in values)
            values = tuple(cut_label(v) for v in values)
        self._samples.setdefault(name, []).append((values, float(value)))

    def ordered(self) -> Iterator[tuple[Spec, list[tuple[tuple[str, ...], float]]]]:
        for spec in METRICS:
            samples = self._samples.get(spec.name)
            if samples:
                yield spec, samples

    def text(self) -> str:
        """The text exposition, byte for byte what prometheus_client's generate_latest
        writes for these families, without its per-sample validation (our names and label
        names are fixed above; label values are escaped here)."""
        out: list[str] = []
        for spec, samples in self.ordered():
            out.append(_HEADERS[spec.name])
            for labels, value in samples:
                prefix = _PREFIX_CACHE.get((spec.name, labels))
                if prefix is None:
                    prefix = _sample_prefix(spec, labels)
                out.append(f"{prefix} {floatToGoString(value)}\n")
        return "".join(out)


# Label sets repeat every poll; their rendered prefixes are kept (bounded, like the parser's).
_PREFIX_CACHE: dict[tuple[str, tuple[str, ...]], str] = {}
_PREFIX_CACHE_MAX = 4096


def _sample_name(spec: Spec) -> str:
    return spec.full + ("_total" if spec.kind == "counter" else "")


def _header(spec: Spec) -> str:
    name = _sample_name(spec)
    help_text = spec.help.replace("\\", "\\\\").replace("\n", "\\n")
    return f"# HELP {name} {help_text}\n# TYPE {name} {spec.kind}\n"


# Fixed text: rendered once, not on every poll and scrape.
_HEADERS = {spec.name: _header(spec) for spec in METRICS}


def _sample_prefix(spec: Spec, labels: tuple[str, ...]) -> str:
    """``name{a="x",b="y"}`` with labels sorted by name, as prometheus_client writes them."""
    name = _sample_name(spec)
    if labels:
        pairs = sorted(zip(spec.labels, labels, strict=True))
        name += "{" + ",".join(f'{k}="{escape_label(v)}"' for k, v in pairs) + "}"
    if len(_PREFIX_CACHE) >= _PREFIX_CACHE_MAX:
        _PREFIX_CACHE.clear()
    _PREFIX_CACHE[(spec.name, labels)] = name
    return name


class SnapshotCollector:
    """Renders one snapshot. Sample output (one engine, vLLM 0.32 on the CPU)::

    # HELP kv_headroom_kv_capacity_blocks KV cache blocks (vLLM num_gpu_blocks; one is reserved).
    # TYPE kv_headroom_kv_capacity_blocks gauge
    kv_headroom_kv_capacity_blocks{engine="0",source="observed"} 48.0
    kv_headroom_max_sequences{context="p95",engine="0"} 5.0
    kv_headroom_source_up{source="vllm"} 1.0
    """

    def __init__(self, snapshot: Snapshot) -> None:
        self._snap = snapshot
        self.limited: dict[str, int] = {}  # by limit, filled by a rendering

    def samples(self) -> list[tuple[Spec, list[tuple[tuple[str, ...], float]]]]:
        """What a rendering writes: each metric with samples, in METRICS order, and its
        (label values, value) pairs, label values already cut."""
        return list(self._fill().ordered())

    def text(self) -> str:
        return self._fill().text()

    def _fill(self) -> _Families:
        f = _Families()
        snap = self._snap
        self._capacity(f, snap)
        for view in snap.engines:
            self._engine(f, snap, view)
        for gpu in snap.gpus:
            g = str(gpu.index)
            f.add("gpu_memory_total_bytes", [g], gpu.total_bytes)
            f.add("gpu_memory_used_bytes", [g], gpu.used_bytes)
            f.add("gpu_memory_foreign_bytes", [g], gpu.foreign_bytes)
            f.add("gpu_info", [g, gpu.uuid, gpu.name], 1)
        for src in snap.sources:
            f.add("source_up", [src.name], 1 if src.up else 0)
            f.add("source_last_success_timestamp_seconds", [src.name], src.last_success)
            f.add("poll_errors", [src.name], src.errors_total)
            f.add("source_poll_duration_seconds", [src.name], src.poll_duration_seconds)
            for what in src.missing:
                f.add("source_missing_info", [src.name, what], 1)
        f.add("poll_duration_seconds", [], snap.poll_duration_seconds)
        f.add("build_info", [__version__, platform.python_version()], 1)
        self._info(f, snap)
        self.limited = {limit: snap.limited.get(limit, 0) for limit in LIMITS}
        self.limited["label_values"] += f.cut
        for limit, count in self.limited.items():
            f.add("cardinality_limited", [limit], count)
        return f

    @staticmethod
    def _capacity(f: _Families, snap: Snapshot) -> None:
        f.add("kv_bytes_per_token", [], snap.kv_bytes_per_token)
        plan = snap.expected
        if plan is None:
            return
        stage = plan.tightest
        if stage.requested:
            f.add("memory_ceiling_bytes", [], stage.requested)
            f.add("overhead_bytes", [], stage.overhead)
        if stage.weights:
            f.add("weights_bytes", [], stage.weights)

    @staticmethod
    def _engine(f: _Families, snap: Snapshot, v: EngineView) -> None:
        e = v.engine
        plan = snap.expected
        if plan is not None:
            f.add("kv_budget_bytes", [e, "expected"], plan.kv_budget_bytes)
            f.add("kv_capacity_tokens", [e, "expected"], plan.cap.capacity_tokens)
            f.add("kv_capacity_blocks", [e, "expected"], plan.cap.num_blocks)
        f.add("budget_drift_ratio", [e], v.budget_drift_ratio)
        f.add("kv_budget_bytes", [e, "observed"], v.budget_bytes)
        f.add("kv_capacity_tokens", [e, "observed"], v.capacity_tokens)
        f.add("kv_capacity_blocks", [e, "observed"], v.num_blocks)
        for label, seqs in v.max_sequences.items():
            f.add("max_sequences", [e, label], seqs)
        for label, seqs in v.free_sequences.items():
            f.add("free_sequences", [e, label], seqs)
        for label, users in v.max_users.items():
            f.add("max_users", [e, label], users)
        f.add("kv_usage_ratio", [e], v.kv_usage)
        f.add(USAGE_PEAK_PAGE, [e], v.kv_usage_peak_page)
        f.add(USAGE_PEAK_WARNING, [e], v.kv_usage_peak_warning)
        if v.occupancy is not None:
            f.add("kv_used_tokens", [e], v.occupancy.used_tokens)
            f.add("kv_free_tokens", [e], v.occupancy.free_tokens)
            f.add("tokens_per_running_sequence", [e], v.occupancy.tokens_per_running_sequence)
        f.add("requests_running", [e], v.running)
        f.add("requests_waiting", [e], v.waiting)
        f.add("requests_waiting_for_capacity", [e], v.waiting_for_capacity)
        f.add("preemptions", [e], v.preemptions_total)
        if v.context is not None:
            # "percentile", not "quantile": that label is reserved for summaries.
            for label, value in v.context.quantiles.items():
                f.add("context_tokens", [e, label], value)
                f.add("prompt_tokens", [e, label], v.context.prompt_quantiles[label])
                f.add("generation_tokens", [e, label], v.context.generation_quantiles[label])
            f.add("context_mean_tokens", [e], v.context.mean)
            f.add("context_requests", [e], v.context.requests)
        f.add("sequences_per_request", [e], v.sequences_per_request)
        f.add("config_overcommit_ratio", [e], v.config_overcommit_ratio)
        f.add("recommended_max_num_seqs", [e], v.recommended_max_num_seqs)
        f.add("prefix_cache_hit_ratio", [e], v.prefix_cache_hit_ratio)
        f.add("prefix_cache_extra_sequences", [e], v.prefix_cache_extra_sequences)
        if v.risk is not None:
            f.add("overcommit_ratio", [e], v.risk.overcommit_ratio)
            f.add("committed_tokens", [e], v.risk.committed_tokens)
            f.add("seconds_to_exhaustion", [e], v.risk.seconds_to_exhaustion)
            f.add("forecast_usage_ratio", [e], v.risk.forecast_usage)
            f.add("preemption_risk", [e], v.risk.preemption_risk)
            f.add("risk_history_seconds", [e], v.risk.history_seconds)
        if v.preemption_probability is not None:
            f.add("preemption_probability", [e], v.preemption_probability)
        if v.load_headroom_ratio is not None:
            f.add("load_headroom_ratio", [e], v.load_headroom_ratio)
            for resource in HEADROOM_RESOURCES:
                binding = 1.0 if resource == v.load_headroom_resource else 0.0
                f.add("load_headroom_resource", [e, resource], binding)
        if v.bottleneck is not None:
            for resource in RESOURCES:
                f.add("bottleneck", [e, resource], 1.0 if resource == v.bottleneck else 0.0)

    @staticmethod
    def _info(f: _Families, snap: Snapshot) -> None:
        d = snap.deployment
        block = snap.block_size
        f.add(
            "info",
            [
                snap.model_name or "",
                snap.attention_kind or "",
                d.kv_cache_dtype or "auto",
                str(block or ""),
                str(d.tensor_parallel_size or 1),
                str(d.pipeline_parallel_size or 1),
                d.vllm_version or "",
            ],
            1,
        )
        for key, value in sorted(d.items()):
            f.add("deployment_flag_info", [key, _show(value), d.origin.get(key, "")], 1)


def _show(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def render(snapshot: Snapshot) -> bytes:
    """The Prometheus text exposition (format 0.0.4) of one snapshot."""
    return render_counted(snapshot)[0]


def render_counted(snapshot: Snapshot) -> tuple[bytes, dict[str, int]]:
    """The exposition, and what each cardinality limit left out of it."""
    collector = SnapshotCollector(snapshot)
    text = collector.text()
    return text.encode(), collector.limited
