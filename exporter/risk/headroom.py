"""Load headroom: by what factor today's traffic could grow before vLLM would be expected
to preempt, or before the batch fills ``max_num_seqs``. Pure.

The risk model's arithmetic, solved for the arrival rate. The model forecasts the KV
occupancy level ``F`` (the mean, its trend, the level today's mix settles at, the queue
as fast as it is admitted) and its spread ``S``, and puts the alert where ``F + Z_HALF·S``
reaches the capacity ``C``. For requests arriving at random the occupancy is a sum over
the requests in flight: scaling the arrival rate by ``m`` scales its mean by ``m`` and its
variance by ``m`` (Poisson arrivals: an M/G/∞ system), so the spread by ``√m``. The
multiple at which the forecast reaches the alert point solves

    m·F + Z_HALF·S·√m = C    →    √m = (−Z·S + √(Z²S² + 4·F·C)) / (2·F)

A ``max_num_seqs`` whose full batch fits the cache (at the sequences' final lengths, with
``Z_HALF`` spreads to spare) caps the occupancy, as in the risk model: then no multiple
fills the cache. Sequences: the batch scales the same way (Little's law: running =
arrival rate × time in the engine), so ``max_num_seqs ÷ (running + waiting)`` is the
multiple at which the batch is full and requests start to queue for a slot. The smaller
of the two is the ratio; its resource is the one that binds first. Above 1 there is room
(2 = twice today's traffic fits); at 1 the preemption risk crosses its alert line (or
the batch is full); below 1 the traffic already exceeds what the pod holds.

Slower steps: a busier engine steps more slowly, so requests live longer and the
occupancy grows faster than the arrival rate. With the deployment's step times
(``exporter.capacity.steptime``: a step reads the weights and every token of context it
attends to, and computes the prompt tokens scheduled into it), two shares of today's
step are known. The KV read's share ``s`` of a decode step grows with the occupancy;
the rate multiple that grows the occupancy ``g``-fold is ``g ÷ (1 − s + s·g)``
(``rate_for_growth``). Prefill's share ``u`` of the engine's time (prompt tokens computed
per second, those the prefix cache served left out, × the time a prompt token takes)
grows with the rate itself: steps stretch by ``(1 − u) ÷ (1 − m·u)``, and the same
Little's-law algebra gives the rate multiple for an occupancy growth ``A`` (already
slowed by ``s``) as ``A ÷ (1 − u + u·A)`` — never above ``1 ÷ u``, where prefill alone
would keep the GPU busy. Both apply to the batch as they do to the cache. Without step
times the growth is taken as linear. The benchmark (``benchmarks/load_headroom.py``)
measures how far the ratio lands from the truth found by replay.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from exporter.capacity.steptime import StepTimes
from exporter.risk.model import (
    LEVEL_SECONDS,
    QUEUE_SECONDS,
    Z_HALF,
    Inputs,
    Risk,
    capped_touch,
    current_epoch,
    since,
)

RESOURCES = ("kv_cache", "max_num_seqs")
_NORMAL = NormalDist()


@dataclass(frozen=True)
class LoadHeadroom:
    ratio: float  # the smaller of the two multiples
    resource: str  # the one that binds first: kv_cache or max_num_seqs
    kv_ratio: float
    seqs_ratio: float | None  # None without a known max_num_seqs


def kv_multiple(level: float, spread: float, capacity: float, z: float = Z_HALF) -> float:
    """The ``m`` at which ``m·level + z·spread·√m`` reaches ``capacity`` (+Inf at no load)."""
    if level <= 0:
        return math.inf if spread <= 0 else (capacity / (z * spread)) ** 2
    b = z * spread
    root = (-b + math.sqrt(b * b + 4 * level * capacity)) / (2 * level)
    return root * root


def ceiling_fits(inputs: Inputs) -> bool:
    """``max_num_seqs`` sequences at the lengths residents of a full cap hold fit the cache
    with ``Z_HALF`` spreads to spare: then no multiple of the traffic can fill the cache,
    and only the batch limits it. The occupancy a full cap runs at, not the bound the
    risk model caps its score with (its residents all at their final lengths at once)."""
    touch = capped_touch(inputs, 1.0, final=False)
    return touch is not None and touch <= 1.0 - _NORMAL.cdf(Z_HALF)


def kv_read_share(level_tokens: float, steps: StepTimes) -> float:
    """The share of a decode step spent reading the KV cache at an occupancy of
    ``level_tokens``: what grows with the occupancy."""
    kv = max(0.0, level_tokens) * steps.per_kv_token_s
    total = kv + steps.base_s
    return kv / total if total > 0 else 0.0


def prefill_share(prompt_tokens_per_s: float, steps: StepTimes) -> float:
    """The share of the engine's time spent computing prompts: prompt tokens computed per
    second × the time one takes (at most 1: a GPU busy with prefill all the time)."""
    return min(1.0, max(0.0, prompt_tokens_per_s) * steps.per_prefill_token_s)


def rate_for_growth(growth: float, share: float) -> float:
    """The arrival-rate multiple at which the occupancy (and the batch) grows ``growth``
    times, when ``share`` of today's step time grows in proportion.

    Little's law: occupancy = rate × token-steps per request × step time, and the step
    time is ``(1 − share) + share × growth`` times today's. So ``growth = m × (1 − share
    + share × growth)``, and ``m = growth ÷ (1 − share + share × growth)``. The same form
    turns an occupancy growth into a rate when ``share`` is prefill's share of the time."""
    if math.isinf(growth):
        return math.inf if share <= 0 else 1.0 / share
    return growth / (1.0 - share + share * growth)


def load_headroom(
    risk: Risk,
    inputs: Inputs,
    *,
    steps: StepTimes | None = None,
    prefix_hit_ratio: float = 0.0,
) -> LoadHeadroom | None:
    """The traffic multiple the engine holds, from the risk model's forecast and the
    batch; None without traffic to scale (nothing running, waiting or held). With the
    deployment's step times (per GPU), a busier engine's slower steps are counted: the
    prompt tokens it computed over the level's window, less the share the prefix cache
    served (``prefix_hit_ratio``), give prefill's share of its time."""
    points, capacity_tokens, max_num_seqs = (
        inputs.points,
        inputs.capacity_tokens,
        inputs.max_num_seqs,
    )
    if not points or capacity_tokens <= 0:
        return None
    last = points[-1]
    pts = current_epoch(points)
    window = pts[since(pts, last.t - LEVEL_SECONDS) :]
    level = [p.running for p in window]
    queue = [p.waiting for p in pts[since(pts, last.t - QUEUE_SECONDS) :]]
    demand = sum(level) / len(level) + sum(queue) / len(queue)
    if risk.level_tokens <= 0 and demand <= 0:
        return None
    kv_share = prefill = 0.0
    if steps is not None:
        kv_share = kv_read_share(risk.level_tokens, steps)
        first = window[0]
        if last.prompt is not None and first.prompt is not None and last.t > first.t:
            computed = (last.prompt - first.prompt) * (1.0 - min(1.0, max(0.0, prefix_hit_ratio)))
            prefill = prefill_share(computed / (last.t - first.t), steps)

    def rate(growth: float) -> float:
        slowed = rate_for_growth(growth, kv_share)
        # Prefill's share only ever lowers the multiple. Below 1 (the traffic is already
        # over) it would lift it towards 1, all the way at a GPU busy with prefill all
        # the time, and "over" would read as "just full".
        return min(slowed, rate_for_growth(slowed, prefill))

    kv = rate(kv_multiple(risk.level_tokens, risk.spread_tokens, capacity_tokens))
    if ceiling_fits(inputs):
        kv = math.inf
    seqs = rate(max_num_seqs / demand) if max_num_seqs and demand > 0 else None
    if seqs is not None and seqs < kv:
        return LoadHeadroom(seqs, "max_num_seqs", kv, seqs)
    if math.isinf(kv):
        return None
    return LoadHeadroom(kv, "kv_cache", kv, seqs)
