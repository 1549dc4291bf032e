"""The poll's hot paths as they were on main before issue 17's second pass (commit
1ae06a7), verbatim: the baseline ``benchmarks/poll.py`` times today's code against in the
same run, and the reference ``tests/risk/test_assess_reference.py`` checks today's risk
model against (every Risk field, on replayed scenarios). Not shipped: the package has
one implementation of each.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter.capacity.histogram import Histogram, histogram_delta
from exporter.capacity.kvcache import Layout
from exporter.capacity.live import (
    Occupancy,
    blocks_per_sequence,
    ceilings,
    context_stats,
    context_tokens,
    ratio,
)
from exporter.capacity.plan import Plan
from exporter.deployment import Resolved
from exporter.metrics import (
    _PREFIX_CACHE,
    METRICS,
    Spec,
    _sample_name,
    _sample_prefix,
    floatToGoString,
)
from exporter.observe import History, Observation, Totals
from exporter.risk.bottleneck import classify
from exporter.risk.headroom import load_headroom
from exporter.risk.model import (
    _NORMAL,
    ARRIVALS_SECONDS,
    HORIZON,
    IDLE,
    LEVEL_SECONDS,
    QUEUE_SECONDS,
    STEEPNESS,
    TREND_MIN_SECONDS,
    TREND_SECONDS,
    Z_HALF,
    Inputs,
    Point,
    Risk,
)
from exporter.snapshot import (
    RISK_HISTORY_SECONDS,
    RISK_MIX_SECONDS,
    EngineView,
    _step_times_of,
    _window_histogram,
    _window_ratio,
    observed_capacity_tokens,
)
from exporter.sources.vllm_page import (
    MAX_LABEL_VALUE_LENGTH,
    CacheConfig,
    EngineMetrics,
    cut_label,
)

# The one-minute growth the time to exhaustion used at 1ae06a7 (the model now takes it
# from its forecast, issue 27): kept here, with the copy it belongs to.
TTE_SECONDS = 60.0

# The risk model (exporter/risk/model.py at 1ae06a7, from _moments on).


def _moments(h: Histogram | None) -> tuple[float, float, float] | None:
    """E[X], E[X²], E[X³] with each bucket's observations at its midpoint (the +Inf
    bucket at its lower bound)."""
    if h is None or h.count <= 0:
        return None
    m1 = m2 = m3 = 0.0
    lower, prev = 0.0, 0.0
    for bound, cum in zip((*h.bounds, math.inf), h.counts, strict=True):
        n = cum - prev
        prev = cum
        x = lower if math.isinf(bound) else (lower + bound) / 2
        m1, m2, m3 = m1 + n * x, m2 + n * x * x, m3 + n * x**3
        if not math.isinf(bound):
            lower = bound
    return m1 / h.count, m2 / h.count, m3 / h.count


def dispersion(prompt: Histogram | None, generation: Histogram | None) -> float | None:
    """Variance over mean of the occupancy, in tokens (see the module docstring)."""
    p, g = _moments(prompt), _moments(generation)
    if p is None or g is None:
        return None
    p1, p2, _ = p
    g1, g2, g3 = g
    denominator = g1 * p1 + g2 / 2
    if denominator <= 0:
        return None
    return (g1 * p2 + p1 * g2 + g3 / 3) / denominator


def residual_generation(generation: Histogram | None) -> float | None:
    """Mean remaining generation of a sequence caught mid-run: E[G²] / 2E[G]."""
    g = _moments(generation)
    if g is None or g[0] <= 0:
        return None
    return g[1] / (2 * g[0])


def _slope(ts: Sequence[float], ys: Sequence[float]) -> float:
    n = len(ts)
    mt, my = sum(ts) / n, sum(ys) / n
    var = sum((t - mt) ** 2 for t in ts)
    if var <= 0:
        return 0.0
    return sum((t - mt) * (y - my) for t, y in zip(ts, ys, strict=True)) / var


def capped_touch(inputs: Inputs, draws: float) -> float | None:
    """P(touching the top) when ``max_num_seqs`` sequences at their final length are the
    most the cache can hold: their sum is about normal with ``M·E[P+G]`` and
    ``M·Var(P+G)`` (means exact from the histograms' sums, variances from buckets)."""
    p, g = _moments(inputs.prompt), _moments(inputs.generation)
    if not inputs.max_num_seqs or p is None or g is None:
        return None
    assert inputs.prompt is not None
    assert inputs.generation is not None
    m = inputs.max_num_seqs
    mean = inputs.prompt.sum / inputs.prompt.count + inputs.generation.sum / inputs.generation.count
    var = max(0.0, p[1] - p[0] ** 2) + max(0.0, g[1] - g[0] ** 2)
    total, sd = m * mean, math.sqrt(m * var)
    if sd <= 0:
        return 1.0 if total >= inputs.capacity_tokens else 0.0
    once = 1.0 - _NORMAL.cdf((inputs.capacity_tokens - total) / sd)
    return float(1.0 - (1.0 - once) ** draws)


def _token_steps(prompt: Histogram | None, generation: Histogram | None) -> float | None:
    """Token-steps a request holds over its decode: ``G·P + G²/2`` in expectation."""
    p, g = _moments(prompt), _moments(generation)
    if p is None or g is None:
        return None
    return g[0] * p[0] + g[1] / 2


def implied_level(inputs: Inputs, level: float) -> float | None:
    """The level today's request mix settles at: the observed level scaled by how many
    token-steps a request of the last few minutes holds against one of the whole window.

    By Little's law the occupancy is the arrival rate × token-seconds per request; holding
    the rate and the step time, it moves with the token-steps per request. A shift to longer
    requests shows as soon as the first of them finish, before the occupancy has caught up.
    (An earlier form estimated the rate and the step time outright; during prefill-bound
    bursts, when most running requests are prefilling and generate nothing, that step time
    came out several times too long and the level stayed above 100 % minutes after the
    burst had drained.)
    """
    recent = _token_steps(inputs.recent_prompt, inputs.recent_generation)
    window = _token_steps(inputs.prompt, inputs.generation)
    if recent is None or window is None or window <= 0:
        return None
    return level * recent / window


def load_ratio(pts: Sequence[Point], recent: float, window: float) -> float:
    """Requests arriving per second over the last ``recent`` seconds against requests
    finishing per second over the last ``window`` — the throughput that held the
    occupancy there (1 when nothing finished: no rate to go by). Arrivals are the growth
    of finished + running + waiting, which preemption does not move."""
    last = pts[-1]

    def first(seconds: float) -> Point:
        return next(p for p in pts if p.t >= last.t - seconds)

    a, f = first(recent), first(window)
    if last.t - a.t <= 0 or last.t - f.t <= 0 or last.finished <= f.finished:
        return 1.0
    arrived = last.finished + last.running + last.waiting - (a.finished + a.running + a.waiting)
    return max(0.0, arrived) / (last.t - a.t) / ((last.finished - f.finished) / (last.t - f.t))


def _mean(h: Histogram | None) -> float | None:
    return h.sum / h.count if h is not None and h.count > 0 else None


def queued_tokens(
    pts: Sequence[Point],
    prompt: float,
    per_request: float,
    max_num_seqs: int | None,
    bottleneck: str | None = None,
) -> float:

    """What the waiting queue adds to the occupancy: requests become resident only as fast
    as the engine admits them faster than it finishes others (Little's law: resident =
    running × admitted ÷ finished over the last minute), at most all of them and
    ``max_num_seqs``. With nothing finished yet there is no rate to go by, and the whole
    queue counts — unless it waits for compute or a batch slot rather than for blocks.
    ``prompt`` is a typical prompt, ``per_request`` what a resident request holds on
    average over its life."""
    last = pts[-1]
    recent = [p.waiting for p in pts if p.t >= last.t - QUEUE_SECONDS]
    # Smoothed, but never more than waits now: a queue that has drained adds nothing.
    waiting = min(sum(recent) / len(recent), last.waiting)
    if waiting <= 0 or per_request <= 0:
        return 0.0
    target = last.running + waiting
    if max_num_seqs:
        target = min(target, float(max_num_seqs))
    window = [p for p in pts if p.t >= last.t - TTE_SECONDS]
    first = window[0]
    finished = last.finished - first.finished
    if finished > 0 and first.prompt is not None and last.prompt is not None:
        admitted = (last.prompt - first.prompt) / prompt if prompt > 0 else 0.0
        running = sum(p.running for p in window) / len(window)
        target = min(target, running * max(admitted, 0.0) / finished)
    elif bottleneck in ("compute", "max_num_seqs"):
        # No rate yet, but the queue waits for the token budget or a batch slot, not for
        # blocks: it is admitted as requests leave (a prefill-bound burst on a fresh
        # server reads 60 waiting and a cache 15 % full, and never preempts).
        target = last.running
    return max(0.0, target - last.running) * per_request


def assess(inputs: Inputs) -> Risk:
    if not inputs.points:
        return IDLE
    epoch = inputs.points[-1].epoch
    pts = [p for p in inputs.points if p.epoch == epoch]
    last = pts[-1]
    history = last.t - pts[0].t
    if last.running <= 0 and last.waiting <= 0 and last.usage <= 0 and history < TTE_SECONDS:
        return dataclasses.replace(IDLE, history_seconds=history)
    capacity = inputs.capacity_tokens
    used = [p.usage * capacity for p in pts]
    ts = [p.t for p in pts]
    free = max(0.0, capacity - used[-1])
    # Priors for a server the model has not watched finish anything yet: a request the
    # size of what a running sequence holds now.
    held = used[-1] / last.running if last.running >= 1 else 0.0

    def window(seconds: float) -> tuple[list[float], list[float]]:
        keep = [i for i, t in enumerate(ts) if t >= last.t - seconds]
        return [ts[i] for i in keep], [used[i] for i in keep]

    t_short, u_short = window(TTE_SECONDS)
    growth = _slope(t_short, u_short) if len(t_short) > 2 else 0.0
    tte = free / growth if growth > 0 else math.inf

    _, u_level = window(LEVEL_SECONDS)
    level = sum(u_level) / len(u_level)
    # Little's law: the level moves with the arrival rate. When requests arrived over the
    # last minute more slowly than the ones that made the level finished (a burst that
    # drained), that load is leaving: the level falls with the rate, to no less than what
    # is resident now.
    slowing = min(1.0, load_ratio(pts, ARRIVALS_SECONDS, LEVEL_SECONDS))
    level = max(min(used[-1], level), level * slowing)
    t_trend, u_trend = window(TREND_SECONDS)
    # The window's last half: a rise must still be going on there to count as a trend,
    # and the swings are measured there, so that a step up (traffic that started, one
    # long request that grew) is neither a trend nor noise once it is behind.
    t_late, u_late = window((last.t - t_trend[0]) / 2)
    late = _slope(t_late, u_late) if len(t_late) > 2 else 0.0
    trend = 0.0
    if history >= TREND_MIN_SECONDS:
        # A rise is carried ahead only as far as requests still arrive to carry it: one
        # made by a burst that has stopped arriving is not a ramp.
        trend = min(_slope(t_trend, u_trend), late) * slowing
    forecast = level + max(0.0, trend) * HORIZON
    implied = implied_level(inputs, level)
    if implied is not None:
        # The level today's traffic mix settles at (Little's law) — ahead of the
        # occupancy when the mix just changed.
        forecast = max(forecast, implied)
    prompt_mean = _mean(inputs.recent_prompt) or _mean(inputs.prompt) or held
    generation_mean = _mean(inputs.recent_generation) or _mean(inputs.generation) or 0.0
    forecast += queued_tokens(
        pts, prompt_mean, prompt_mean + generation_mean / 2, inputs.max_num_seqs, inputs.bottleneck
    )

    # Little's law: mean duration = mean running / finish rate.
    finished = pts[-1].finished - next(p.finished for p in pts if p.t >= t_trend[0])
    span = last.t - t_trend[0]
    running_mean = sum(p.running for p in pts if p.t >= t_trend[0]) / len(t_trend)
    duration = running_mean * span / finished if finished > 0 else HORIZON
    draws = max(1.0, HORIZON / max(duration, 1.0))

    ratio = dispersion(inputs.prompt, inputs.generation)
    if ratio is None and held > 0:
        # No finished request to measure: sizes as varied as exponential ones around
        # what a running sequence holds (variance over mean = 2 × the mean).
        ratio = 2.0 * held
    # n samples of one request arrive, grow and finish together: n times the variance.
    ratio = ratio * max(1.0, inputs.sequences_per_request) if ratio else None
    theory = math.sqrt(max(forecast, 0.0) * ratio) if ratio else 0.0
    # Near saturation steps slow down as the KV read grows and the occupancy swings wider
    # than independent arrivals explain: take the observed spread around the trend when
    # it is the larger.
    mt = sum(t_late) / len(t_late)
    mu = sum(u_late) / len(u_late)
    residuals = [u - (mu + late * (t - mt)) for t, u in zip(t_late, u_late, strict=True)]
    observed = math.sqrt(sum(r * r for r in residuals) / len(residuals))
    # Swings made by a load that is leaving shrink with it: the occupancy's variance goes
    # with the arrival rate (λ·E[∫size²] for random arrivals).
    late_pts = [p for p in pts if p.t >= t_late[0]]
    now_pts = [p for p in pts if p.t >= last.t - QUEUE_SECONDS]
    resident_late = sum(p.running for p in late_pts) / len(late_pts)
    resident_now = sum(p.running for p in now_pts) / len(now_pts)
    resident = min(1.0, resident_now / resident_late) if resident_late > 0 else 1.0
    observed *= math.sqrt(min(slowing, resident))
    spread = max(theory, observed)
    # The score: 0.5 where the forecast level sits Z_HALF spreads below the top, rising
    # logistically as it closes in (calibrated on the simulator's scenario library).
    if spread > 0:
        z = (capacity - forecast) / spread
        touch = 1.0 / (1.0 + math.exp(max(-50.0, min(50.0, STEEPNESS * (z - Z_HALF)))))
    else:
        touch = 1.0 if forecast >= capacity else 0.0

    capped = capped_touch(inputs, draws)
    if capped is not None:
        # Admission control caps the occupancy: a cap inside the cache makes it safe.
        touch = min(touch, capped)

    remaining = residual_generation(inputs.generation)
    if remaining is None and last.running >= 1 and last.finished <= pts[0].finished:
        # Nothing finished yet: the age prior — as much again as generated so far.
        remaining = max(0.0, last.generated - pts[0].generated) / last.running
    committed = last.running * (remaining or 0.0)
    overcommit = committed / free if free > 0 else (math.inf if committed > 0 else 0.0)
    # A batch admitted faster than the level shows: its growth alone overfills the cache.
    batch = 0.0 if not math.isfinite(overcommit) else max(0.0, min(1.0, overcommit - 1.0))
    if not math.isfinite(overcommit):
        batch = 1.0
    risk = max(touch, batch * min(1.0, last.usage / 0.8))
    return Risk(forecast, spread, free, committed, overcommit, tte, risk, history)


# The snapshot's engine view (exporter/snapshot.py at 1ae06a7).


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
    """Main's way: the engine's points gathered from the recent observations each poll."""
    return [p for obs in recent if (p := obs.points.get(engine)) is not None]


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
    points: Sequence[Point] = (),  # today's history keeps them: ignored, as main gathered
) -> EngineView:  # them from the observations (below)
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
    bottleneck = None
    headroom = None
    if not stale and occupancy is not None and recent:
        points = _points(recent, raw.engine)
        capacity = occupancy.usable_blocks * occupancy.block_size
        recent_prompt = _recent_histogram(recent, raw.engine, now_totals, "prompt_len")
        typical = recent_prompt or prompt
        current = [p for p in points if p.epoch == points[-1].epoch] if points else []
        bottleneck = classify(
            current,
            capacity,
            max_num_seqs,
            typical.sum / typical.count if typical is not None and typical.count else None,
        )
        inputs = Inputs(
            points=points,
            capacity_tokens=capacity,
            block_size=occupancy.block_size,
            max_num_seqs=max_num_seqs,
            prompt=prompt,
            generation=generation,
            sequences_per_request=seqs_per_request,
            recent_prompt=recent_prompt,
            recent_generation=_recent_histogram(recent, raw.engine, now_totals, "generation_len"),
            bottleneck=bottleneck.resource,
        )
        risk = assess(inputs)
        headroom = load_headroom(
            risk,
            inputs,
            steps=_step_times_of(plan) if plan is not None else None,
            prefix_hit_ratio=hit_ratio or 0.0,
        )

    return EngineView(
        engine=raw.engine,
        model_name=raw.model_name,
        running=None if stale else raw.running,
        waiting=None if stale else raw.waiting,
        waiting_for_capacity=None if stale else raw.waiting_for_capacity,
        kv_usage=None if stale else raw.kv_usage,
        preemptions_total=now_totals.preemptions if now_totals else 0.0,
        num_blocks=num_blocks,
        block_size=block_size,
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
        bottleneck=bottleneck.resource if bottleneck is not None else None,
        bottleneck_evidence=bottleneck.evidence if bottleneck is not None else "",
        load_headroom_ratio=headroom.ratio if headroom is not None else None,
        load_headroom_resource=headroom.resource if headroom is not None else None,
        budget_drift_ratio=(
            num_blocks / plan.cap.num_blocks
            if plan is not None and num_blocks is not None and plan.cap.num_blocks
            else None
        ),
    )


def engine_views(
    history: History, window_seconds: float, deployment: Resolved, plan: Plan | None
) -> tuple[EngineView, ...]:
    """exporter/snapshot.py's at ea148d5 (the last version that calls this file's
    engine_view): the recent observations gathered as a list each poll."""
    latest, good = history.latest, history.last_good()
    if latest is None or good is None or good.page is None:
        return ()
    stale = latest.page is None
    start = history.at_or_after(latest.time - window_seconds)
    max_model_len = deployment.int_("max_model_len") or (plan.max_model_len if plan else None)
    since = latest.time - RISK_HISTORY_SECONDS
    recent = history.recent(since)
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
            points=history.points(raw.engine, since),
        )
        for raw in good.page.engines
    )


# Rendering (exporter/metrics.py at 1ae06a7).


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
        # no label value leaves the sidecar longer than the parser keeps its own.
        if any(len(v) > MAX_LABEL_VALUE_LENGTH for v in values):
            self.cut += sum(len(v) > MAX_LABEL_VALUE_LENGTH for v in values)
            values = tuple(cut_label(v) for v in values)
        self._samples.setdefault(name, []).append((values, float(value)))

    def families(self) -> Iterator[Metric]:
        """As prometheus_client metric families (for tests that compare renderings)."""
        for spec, samples in self._ordered():
            cls = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
            family = cls(spec.full, spec.help, labels=spec.labels)
            for labels, value in samples:
                family.add_metric(list(labels), value)
            yield family

    def _ordered(self) -> Iterator[tuple[Spec, list[tuple[tuple[str, ...], float]]]]:
        for spec in METRICS:
            samples = self._samples.get(spec.name)
            if samples:
                yield spec, samples

    def text(self) -> str:
        """The text exposition, byte for byte what prometheus_client's generate_latest
        writes for these families, without its per-sample validation (our names and label
        names are fixed above; label values are escaped here)."""
        out: list[str] = []
        for spec, samples in self._ordered():
            out.append(_header(spec))
            for labels, value in samples:
                prefix = _PREFIX_CACHE.get((spec.name, labels))
                if prefix is None:
                    prefix = _sample_prefix(spec, labels)
                out.append(f"{prefix} {floatToGoString(value)}\n")
        return "".join(out)


def _header(spec: Spec) -> str:
    name = _sample_name(spec)
    help_text = spec.help.replace("\\", "\\\\").replace("\n", "\\n")
    return f"# HELP {name} {help_text}\n# TYPE {name} {spec.kind}\n"
