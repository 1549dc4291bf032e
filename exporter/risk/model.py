"""Why vLLM is about to preempt, from a short history of what it reports. Pure.

vLLM admits a request when its whole sequence fits and then grows it one token per
decode step; it preempts when a running sequence needs a block and none is free — when
the KV occupancy touches 100 %. Occupancy is a sum over the running requests, each
holding its prompt plus what it has generated so far; requests come and go, so it
fluctuates around a level set by the load. The model forecasts that level and that
fluctuation, and asks how likely the occupancy is to touch the top within the horizon:

* **level** — the mean occupancy over the last two minutes, plus its trend over the last
  five (least-squares slopes: the smaller of the five minutes' and their last half's,
  so that traffic that stepped up and then held is no ramp) carried ``HORIZON`` seconds
  ahead when it is rising. Both follow the load that is still arriving (Little's law:
  occupancy = arrival rate × token-seconds per request): when requests have arrived more
  slowly over the last minute than the ones that made the level finished, level and
  trend fall by that ratio (the level to no less than what is resident now) — a burst
  that has drained leaves no level behind; at least the level today's traffic mix
  settles at (Little's law: the level scaled by the token-steps per request of the last
  three minutes' requests over the window's); plus the **queue as fast as it can be
  admitted**: waiting requests (smoothed, never more than wait now) raise the occupancy
  only while the engine admits them faster than it finishes requests (resident requests
  = running × admitted ÷ finished over the last minute, at most running + waiting and
  ``max_num_seqs``). A queue held back by prefill compute or by ``max_num_seqs`` is
  admitted as fast as requests leave and adds nothing: it
  is not KV pressure (``bottleneck.py`` says what it is instead);
* **spread** — not the noisy spread of a few polls but the one the traffic implies: for
  requests arriving at random (an M/G/∞ system) the occupancy's variance is its mean
  times ``E[∫size²]/E[∫size]`` over a request's life, from the prompt- and
  generation-length histograms (a request of prompt P growing G tokens: ``(G·P² + P·G² +
  G³/3) / (G·P + G²/2)``), times n for parallel samples that come and go together —
  less while a queue that has stood ``PACED_SECONDS`` waits for prefill compute: then
  tokens enter the cache at the engine's pace, not at random, and only the decode
  lengths' spread moves the occupancy (``paced_factor``); or the
  observed spread around the last half's trend when that is wider (near saturation
  steps slow down and the swings grow), scaled like the level when the load that made
  those swings is leaving (variance goes with the arrival rate), or with the requests
  resident when they have fallen (the requests that made the swings have left);
* **score** — ``z = (capacity − level) / spread`` headroom in spreads; the score is
  logistic in z, 0.5 at ``Z_HALF`` spreads (calibrated on the simulator's scenario
  library by ``benchmarks/alert_quality.py``: a ranking score, not a probability) — or
  lower, where the engine's own last hour showed its occupancy climbing less far above
  forecasts near the top (``risk/calibration.py``: the worst such climb plus a spread);
* **ceiling** — with ``max_num_seqs`` known, occupancy cannot exceed ``max_num_seqs``
  resident sequences at their final length (a resident's generation length weighted by
  itself: it holds its slot for its decode steps), whose sum is about normal; a
  deployment whose ceiling fits the cache cannot preempt whatever its usage (the server
  that runs full: the score is capped by the chance that ceiling touches the top in any
  of the horizon's ``HORIZON ÷ request duration`` fresh draws, the duration from Little's
  law), or, where higher, by the chance that the residents in hand reach it: what they
  hold now plus their remaining generation, and the empty slots at the ceiling's draw
  (a burst of long prompts can hold more than the mix's ceiling allows);
* **the batch in hand** — the running sequences' expected remaining growth (the mean
  residual of the generation length) against the free tokens, for sudden bursts the
  level has not caught up with yet.

``preemption_risk`` is the larger of the score and the batch term; ``overcommit_ratio``
the batch's committed growth over the free tokens; ``seconds_to_exhaustion`` when the
same forecast crosses the top (from the occupancy now to the forecast level at the
horizon, then along the trend; +Inf when it never does: "not on this trend");
``forecast_usage`` the forecast level over the capacity, the gauge of the ticket-level
"running at the edge" signal (``EDGE_THRESHOLD``). A vLLM restart
(a new epoch) starts the history afresh and a trend needs two minutes of it; an idle
server has no risk.

**From the first poll** the model has an opinion: with no finished request to measure,
priors stand in — a waiting request is the size of a running one, the running sequences
will generate as much again as they have so far (the age prior: with nothing finished,
a sequence's remaining length is best guessed by its age), and the spread is that of
requests of that size. ``Risk.history_seconds`` says how much history the figure rests on
(the trend needs ``TREND_MIN_SECONDS``); a cold server bursting gets a high risk at once
rather than a confident 0. Prefix caching needs nothing special: vLLM counts cached blocks that
no request holds as free (they are evicted on demand), and so does its usage gauge.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter, mul, sub
from statistics import NormalDist

from exporter.capacity.histogram import Histogram

LEVEL_SECONDS = 120.0  # the occupancy level is its mean over this long
TREND_SECONDS = 300.0  # its trend is fitted over this long
RATE_SECONDS = 60.0  # admission and finish rates are counted over this long
QUEUE_SECONDS = 30.0  # the waiting queue is its mean over this long
# Admission is paced by the step's token budget only for a queue that has stood at every
# poll this long: a few requests caught between two steps are random arrivals still, and
# pacing them halved the score for one poll (0.97 → 0.47 on the demo's ramp, resetting
# the alerts' 15 s; the Prometheus check of stop 46's CI). Five 2 s polls, as long as
# bottleneck.py's preemption window.
PACED_SECONDS = 10.0
# Arrivals are counted over this long to tell a load that is leaving: over 30 s their
# count is noisy enough to dip the level of a load that is still rising (measured: the
# daily-ramp runs' alerts broke off and the median lead fell from +49 to +36 s).
ARRIVALS_SECONDS = 60.0
HORIZON = 180.0  # how far ahead the risk looks
# A trend needs this much history: a cache filling from empty after a (re)start is not
# a trend to project, and the Little's-law level covers that time.
TREND_MIN_SECONDS = 120.0
Z_HALF = 4.5  # spreads of headroom at which the score is 0.5
# The two operating points rules/ ships, chosen on the frontier by their worst traffic
# family (benchmarks/fuzz_frontier.py --families, docs/risk-model.md): the page fires
# where the score is above ALERT_THRESHOLD while vLLM's own usage was above ALERT_USAGE at
# some sample of the last ALERT_USAGE_WINDOW_SECONDS, for ALERT_FOR_SECONDS (about a
# false-alarm minute per safe hour in every family: 0.0-0.9 on one draw of the fuzz tier,
# up to 1.85 on the next). The gate reads the window's peak because a real vLLM's cache
# empties by a batch's worth whenever requests finish, every 10-20 s under steady load: a
# gate read sample by sample reset the page's 15 s there and it never fired
# (tests/e2e/test_stack.py, stop 40's CI). The warning, which never pages, fires where the
# score is above WARNING_THRESHOLD while the usage was above WARNING_USAGE at some sample of
# the last WARNING_USAGE_WINDOW_SECONDS, or the score is above WARNING_CERTAIN, for
# WARNING_FOR_SECONDS: the frontier's written choice (the gate) with a way around it where
# the score is near certain, because on real vLLM's steep ramps and its cold start the
# cache passes the gate only seconds before vLLM preempts (docs/risk-model.md, stop 46).
# Ungated, the same score paged 4-10 false-alarm minutes per safe fuzz hour.
ALERT_THRESHOLD = 0.99
ALERT_USAGE = 0.8
ALERT_USAGE_WINDOW_SECONDS = 60.0
ALERT_FOR_SECONDS = 15.0
WARNING_THRESHOLD = 0.5
WARNING_USAGE = 0.7
WARNING_USAGE_WINDOW_SECONDS = 30.0
WARNING_CERTAIN = 0.999
WARNING_FOR_SECONDS = 15.0
# The score's midpoint: Z_HALF spreads of headroom (what the load headroom and the judged
# past are measured against).
RISK_HALF = 0.5
STEEPNESS = 2.0  # how fast the score rises as the headroom closes
# The bar where an engine's past lowers it: the worst climb over a forecast near the top
# it showed in the last hour plus this many spreads (risk/calibration.py); fixed before
# the fuzz tier ran.
EXCURSION_MARGIN = 1.0
# The ticket, not the page (rules/ uses the same): the forecast occupancy above this share
# of the cache for this long — a server that runs near full without a forecast overflow.
# Set before the fuzz tier measured it: 90 % is where vLLM's own advice to add memory
# starts to matter, and ten minutes is twice the page's horizon-plus-hold, long enough
# that a burst passing through is not a ticket.
EDGE_THRESHOLD = 0.9
EDGE_FOR_SECONDS = 600.0
_NORMAL = NormalDist()


@dataclass(frozen=True)
class Point:
    """One poll of one engine, as the risk model needs it."""

    t: float
    usage: float  # vLLM's kv_cache_usage_perc, 0-1
    running: float
    waiting: float
    finished: float  # requests finished since the sidecar started (never decreases)
    generated: float  # generation tokens since the sidecar started (never decreases)
    epoch: int  # changes when vLLM restarts: history does not span it
    prompt: float | None = None  # prompt tokens prefilled since the sidecar started
    preemptions: float | None = None  # preemptions since the sidecar started


@dataclass(frozen=True)
class Inputs:
    points: Sequence[Point]  # oldest first (times never decrease: windows are found by bisection)
    capacity_tokens: float  # usable blocks × block size
    block_size: int
    max_num_seqs: int | None
    prompt: Histogram | None  # lengths of recently finished requests
    generation: Histogram | None
    sequences_per_request: float = 1.0  # mean n: parallel samples arrive together
    recent_prompt: Histogram | None = None  # the same, over the last few minutes only
    recent_generation: Histogram | None = None
    # What keeps the queue waiting (risk/bottleneck.py): with no admission rate measured
    # yet, a queue held back by compute or max_num_seqs is not counted as KV to come.
    bottleneck: str | None = None
    # The highest this engine's occupancy climbed above the model's own forecasts near the
    # top within a horizon over the last hour (spreads, risk/calibration.py); None: too
    # little judged.
    excursion: float | None = None


@dataclass(frozen=True)
class Risk:
    level_tokens: float  # forecast occupancy level at the horizon
    spread_tokens: float  # its standard deviation
    free_tokens: float
    committed_tokens: float  # expected remaining growth of the running sequences
    overcommit_ratio: float
    seconds_to_exhaustion: float
    preemption_risk: float
    history_seconds: float = 0.0  # how much of this epoch's history the figures rest on
    forecast_usage: float = 0.0  # the forecast level over the capacity (the ticket's gauge)


IDLE = Risk(0.0, 0.0, 0.0, 0.0, 0.0, math.inf, 0.0)

Moments = tuple[float, float, float]  # E[X], E[X²], E[X³] of a length distribution


@functools.lru_cache(maxsize=64)
def _midpoints(bounds: tuple[float, ...]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Where ``_moments`` puts each bucket's observations, and their cubes. A release's
    histograms have a handful of bucket layouts that never change: worked out once."""
    xs: list[float] = []
    lower = 0.0
    for bound in (*bounds, math.inf):
        xs.append(lower if math.isinf(bound) else (lower + bound) / 2)
        if not math.isinf(bound):
            lower = bound
    return tuple(xs), tuple(x**3 for x in xs)


def _moments(h: Histogram | None) -> Moments | None:
    """E[X], E[X²], E[X³] with each bucket's observations at its midpoint (the +Inf
    bucket at its lower bound)."""
    if h is None or h.count <= 0:
        return None
    xs, cubes = _midpoints(h.bounds)
    m1 = m2 = m3 = prev = 0.0
    for x, cube, cum in zip(xs, cubes, h.counts, strict=True):
        n = cum - prev
        prev = cum
        m1 += n * x
        m2 += n * x * x
        m3 += n * cube
    return m1 / h.count, m2 / h.count, m3 / h.count


def dispersion(prompt: Histogram | None, generation: Histogram | None) -> float | None:
    """Variance over mean of the occupancy, in tokens (see the module docstring)."""
    return _dispersion(_moments(prompt), _moments(generation))


def _dispersion(p: Moments | None, g: Moments | None) -> float | None:
    if p is None or g is None:
        return None
    p1, p2, _ = p
    g1, g2, g3 = g
    denominator = g1 * p1 + g2 / 2
    if denominator <= 0:
        return None
    return (g1 * p2 + p1 * g2 + g3 / 3) / denominator


def paced_factor(generation: Histogram | None) -> float:
    """How much of the M/G/∞ variance is left when prefill compute paces admission.

    With random arrivals the occupancy's variance is ``λ·E[P²]·∫S`` (``S`` the survival
    function of a request's residence ``D``): the number of arrivals in a window is random
    (``∫S²``) and so is who of them is still resident (``∫S(1−S)``). When requests wait for
    the step's token budget, tokens enter the cache at a fixed rate however long the
    prompts are, and only the second part remains: the factor is
    ``1 − E[min(D, D′)] ÷ E[D]`` — 1/2 for exponential residences, 0 for equal ones.
    Every running request decodes a token a step, so ``D`` goes with the generation length
    (its CDF linear within each bucket, the +Inf bucket at its lower bound, as
    ``_moments`` places them). 1 with nothing measured."""
    if generation is None or generation.count <= 0:
        return 1.0
    lower, s_before = 0.0, 1.0
    mean = min_mean = 0.0  # ∫S and ∫S² over the finite buckets
    for bound, cum in zip(generation.bounds, generation.counts, strict=False):
        s = 1.0 - cum / generation.count
        width = bound - lower
        mean += width * (s_before + s) / 2
        min_mean += width * (s_before * s_before + s_before * s + s * s) / 3
        lower, s_before = bound, s
    return 1.0 - min_mean / mean if mean > 0 else 1.0


def residual_generation(generation: Histogram | None) -> float | None:
    """Mean remaining generation of a sequence caught mid-run: E[G²] / 2E[G]."""
    return _residual_generation(_moments(generation))


def _residual_generation(g: Moments | None) -> float | None:
    if g is None or g[0] <= 0:
        return None
    return g[1] / (2 * g[0])


def _fit(ts: Sequence[float], ys: Sequence[float]) -> tuple[float, float, list[float]]:
    """The least-squares slope of ``ys`` over ``ts``, the mean of ``ys``, and ``ts`` less
    their mean (for residuals). Two passes around the means, not running sums of t² and t·y:
    with Unix times (~1.8e9 s) those cancel catastrophically, and a flat history must
    give a slope of exactly 0, not 1e-12 (a finite time to exhaustion)."""
    n = len(ts)
    mt, my = sum(ts) / n, sum(ys) / n
    # map() over operator functions, not generators or list comprehensions: the same
    # values added in the same order, with no Python frame per point.
    dt = list(map(sub, ts, repeat(mt, n)))
    var = sum(map(mul, dt, dt))
    if var <= 0:
        return 0.0, my, dt
    return sum(map(mul, dt, map(sub, ys, repeat(my, n)))) / var, my, dt


_TIME = attrgetter("t")
_USAGE: Callable[[Point], float] = attrgetter("usage")
_RUNNING: Callable[[Point], float] = attrgetter("running")
_WAITING: Callable[[Point], float] = attrgetter("waiting")


def since(pts: Sequence[Point], t: float) -> int:
    """The index of the first point at or after ``t`` (points are oldest first)."""
    return bisect_left(pts, t, key=_TIME)


def capped_touch(inputs: Inputs, draws: float, *, final: bool = True) -> float | None:
    """P(touching the top) when ``max_num_seqs`` resident sequences are the most the cache
    can hold: their sum is about normal (the prompt's mean exact from its histogram's sum,
    the rest from buckets). ``final``: the residents at their final lengths, the bound the
    risk model caps its score with; else at their lengths now, the occupancy a full cap
    runs at, which is what more traffic would bring (``risk/headroom.py``)."""
    p, g = _moments(inputs.prompt), _moments(inputs.generation)
    return _capped_touch(inputs, p, g, draws, final=final)


def _capped_touch(
    inputs: Inputs, p: Moments | None, g: Moments | None, draws: float, *, final: bool = True
) -> float | None:
    if not inputs.max_num_seqs or p is None or g is None:
        return None
    m = inputs.max_num_seqs
    mean, var = _resident(inputs, p, g, final=final)
    once = _reaches(inputs.capacity_tokens, m * mean, math.sqrt(m * var))
    return float(1.0 - (1.0 - once) ** draws)


def _resident_generation(inputs: Inputs, g: Moments, *, final: bool) -> tuple[float, float]:
    """A resident's generation length, E[·] and E[·²]: at its end (``final``), or so far.

    The sequences resident under a full cap are not a finished request's draw: each holds
    its slot for its decode steps, so a resident's generation length is weighted by itself
    (the inspection paradox): E[G²]/E[G] in mean, E[G³]/E[G] − that² in variance, twice a
    finished request's for exponential lengths. Now, a resident is a uniform share of the
    way through its decode: half that mean, E[G³]/(3 E[G]) in second moment (a finished
    request's own mean, if exponential) — and what it has still to generate has the same
    law (the residual life)."""
    if g[0] > 0:
        if final:
            return g[1] / g[0], g[2] / g[0]
        return g[1] / (2 * g[0]), g[2] / (3 * g[0])
    assert inputs.generation is not None
    generation_mean = inputs.generation.sum / inputs.generation.count
    return generation_mean, generation_mean**2


def _resident(inputs: Inputs, p: Moments, g: Moments, *, final: bool) -> tuple[float, float]:
    """What one resident holds, mean and variance: its prompt (the mean exact from the
    histogram's sum, independent of G) and its generation (``_resident_generation``)."""
    assert inputs.prompt is not None
    prompt_mean = inputs.prompt.sum / inputs.prompt.count
    grown, second = _resident_generation(inputs, g, final=final)
    return prompt_mean + grown, max(0.0, p[1] - p[0] ** 2) + max(0.0, second - grown**2)


def _reaches(capacity: float, total: float, sd: float) -> float:
    """P(a normal of mean ``total`` and deviation ``sd`` reaches ``capacity``)."""
    if sd <= 0:
        return 1.0 if total >= capacity else 0.0
    return float(1.0 - _NORMAL.cdf((capacity - total) / sd))


def _held_touch(
    inputs: Inputs, p: Moments | None, g: Moments | None, used: float, running: float
) -> float | None:
    """P(the residents in hand, at their final lengths, and the empty slots filled at the
    ceiling's per-slot draw, reach the top): the ceiling conditioned on now."""
    if not inputs.max_num_seqs or p is None or g is None or g[0] <= 0:
        return None
    m = inputs.max_num_seqs
    held = min(float(m), max(0.0, running))
    rest, rest_second = _resident_generation(inputs, g, final=False)
    slot, slot_var = _resident(inputs, p, g, final=True)
    empty = m - held
    total = used + held * rest + empty * slot
    sd = math.sqrt(held * max(0.0, rest_second - rest**2) + empty * slot_var)
    return _reaches(inputs.capacity_tokens, total, sd)


def _token_steps(p: Moments | None, g: Moments | None) -> float | None:
    """Token-steps a request holds over its decode: ``G·P + G²/2`` in expectation (from
    the prompt and generation lengths' moments)."""
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
    recent = _token_steps(_moments(inputs.recent_prompt), _moments(inputs.recent_generation))
    window = _token_steps(_moments(inputs.prompt), _moments(inputs.generation))
    return _implied_level(level, recent, window)


def _implied_level(level: float, recent: float | None, window: float | None) -> float | None:
    if recent is None or window is None or window <= 0:
        return None
    return level * recent / window


def load_ratio(pts: Sequence[Point], recent: float, window: float) -> float:
    """Requests arriving per second over the last ``recent`` seconds against requests
    finishing per second over the last ``window`` — the throughput that held the
    occupancy there (1 when nothing finished: no rate to go by). Arrivals are the growth
    of finished + running + waiting, which preemption does not move."""
    last = pts[-1]
    a, f = pts[since(pts, last.t - recent)], pts[since(pts, last.t - window)]
    if last.t - a.t <= 0 or last.t - f.t <= 0 or last.finished <= f.finished:
        return 1.0
    arrived = last.finished + last.running + last.waiting - (a.finished + a.running + a.waiting)
    return max(0.0, arrived) / (last.t - a.t) / ((last.finished - f.finished) / (last.t - f.t))


def _mean(h: Histogram | None) -> float | None:
    return h.sum / h.count if h is not None and h.count > 0 else None


def queued_throughout(pts: Sequence[Point], seconds: float) -> bool:
    """Whether requests waited at every poll of the last ``seconds`` (the first poll at or
    before the window's start included, so that a history shorter than it does not count)."""
    last = pts[-1]
    start = max(0, since(pts, last.t - seconds) - 1)
    return last.t - pts[start].t >= seconds and all(p.waiting > 0 for p in pts[start:])


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
    recent = list(map(_WAITING, pts[since(pts, last.t - QUEUE_SECONDS) :]))
    # Smoothed, but never more than waits now: a queue that has drained adds nothing.
    waiting = min(sum(recent) / len(recent), last.waiting)
    if waiting <= 0 or per_request <= 0:
        return 0.0
    target = last.running + waiting
    if max_num_seqs:
        target = min(target, float(max_num_seqs))
    window = pts[since(pts, last.t - RATE_SECONDS) :]
    first = window[0]
    finished = last.finished - first.finished
    if finished > 0 and first.prompt is not None and last.prompt is not None:
        admitted = (last.prompt - first.prompt) / prompt if prompt > 0 else 0.0
        running = sum(map(_RUNNING, window)) / len(window)
        target = min(target, running * max(admitted, 0.0) / finished)
    elif bottleneck in ("compute", "max_num_seqs"):
        # No rate yet, but the queue waits for the token budget or a batch slot, not for
        # blocks: it is admitted as requests leave (a prefill-bound burst on a fresh
        # server reads 60 waiting and a cache 15 % full, and never preempts).
        target = last.running
    return max(0.0, target - last.running) * per_request


def exhaustion_seconds(used: float, forecast: float, trend: float, capacity: float) -> float:
    """When the forecast crosses the top: the occupancy goes from ``used`` now to the
    forecast level at ``HORIZON`` (straight), and on along the trend after it. +Inf when
    it never does — the time and the score tell one story, from one forecast."""
    free = capacity - used
    if free <= 0:
        return 0.0
    if forecast >= capacity and forecast > used:
        return HORIZON * free / (forecast - used)
    if trend > 0:
        return HORIZON + (capacity - forecast) / trend
    return math.inf


def current_epoch(points: Sequence[Point]) -> Sequence[Point]:
    """The points since vLLM last restarted: all of them unless it restarted in the window
    (epochs only grow, so equal ends mean one epoch: no scan on every poll)."""
    if not points or points[0].epoch == points[-1].epoch:
        return points
    return [p for p in points if p.epoch == points[-1].epoch]


def usage_peak(points: Sequence[Point], window: float) -> float | None:
    """vLLM's usage at its highest over the polls of the last ``window`` seconds (left-open,
    as a range selector is): what each alert's gate reads. Exported by the sidecar from
    its own polls because a Prometheus scraping every 15 s sees four samples a minute and
    misses the peaks between them (a real vLLM's cache swings by a batch every 10-20 s)."""
    if not points:
        return None
    return max(map(_USAGE, points[bisect_right(points, points[-1].t - window, key=_TIME) :]))


def page_holds(risk: float, usage_peak: float | None) -> bool:
    """The page's expression at one evaluation, ``usage_peak`` the usage's highest over the
    last ALERT_USAGE_WINDOW_SECONDS (its ``max_over_time``), as rules/kv-headroom.rules.yml
    writes it: the benchmarks, the status page and the e2e checks all ask this function."""
    return risk > ALERT_THRESHOLD and usage_peak is not None and usage_peak > ALERT_USAGE


def warning_holds(risk: float, usage_peak: float | None) -> bool:
    """The warning's expression at one evaluation, ``usage_peak`` over the last
    WARNING_USAGE_WINDOW_SECONDS."""
    gated = risk > WARNING_THRESHOLD and usage_peak is not None and usage_peak > WARNING_USAGE
    return gated or risk > WARNING_CERTAIN


def assess(inputs: Inputs) -> Risk:
    if not inputs.points:
        return IDLE
    pts = current_epoch(inputs.points)
    last = pts[-1]
    history = last.t - pts[0].t
    if last.running <= 0 and last.waiting <= 0 and last.usage <= 0 and history < RATE_SECONDS:
        return dataclasses.replace(IDLE, history_seconds=history)
    capacity = inputs.capacity_tokens
    # Columns by map() over attribute getters: C loops, no Python frame per point.
    used = list(map(mul, map(_USAGE, pts), repeat(capacity)))
    ts = list(map(_TIME, pts))
    free = max(0.0, capacity - used[-1])
    # Priors for a server the model has not watched finish anything yet: a request the
    # size of what a running sequence holds now.
    held = used[-1] / last.running if last.running >= 1 else 0.0
    # Each histogram's moments, once: several terms below read them.
    prompt_m, generation_m = _moments(inputs.prompt), _moments(inputs.generation)

    def window(seconds: float) -> tuple[list[float], list[float]]:
        """The last ``seconds`` of times and occupancies (a bisection: times are ordered)."""
        i = bisect_left(ts, last.t - seconds)
        return ts[i:], used[i:]

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
    late, mu, dt_late = _fit(t_late, u_late)
    if len(t_late) <= 2:
        late = 0.0
    trend = 0.0
    if history >= TREND_MIN_SECONDS:
        # A rise is carried ahead only as far as requests still arrive to carry it: one
        # made by a burst that has stopped arriving is not a ramp.
        trend = min(_fit(t_trend, u_trend)[0], late) * slowing
    forecast = level + max(0.0, trend) * HORIZON
    implied = _implied_level(
        level,
        _token_steps(_moments(inputs.recent_prompt), _moments(inputs.recent_generation)),
        _token_steps(prompt_m, generation_m),
    )
    if implied is not None:
        # The level today's traffic mix settles at (Little's law) — ahead of the
        # occupancy when the mix just changed.
        forecast = max(forecast, implied)
    prompt_mean = _mean(inputs.recent_prompt) or _mean(inputs.prompt) or held
    generation_mean = _mean(inputs.recent_generation) or _mean(inputs.generation) or 0.0
    per_request = prompt_mean + generation_mean / 2
    queued = queued_tokens(pts, prompt_mean, per_request, inputs.max_num_seqs, inputs.bottleneck)

    # Little's law: mean duration = mean running / finish rate.
    trend_start = len(pts) - len(t_trend)  # the trend window's first point
    finished = pts[-1].finished - pts[trend_start].finished
    span = last.t - t_trend[0]
    running = list(map(_RUNNING, pts))
    running_mean = sum(running[trend_start:]) / len(t_trend)
    duration = running_mean * span / finished if finished > 0 else HORIZON
    draws = max(1.0, HORIZON / max(duration, 1.0))
    forecast += queued

    tte = exhaustion_seconds(used[-1], forecast, trend, capacity)

    ratio = _dispersion(prompt_m, generation_m)
    if ratio is None and held > 0:
        # No finished request to measure: sizes as varied as exponential ones around
        # what a running sequence holds (variance over mean = 2 × the mean).
        ratio = 2.0 * held
    # n samples of one request arrive, grow and finish together: n times the variance.
    ratio = ratio * max(1.0, inputs.sequences_per_request) if ratio else None
    if ratio and inputs.bottleneck == "compute" and queued_throughout(pts, PACED_SECONDS):
        # The queue waits for prefill compute: admitted at the engine's pace, not at random.
        ratio *= paced_factor(inputs.generation)
    theory = math.sqrt(max(forecast, 0.0) * ratio) if ratio else 0.0
    # Near saturation steps slow down as the KV read grows and the occupancy swings wider
    # than independent arrivals explain: take the observed spread around the trend when
    # it is the larger.
    # (Around the late window's means, which its fit above computed.)
    residuals = [u - (mu + late * d) for d, u in zip(dt_late, u_late, strict=True)]
    observed = math.sqrt(sum(map(mul, residuals, residuals)) / len(residuals))
    # Swings made by a load that is leaving shrink with it: the occupancy's variance goes
    # with the arrival rate (λ·E[∫size²] for random arrivals) — and with the requests
    # resident, which also fall when the arrivals go on but the requests that made the
    # swings (long ones, a burst) have left: then the swings' own crash, measured as a
    # swing, would raise the risk while the cache empties. The resident count is the
    # last QUEUE_SECONDS' mean against the late window's, and only ever scales down.
    late_running = running[len(pts) - len(t_late) :]
    now_running = running[since(pts, last.t - QUEUE_SECONDS) :]
    resident_late = sum(late_running) / len(late_running)
    resident_now = sum(now_running) / len(now_running)
    resident = min(1.0, resident_now / resident_late) if resident_late > 0 else 1.0
    observed *= math.sqrt(min(slowing, resident))
    spread = max(theory, observed)
    # The score: 0.5 where the forecast level sits Z_HALF spreads below the top, rising
    # logistically as it closes in (calibrated on the simulator's scenario library).
    if spread > 0:
        z = (capacity - forecast) / spread
        half = Z_HALF
        if inputs.excursion is not None:
            # The deployment's own past: bursts that peaked below the top lower the bar
            # to the worst climb above a forecast plus a spread, never above the prior.
            half = min(Z_HALF, inputs.excursion + EXCURSION_MARGIN)
        touch = 1.0 / (1.0 + math.exp(max(-50.0, min(50.0, STEEPNESS * (z - half)))))
    else:
        touch = 1.0 if forecast >= capacity else 0.0

    capped = _capped_touch(inputs, prompt_m, generation_m, draws)
    if capped is not None:
        held = _held_touch(inputs, prompt_m, generation_m, used[-1], last.running)
        if held is not None:
            capped = max(capped, held)
        # Admission control caps the occupancy: a cap inside the cache makes it safe.
        touch = min(touch, capped)

    remaining = _residual_generation(generation_m)
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
    usage_forecast = forecast / capacity if capacity > 0 else 0.0
    return Risk(forecast, spread, free, committed, overcommit, tte, risk, history, usage_forecast)
