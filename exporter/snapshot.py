"""One immutable snapshot of everything the sidecar exports, assembled here. Pure.

The poll loop is the only writer: it appends an observation, resolves the deployment
(``exporter/deployment.py``), calls ``build`` with what the sources read and swaps the result in;
a scrape only renders the latest snapshot. Every figure the collector writes is computed
here, so the collector only formats.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from exporter.cache_config import CacheConfig
from exporter.capacity.gpus import GIB
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
from exporter.capacity.plan import Plan, PlanRequest, plan
from exporter.capacity.releases import Release, TokenLine
from exporter.capacity.steptime import StepTimes, step_times
from exporter.deployment import Deployment, gpu_for_plan, plan_request
from exporter.errors import InputError
from exporter.observe import History, Observation, Totals
from exporter.recent import Recent
from exporter.risk.bottleneck import Bottleneck, classify, settled
from exporter.risk.headroom import LoadHeadroom, load_headroom
from exporter.risk.model import (
    ALERT_USAGE_WINDOW_SECONDS,
    WARNING_USAGE_WINDOW_SECONDS,
    Inputs,
    Point,
    Risk,
    assess,
    current_epoch,
    usage_peak,
)
from exporter.sources.base import Readings, SourceState
from exporter.sources.model_dir import MODEL, LoadedModel
from exporter.sources.nvml import GPU_MEMORY, GpuMemory
from exporter.sources.vllm import CARD
from exporter.sources.vllm_page import EngineMetrics

__all__ = ["GIB", "EngineView", "GpuView", "Snapshot", "SourceState", "build"]

# What vLLM uses on a GPU outside its budget: the CUDA context (≈0.5 GiB on H100s),
# and before 0.20 the CUDA-graph pool too (not subtracted from the budget then).
CUDA_CONTEXT_BYTES = GIB // 2
RISK_HISTORY_SECONDS = 300.0  # what the risk model looks back over
# How long after vLLM's last answer its forecast is still served. A loaded vLLM's API server
# can take longer than the sidecar's timeout to render /metrics (on the e2e tier's CPU
# servers, up to one poll in five during a ramp, a few seconds at a time): the load
# figures of that poll are withheld, but the score, a three-minute forecast from the polls
# that did answer, is as true as it was seconds ago. Withheld, it reset every alert's `for:`
# at the very moment the cache filled (a gap at one evaluation is enough), so the warning
# came late or not at all. Five default polls; longer, and the alerts are blind anyway.
RISK_HOLD_SECONDS = 10.0


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
    # How often, on this engine, a score like ``risk``'s was followed by a preemption within
    # the horizon (risk/odds.py; the poll loop fills it in, None until it has).
    preemption_probability: float | None = None
    # What keeps waiting requests from being admitted (risk/bottleneck.py), and why.
    bottleneck: str | None = None
    bottleneck_evidence: str = ""
    budget_drift_ratio: float | None = None  # observed ÷ expected blocks
    # How many times today's traffic the engine holds, and what binds first (risk/headroom.py).
    load_headroom_ratio: float | None = None
    load_headroom_resource: str | None = None
    # vLLM's usage at its highest over the page's and the warning's windows of polls: the
    # gates the alerts read (risk/model.py usage_peak).
    kv_usage_peak_page: float | None = None
    kv_usage_peak_warning: float | None = None


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
    deployment: Deployment
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
    block_size: int | None = None  # as deployed, else as expected

    def source(self, name: str) -> SourceState | None:
        return next((s for s in self.sources if s.name == name), None)


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
    cache_config: CacheConfig, num_blocks: int, block_size: int, plan: Plan | None
) -> int:
    """vLLM's own token count: its label (0.24+), else what its release prints."""
    label = cache_config.kv_cache_size_tokens
    if label is not None and label >= 0:
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


@dataclass(frozen=True)
class EngineCapacity:
    """What one engine holds and how much of it is in use (capacity/live.py): the part of
    its ``EngineView`` read from its page and the window's histograms alone."""

    num_blocks: int | None
    block_size: int | None
    occupancy: Occupancy | None
    capacity_tokens: int | None
    budget_bytes: int | None
    prompt: Histogram | None  # the window's (the risk model projects these too)
    generation: Histogram | None
    context: ContextStats | None
    contexts: Mapping[str, float]
    sequences_per_request: float
    max_sequences: Mapping[str, int]
    free_sequences: Mapping[str, int]
    max_users: Mapping[str, float]
    max_num_seqs: int | None  # as deployed, else as expected
    config_overcommit_ratio: float | None
    recommended_max_num_seqs: int | None
    prefix_cache_hit_ratio: float | None
    prefix_cache_extra_sequences: int | None
    budget_drift_ratio: float | None


def engine_capacity(
    raw: EngineMetrics,
    *,
    now_totals: Totals | None,
    then_totals: Totals | None,
    deployment: Deployment,
    plan: Plan | None,
    max_model_len: int | None,
) -> EngineCapacity:
    """The engine's blocks and tokens, its KV budget, the window's context lengths, how many
    sequences (and users) fit at each, max_num_seqs against that, and what the prefix cache
    adds."""
    cc = raw.cache_config or CacheConfig()
    num_blocks, block_size = cc.num_gpu_blocks, cc.block_size
    layout: Layout | None = None
    if plan is not None and block_size is not None and plan.block_size == block_size:
        layout = plan.layout
    occupancy = None
    capacity_tokens = budget = None
    # A block size of 0 would divide by zero below; the source marks such a page incomplete,
    # and this keeps a history that still holds one from failing every later poll.
    if num_blocks is not None and block_size is not None and num_blocks > 0 and block_size > 0:
        occupancy = Occupancy(num_blocks, block_size, raw.kv_usage or 0.0, raw.running or 0.0)
        capacity_tokens = observed_capacity_tokens(cc, num_blocks, block_size, plan)
        # vLLM's own KV memory figure when it reports one (given memory, CPU backend);
        # else what its blocks occupy.
        given = cc.kv_cache_memory_bytes
        if given is not None and given >= 0:
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
    max_num_seqs = deployment.max_num_seqs or (plan.max_num_seqs if plan else None)
    at_p95 = total_fit.get("p95")
    overcommit = ratio(max_num_seqs, at_p95) if max_num_seqs and at_p95 is not None else None

    hit_ratio = _window_ratio(now_totals, then_totals, raw, "prefix_hits", "prefix_queries")
    extra = None
    if hit_ratio is not None and stats is not None and occupancy is not None and at_p95:
        shared = hit_ratio * stats.prompt_quantiles["p95"]
        per = blocks_per_sequence(layout, occupancy.block_size, stats.quantiles["p95"] - shared)
        extra = occupancy.usable_blocks // per - at_p95

    return EngineCapacity(
        num_blocks=num_blocks,
        block_size=block_size,
        occupancy=occupancy,
        capacity_tokens=capacity_tokens,
        budget_bytes=budget,
        prompt=prompt,
        generation=generation,
        context=stats,
        contexts=contexts,
        sequences_per_request=seqs_per_request,
        max_sequences=total_fit,
        free_sequences=free_fit,
        max_users=users,
        max_num_seqs=max_num_seqs,
        config_overcommit_ratio=overcommit,
        recommended_max_num_seqs=max(1, at_p95) if at_p95 is not None else None,
        prefix_cache_hit_ratio=hit_ratio,
        prefix_cache_extra_sequences=extra,
        budget_drift_ratio=(
            num_blocks / plan.cap.num_blocks
            if plan is not None and num_blocks is not None and plan.cap.num_blocks
            else None
        ),
    )


RISK_MIX_SECONDS = 180.0  # the traffic mix the risk model projects is this recent


def _recent_histogram(
    start: Observation | None, engine: str, now: Totals | None, name: str
) -> Histogram | None:
    """What finished since ``start`` (the first observation of the last
    ``RISK_MIX_SECONDS``), or None when nothing did."""
    if now is None or start is None:
        return None
    then = start.totals.get(engine)
    delta = histogram_delta(getattr(now, name), getattr(then, name) if then else None)
    return delta if delta is not None and delta.count > 0 else None


@dataclass(frozen=True)
class EngineRisk:
    """What the risk model makes of one engine (risk/model.py, bottleneck.py, headroom.py)."""

    risk: Risk
    bottleneck: Bottleneck  # as the gauge says it (``settled``)
    headroom: LoadHeadroom | None


def engine_risk(
    engine: str,
    capacity: EngineCapacity,
    *,
    plan: Plan | None,
    now_totals: Totals | None,
    mix_start: Observation | None,
    points: Sequence[Point],
    excursion: float | None,
    max_model_len: int | None = None,
) -> EngineRisk | None:
    """The risk model's front: its ``Inputs`` from the engine's capacity, its recent points
    and traffic mix, and its judged past (``excursion``, risk/calibration.py); None with no
    blocks to fill or no history yet."""
    occupancy = capacity.occupancy
    if occupancy is None or mix_start is None:
        return None
    tokens = occupancy.usable_blocks * occupancy.block_size
    recent_prompt = _recent_histogram(mix_start, engine, now_totals, "prompt_len")
    typical = recent_prompt or capacity.prompt
    current = current_epoch(points)
    # What the queue waits on, as the gauge says it (``settled``: not a new queue that goes
    # within the next steps). The risk model reads the same answer: a request caught
    # between two steps read as a prefill-paced queue halved the spread for one poll, and
    # the score fell from 0.8 to 0.005 and back, which reset the warning's 15 s (the demo's
    # burst in a real Prometheus, stop 42's CI). A burst longer than the engine admits
    # still counts at once.
    gauge = settled(
        classify(
            current,
            tokens,
            capacity.max_num_seqs,
            typical.sum / typical.count if typical is not None and typical.count else None,
            max_model_len,
        ),
        current,
    )
    inputs = Inputs(
        points=points,
        capacity_tokens=tokens,
        block_size=occupancy.block_size,
        max_num_seqs=capacity.max_num_seqs,
        prompt=capacity.prompt,
        generation=capacity.generation,
        sequences_per_request=capacity.sequences_per_request,
        recent_prompt=recent_prompt,
        recent_generation=_recent_histogram(mix_start, engine, now_totals, "generation_len"),
        bottleneck=gauge.resource,
        excursion=excursion,
    )
    risk = assess(inputs)
    return EngineRisk(
        risk=risk,
        bottleneck=gauge,
        headroom=load_headroom(
            risk,
            inputs,
            steps=_step_times_of(plan) if plan is not None else None,
            prefix_hit_ratio=capacity.prefix_cache_hit_ratio or 0.0,
        ),
    )


def engine_view(
    raw: EngineMetrics,
    *,
    stale: bool,
    now_totals: Totals | None,
    then_totals: Totals | None,
    deployment: Deployment,
    plan: Plan | None,
    max_model_len: int | None,
    mix_start: Observation | None = None,
    points: Sequence[Point] = (),
    excursion: float | None = None,
    held: bool = False,
) -> EngineView:
    """One engine's view: its capacity (``engine_capacity``), then what the risk model makes
    of it (``engine_risk``); a stale engine's load figures are withheld, and it gets no risk
    unless ``held`` (vLLM answered within RISK_HOLD_SECONDS: the forecast and its gates
    stand as of that answer)."""
    cap = engine_capacity(
        raw,
        now_totals=now_totals,
        then_totals=then_totals,
        deployment=deployment,
        plan=plan,
        max_model_len=max_model_len,
    )
    forecast = not stale or held
    front = None
    if forecast:
        front = engine_risk(
            raw.engine,
            cap,
            plan=plan,
            now_totals=now_totals,
            mix_start=mix_start,
            points=points,
            excursion=excursion,
            max_model_len=max_model_len,
        )
    headroom = front.headroom if front is not None else None
    return EngineView(
        engine=raw.engine,
        model_name=raw.model_name,
        running=None if stale else raw.running,
        waiting=None if stale else raw.waiting,
        waiting_for_capacity=None if stale else raw.waiting_for_capacity,
        kv_usage=None if stale else raw.kv_usage,
        preemptions_total=now_totals.preemptions if now_totals else 0.0,
        num_blocks=cap.num_blocks,
        block_size=cap.block_size,
        capacity_tokens=cap.capacity_tokens,
        budget_bytes=cap.budget_bytes,
        occupancy=None if stale else cap.occupancy,
        context=cap.context,
        contexts=cap.contexts,
        max_sequences=cap.max_sequences,
        free_sequences={} if stale else cap.free_sequences,
        sequences_per_request=cap.sequences_per_request,
        max_users=cap.max_users,
        config_overcommit_ratio=cap.config_overcommit_ratio,
        recommended_max_num_seqs=cap.recommended_max_num_seqs,
        prefix_cache_hit_ratio=cap.prefix_cache_hit_ratio,
        prefix_cache_extra_sequences=cap.prefix_cache_extra_sequences,
        stale=stale,
        risk=front.risk if front is not None else None,
        bottleneck=front.bottleneck.resource if front is not None else None,
        bottleneck_evidence=front.bottleneck.evidence if front is not None else "",
        load_headroom_ratio=headroom.ratio if headroom is not None else None,
        load_headroom_resource=headroom.resource if headroom is not None else None,
        budget_drift_ratio=cap.budget_drift_ratio,
        kv_usage_peak_page=usage_peak(points, ALERT_USAGE_WINDOW_SECONDS) if forecast else None,
        kv_usage_peak_warning=(
            usage_peak(points, WARNING_USAGE_WINDOW_SECONDS) if forecast else None
        ),
    )


def engine_views(
    history: History,
    window_seconds: float,
    deployment: Deployment,
    plan: Plan | None,
    excursions: Mapping[str, float | None] | None = None,
) -> tuple[EngineView, ...]:
    latest, good = history.latest, history.last_good()
    if latest is None or good is None or good.page is None:
        return ()
    stale = latest.page is None
    held = stale and latest.time - good.time <= RISK_HOLD_SECONDS
    start = history.at_or_after(latest.time - window_seconds)
    max_model_len = deployment.max_model_len or (plan.max_model_len if plan else None)
    since = latest.time - RISK_HISTORY_SECONDS
    # The traffic mix's window starts here: a bisection, not a scan of the last minutes.
    mix_start = history.at_or_after(latest.time - RISK_MIX_SECONDS)
    return tuple(
        engine_view(
            raw,
            stale=stale,
            now_totals=latest.totals.get(raw.engine),
            then_totals=start.totals.get(raw.engine) if start is not None else None,
            deployment=deployment,
            plan=plan,
            max_model_len=max_model_len,
            mix_start=mix_start,
            points=history.points(raw.engine, since),
            excursion=(excursions or {}).get(raw.engine),
            held=held,
        )
        for raw in good.page.engines
    )


def gpu_views(gpus: Sequence[GpuMemory], plan: Plan | None) -> tuple[GpuView, ...]:
    """Per GPU: foreign = used − this vLLM's expected footprint.

    In a container NVML reports host PIDs, so processes cannot be matched to vLLM reliably;
    instead vLLM's footprint is what it is expected to take — its ceiling (utilization ×
    CUDA total, or weights + overhead + given KV memory) plus the CUDA context, plus the
    CUDA-graph pool before 0.20 — and anything used beyond that belongs to someone else.
    """
    out = []
    for gpu in gpus:
        used, cuda_total = gpu.used_bytes, gpu.cuda_total_bytes
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
        out.append(GpuView(gpu.index, gpu.uuid, gpu.name, gpu.total_bytes, used, foreign))
    return tuple(out)


_STEP_TIMES: Recent[StepTimes] = Recent()


def _step_times_of(plan: Plan) -> StepTimes:
    """The plan's step times; counting its parameters each poll cost ~50 µs an engine."""
    return _STEP_TIMES.get((plan,), lambda: step_times(plan))


@functools.lru_cache(maxsize=32)
def _plan_or_why(request: PlanRequest) -> Plan | str:
    """``plan`` memoised: the request only changes when the deployment or GPU does."""
    try:
        return plan(request)
    except InputError as e:
        return str(e)


def expected_plan(
    deployment: Deployment,
    model: LoadedModel | None,
    gpus: Sequence[GpuMemory],
    configured_gpu: str | None,
) -> tuple[Plan | None, str]:
    """What vLLM should have allocated, and where that came from (or why there is none)."""
    if model is None:
        return None, "no model config: expected capacity needs the model's config.json"
    nvml_gpu = (gpus[0].name, gpus[0].cuda_total_bytes) if gpus else None
    return _EXPECTED.get(
        (deployment, model, nvml_gpu, configured_gpu),
        lambda: _expected(deployment, model, nvml_gpu, configured_gpu),
    )


_EXPECTED: Recent[tuple[Plan | None, str]] = Recent()


def _expected(
    deployment: Deployment,
    model: LoadedModel,
    nvml_gpu: tuple[str, int] | None,
    configured_gpu: str | None,
) -> tuple[Plan | None, str]:
    gpu, gpu_note = gpu_for_plan(
        nvml_gpu, configured_gpu, deployment.kv_cache_memory_bytes is not None
    )
    if gpu is None:
        return None, f"GPU memory {gpu_note}"
    request = plan_request(
        deployment,
        arch=model.arch,
        model_name=model.source.name,
        gpu=gpu,
        weights_bytes=model.source.weights_bytes,
        weights_source=model.source.weights_source or "estimate",
    )
    result = _plan_or_why(request)
    if isinstance(result, str):
        return None, result
    return result, f"from the model config and flags; GPU {gpu_note}"


def bytes_per_token(expected: Plan | None, history: History) -> tuple[float | None, str | None]:
    """From the model config; else implied by vLLM's own memory ÷ tokens (no override)."""
    if expected is not None:
        return float(expected.kv_bytes_per_token), "config"
    good = history.last_good()
    if good is None or good.page is None or not good.page.engines:
        return None, None
    cc = good.page.engines[0].cache_config or CacheConfig()
    memory, tokens = cc.kv_cache_memory_bytes, cc.kv_cache_size_tokens
    if (
        memory is not None
        and tokens is not None
        and tokens > 0
        and cc.num_gpu_blocks_override is None
    ):
        return memory / tokens, "implied: kv_cache_memory_bytes ÷ kv_cache_size_tokens"
    return None, None


def served_model_name(readings: Readings, engines: Sequence[EngineView]) -> str | None:
    """The model as vLLM serves it (``--served-model-name``, else its ``--model``), so the
    sidecar's ``model`` label joins vLLM's own ``model_name``: /v1/models first, then the
    page's ``model_name`` label, then the model directory's name."""
    card, model = readings.get(CARD), readings.get(MODEL)
    if card is not None and card.names:
        return card.names[0]
    if engines and engines[0].model_name:
        return engines[0].model_name
    return model.source.name if model is not None else None


def build(
    now: float,
    *,
    history: History,
    readings: Readings,
    sources: Sequence[SourceState],
    deployment: Deployment,
    window_seconds: float,
    configured_gpu: str | None,
    duration: float,
    excursions: Mapping[str, float | None] | None = None,
) -> Snapshot:
    """Everything one poll exports, from the history and what the sources read
    (``excursions``: each engine's judged past, risk/calibration.py)."""
    model = readings.get(MODEL)
    gpu_memory = readings.get(GPU_MEMORY)
    nvml_gpus = gpu_memory.gpus if gpu_memory is not None else ()
    expected, note = expected_plan(deployment, model, nvml_gpus, configured_gpu)
    engines = engine_views(history, window_seconds, deployment, expected, excursions)
    per_token, per_token_source = bytes_per_token(expected, history)
    limited: dict[str, int] = {}
    latest = history.latest
    if latest is not None and latest.page is not None:
        limited.update(latest.page.limited)
    if gpu_memory is not None and gpu_memory.left_out:
        limited["gpus"] = gpu_memory.left_out
    vllm = next((s for s in sources if s.name == "vllm"), None)
    return Snapshot(
        time=now,
        sources=tuple(sources),
        poll_duration_seconds=duration,
        deployment=deployment,
        model_name=served_model_name(readings, engines),
        attention_kind=model.arch.attention_kind.value if model else None,
        kv_bytes_per_token=per_token,
        kv_bytes_per_token_source=per_token_source,
        expected=expected,
        expected_note=note,
        engines=engines,
        gpus=gpu_views(nvml_gpus, expected) if gpu_memory is not None else (),
        vllm_ready=vllm is not None and vllm.last_success is not None,
        notes=tuple(model.arch.approximate) if model else (),
        limited=limited,
        block_size=deployment.block_size or (expected.block_size if expected else None),
    )


def empty(now: float, sources: Sequence[SourceState]) -> Snapshot:
    """What is served before the first poll."""
    return Snapshot(
        time=now,
        sources=tuple(sources),
        poll_duration_seconds=0.0,
        deployment=Deployment(),
        model_name=None,
        attention_kind=None,
        kv_bytes_per_token=None,
        kv_bytes_per_token_source=None,
        expected=None,
        expected_note="no poll yet",
        engines=(),
        gpus=(),
        vllm_ready=False,
    )
