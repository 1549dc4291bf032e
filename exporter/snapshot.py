"""One immutable snapshot of everything the sidecar exports, built from the history. Pure.

The poll loop is the only writer: it appends an observation, calls ``build`` and swaps
the result in; a scrape only renders the latest snapshot.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from exporter.capacity.histogram import Histogram, histogram_delta
from exporter.capacity.kvcache import Layout
from exporter.capacity.live import (
    ContextStats,
    Occupancy,
    blocks_per_sequence,
    ceilings,
    context_stats,
    context_tokens,
    ratio,
)
from exporter.capacity.memory import requested_memory
from exporter.capacity.plan import Plan
from exporter.capacity.releases import Release, TokenLine
from exporter.deployment import Resolved, label_value
from exporter.observe import History, Observation, Totals
from exporter.risk.model import Inputs, Point, Risk, assess
from exporter.sources.vllm_page import EngineMetrics

GIB = 1 << 30
# What vLLM uses on a GPU outside its budget: the CUDA context (≈0.5 GiB on H100s),
# and before 0.20 the CUDA-graph pool too (not subtracted from the budget then).
CUDA_CONTEXT_BYTES = GIB // 2
RISK_HISTORY_SECONDS = 300.0  # what the risk model looks back over


@dataclass(frozen=True)
class SourceState:
    name: str
    up: bool
    last_success: float | None = None
    error_kind: str | None = None
    error: str | None = None
    errors_total: int = 0


@dataclass(frozen=True)
class EngineView:
    engine: str
    model_name: str | None
    running: float | None
    waiting: float | None
    waiting_for_capacity: float | None
    kv_usage: float | None
    preemptions_total: float  # since the sidecar started, across vLLM restarts
    num_blocks: int | None
    block_size: int | None
    capacity_tokens: int | None  # vLLM's "KV cache size", as it counts tokens
    budget_bytes: int | None  # what its KV cache holds: given memory, or blocks × block bytes
    occupancy: Occupancy | None
    context: ContextStats | None
    contexts: Mapping[str, float]
    max_sequences: Mapping[str, int]
    free_sequences: Mapping[str, int]
    sequences_per_request: float
    max_users: Mapping[str, float]
    config_overcommit_ratio: float | None
    recommended_max_num_seqs: int | None
    prefix_cache_hit_ratio: float | None
    prefix_cache_extra_sequences: int | None
    stale: bool  # vLLM did not answer this poll: load figures are withheld
    risk: Risk | None = None


@dataclass(frozen=True)
class GpuView:
    index: int
    uuid: str
    name: str
    total_bytes: int
    used_bytes: int
    foreign_bytes: int | None  # used beyond this vLLM's expected footprint


@dataclass(frozen=True)
class Snapshot:
    time: float
    sources: tuple[SourceState, ...]
    poll_duration_seconds: float
    deployment: Resolved
    model_name: str | None
    attention_kind: str | None
    kv_bytes_per_token: float | None
    kv_bytes_per_token_source: str | None
    expected: Plan | None
    expected_note: str  # why there is no expected figure, or where it came from
    engines: tuple[EngineView, ...]
    gpus: tuple[GpuView, ...]
    vllm_ready: bool  # vLLM has answered at least once
    notes: tuple[str, ...] = field(default=())
    # What a cardinality limit left out of this snapshot, by limit (engines, gpus, ...).
    limited: Mapping[str, int] = field(default_factory=dict)

    def source(self, name: str) -> SourceState | None:
        return next((s for s in self.sources if s.name == name), None)

    @property
    def budget_drift_ratio(self) -> float | None:
        """Observed ÷ expected KV blocks of engine 0 (1.0: vLLM sized its cache as predicted)."""
        if self.expected is None or not self.engines:
            return None
        observed = self.engines[0].num_blocks
        return ratio(observed, self.expected.cap.num_blocks) if observed is not None else None


def _window_histogram(
    now: Totals | None, then: Totals | None, raw: EngineMetrics | None, name: str
) -> Histogram | None:
    """The window's observations; since vLLM started when the window saw none."""
    h_now = getattr(now, name) if now is not None else None
    h_then = getattr(then, name) if then is not None else None
    delta = histogram_delta(h_now, h_then) if h_now is not None else None
    if delta is not None and delta.count > 0:
        return delta
    return getattr(raw, name) if raw is not None else None


def _window_ratio(
    now: Totals | None, then: Totals | None, raw: EngineMetrics | None, num: str, den: str
) -> float | None:
    if now is not None and then is not None:
        d = float(getattr(now, den)) - float(getattr(then, den))
        if d > 0:
            return (float(getattr(now, num)) - float(getattr(then, num))) / d
    if raw is not None:
        n, d_raw = getattr(raw, num), getattr(raw, den)
        if n is not None and d_raw:
            return float(n) / float(d_raw)
    return None


def observed_capacity_tokens(
    cache_config: Mapping[str, str], num_blocks: int, block_size: int, plan: Plan | None
) -> int:
    """vLLM's own token count: its label (0.24+), else what its release prints."""
    label = label_value(cache_config.get("kv_cache_size_tokens"), int)
    if isinstance(label, int) and label >= 0:
        return label
    if plan is None:
        return num_blocks * block_size
    rel: Release = plan.request.release
    layout = plan.layout
    if rel.token_line is TokenLine.CONCURRENCY_TIMES_LEN:
        return int(num_blocks / plan.cap.blocks_per_request * plan.max_model_len)
    if rel.token_line is TokenLine.PER_GROUP:
        return num_blocks // layout.num_groups * block_size
    return num_blocks * block_size


def engine_view(
    raw: EngineMetrics,
    *,
    stale: bool,
    now_totals: Totals | None,
    then_totals: Totals | None,
    deployment: Resolved,
    plan: Plan | None,
    max_model_len: int | None,
    recent: Sequence[Observation] = (),
) -> EngineView:
    cc = raw.cache_config or {}
    num_blocks = label_value(cc.get("num_gpu_blocks"), int)
    block_size = label_value(cc.get("block_size"), int)
    layout: Layout | None = None
    if plan is not None and isinstance(block_size, int) and plan.block_size == block_size:
        layout = plan.layout
    occupancy = None
    capacity_tokens = budget = None
    # A block size of 0 would divide by zero below; the source marks such a page incomplete,
    # and this keeps a history that still holds one from failing every later poll.
    if (
        isinstance(num_blocks, int)
        and isinstance(block_size, int)
        and num_blocks > 0
        and block_size > 0
    ):
        occupancy = Occupancy(num_blocks, block_size, raw.kv_usage or 0.0, raw.running or 0.0)
        capacity_tokens = observed_capacity_tokens(cc, num_blocks, block_size, plan)
        # vLLM's own KV memory figure when it reports one (given memory, CPU backend);
        # else what its blocks occupy.
        given = label_value(cc.get("kv_cache_memory_bytes"), int)
        if isinstance(given, int) and given >= 0:
            budget = given
        elif layout is not None and plan is not None:
            budget = num_blocks * layout.stage_bytes_per_block(plan.cap.tightest_stage)

    prompt = _window_histogram(now_totals, then_totals, raw, "prompt_len")
    generation = _window_histogram(now_totals, then_totals, raw, "generation_len")
    stats = context_stats(prompt, generation)
    contexts = context_tokens(stats, max_model_len)
    # Sequences per request: the mean of the n parameter (parallel sampling) in the window.
    n_hist = _window_histogram(now_totals, then_totals, raw, "n_param")
    per_request = n_hist.sum / n_hist.count if n_hist is not None and n_hist.count > 0 else 1.0
    seqs_per_request = max(1.0, per_request)

    total_fit: dict[str, int] = {}
    free_fit: dict[str, int] = {}
    if occupancy is not None:
        total_fit, free_fit = ceilings(occupancy, layout, contexts)
    users = {label: n / seqs_per_request for label, n in total_fit.items()}
    max_num_seqs = deployment.int_("max_num_seqs") or (plan.max_num_seqs if plan else None)
    at_p95 = total_fit.get("p95")
    overcommit = ratio(max_num_seqs, at_p95) if max_num_seqs and at_p95 is not None else None

    hit_ratio = _window_ratio(now_totals, then_totals, raw, "prefix_hits", "prefix_queries")
    extra = None
    if hit_ratio is not None and stats is not None and occupancy is not None and at_p95:
        shared = hit_ratio * stats.prompt_quantiles["p95"]
        per = blocks_per_sequence(layout, occupancy.block_size, stats.quantiles["p95"] - shared)
        extra = occupancy.usable_blocks // per - at_p95

    risk = None
    if not stale and occupancy is not None and recent:
        risk = assess(
            Inputs(
                points=_points(recent, raw.engine),
                capacity_tokens=occupancy.usable_blocks * occupancy.block_size,
                block_size=occupancy.block_size,
                max_num_seqs=max_num_seqs,
                prompt=prompt,
                generation=generation,
                sequences_per_request=seqs_per_request,
                recent_prompt=_recent_histogram(recent, raw.engine, now_totals, "prompt_len"),
                recent_generation=_recent_histogram(
                    recent, raw.engine, now_totals, "generation_len"
                ),
            )
        )

    return EngineView(
        engine=raw.engine,
        model_name=raw.model_name,
        running=None if stale else raw.running,
        waiting=None if stale else raw.waiting,
        waiting_for_capacity=None if stale else raw.waiting_for_capacity,
        kv_usage=None if stale else raw.kv_usage,
        preemptions_total=now_totals.preemptions if now_totals else 0.0,
        num_blocks=num_blocks if isinstance(num_blocks, int) else None,
        block_size=block_size if isinstance(block_size, int) else None,
        capacity_tokens=capacity_tokens,
        budget_bytes=budget,
        occupancy=None if stale else occupancy,
        context=stats,
        contexts=contexts,
        max_sequences=total_fit,
        free_sequences={} if stale else free_fit,
        sequences_per_request=seqs_per_request,
        max_users=users,
        config_overcommit_ratio=overcommit,
        recommended_max_num_seqs=max(1, at_p95) if at_p95 is not None else None,
        prefix_cache_hit_ratio=hit_ratio,
        prefix_cache_extra_sequences=extra,
        stale=stale,
        risk=risk,
    )


RISK_MIX_SECONDS = 180.0  # the traffic mix the risk model projects is this recent


def _recent_histogram(
    recent: Sequence[Observation], engine: str, now: Totals | None, name: str
) -> Histogram | None:
    if now is None or not recent:
        return None
    cutoff = recent[-1].time - RISK_MIX_SECONDS
    start = next((o for o in recent if o.time >= cutoff), None)
    then = start.totals.get(engine) if start is not None else None
    delta = histogram_delta(getattr(now, name), getattr(then, name) if then else None)
    return delta if delta is not None and delta.count > 0 else None


def _points(recent: Sequence[Observation], engine: str) -> list[Point]:
    """The risk model's view of one engine over the recent observations it answered in."""
    out = []
    for obs in recent:
        raw = obs.page.engine(engine) if obs.page is not None else None
        totals = obs.totals.get(engine)
        if raw is None or totals is None or raw.kv_usage is None:
            continue
        out.append(
            Point(
                obs.time,
                raw.kv_usage,
                raw.running or 0.0,
                raw.waiting or 0.0,
                totals.requests_finished,
                totals.generation_tokens,
                obs.epoch,
            )
        )
    return out


def engine_views(
    history: History, window_seconds: float, deployment: Resolved, plan: Plan | None
) -> tuple[EngineView, ...]:
    latest, good = history.latest, history.last_good()
    if latest is None or good is None or good.page is None:
        return ()
    stale = latest.page is None
    start = history.at_or_after(latest.time - window_seconds)
    max_model_len = deployment.int_("max_model_len") or (plan.max_model_len if plan else None)
    recent = history.recent(latest.time - RISK_HISTORY_SECONDS)
    return tuple(
        engine_view(
            raw,
            stale=stale,
            now_totals=latest.totals.get(raw.engine),
            then_totals=start.totals.get(raw.engine) if start is not None else None,
            deployment=deployment,
            plan=plan,
            max_model_len=max_model_len,
            recent=recent,
        )
        for raw in good.page.engines
    )


def gpu_views(
    gpus: Sequence[tuple[int, str, str, int, int, int]], plan: Plan | None
) -> tuple[GpuView, ...]:
    """Per GPU (index, uuid, name, CUDA total, NVML total, used): foreign = used − footprint.

    In a container NVML reports host PIDs, so processes cannot be matched to vLLM reliably;
    instead vLLM's footprint is what it is expected to take — its ceiling (utilization ×
    CUDA total, or weights + overhead + given KV memory) plus the CUDA context, plus the
    CUDA-graph pool before 0.20 — and anything used beyond that belongs to someone else.
    """
    out = []
    for index, uuid, name, cuda_total, nvml_total, used in gpus:
        foreign = None
        if plan is not None:
            stage = plan.tightest
            if plan.request.kv_cache_memory_bytes is not None:
                footprint = stage.weights + stage.overhead + plan.request.kv_cache_memory_bytes
            else:
                # Rounded as vLLM rounds its ceiling (up, from 0.14): int() here left a byte
                # of vLLM's own memory counted as foreign on every GPU.
                footprint = requested_memory(cuda_total, plan.utilization, plan.request.release)
            footprint += CUDA_CONTEXT_BYTES
            if not plan.request.release.subtracts_cudagraph_estimate and not (
                plan.request.enforce_eager
            ):
                footprint += plan.request.overhead.cuda_graph
            foreign = max(0, used - footprint)
        out.append(GpuView(index, uuid, name, nvml_total, used, foreign))
    return tuple(out)
