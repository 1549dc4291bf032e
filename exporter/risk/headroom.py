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

Slower steps: a larger batch makes each decode step slower (it reads more KV), so requests
live longer and the occupancy grows faster than the arrival rate. Decode is memory-bound:
a step reads the weights once and each token of context once, so with the deployment's
KV bytes per token and weights the share of a step spent on KV is known, and the rate
multiple that grows the occupancy ``g``-fold is ``g ÷ (1 − share + share·g)``
(``rate_for_growth``); without them the growth is taken as linear. What it leaves out:
prefill compute (``max_num_batched_tokens``), which can bind before either — the benchmark
(``benchmarks/load_headroom.py``) measures how far that takes the ratio from the truth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

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
    """``max_num_seqs`` sequences at their final length fit the cache with ``Z_HALF``
    spreads to spare: then no multiple of the traffic can fill the cache (the risk
    model's cap), and only the batch limits it."""
    touch = capped_touch(inputs, 1.0)
    return touch is not None and touch <= 1.0 - _NORMAL.cdf(Z_HALF)


def kv_read_share(level_tokens: float, kv_bytes_per_token: float, weights_bytes: float) -> float:
    """The share of a decode step spent reading the KV cache: decode is memory-bound and
    each step reads the weights once and every token of context once."""
    kv = max(0.0, level_tokens) * kv_bytes_per_token
    total = kv + max(0.0, weights_bytes)
    return kv / total if total > 0 else 0.0


def rate_for_growth(growth: float, share: float) -> float:
    """The arrival-rate multiple at which the occupancy (and the batch) grows ``growth``
    times, when a step spends ``share`` of its time reading the KV cache.

    Little's law: occupancy = rate × token-steps per request × step time, and the step
    time is ``(1 − share) + share × growth`` times today's (the weights cost the same,
    the KV read grows with the occupancy). So ``growth = m × (1 − share + share ×
    growth)``, and ``m = growth ÷ (1 − share + share × growth)``."""
    if math.isinf(growth):
        return math.inf if share <= 0 else 1.0 / share
    return growth / (1.0 - share + share * growth)


def load_headroom(
    risk: Risk,
    inputs: Inputs,
    *,
    kv_bytes_per_token: float | None = None,
    weights_bytes: float | None = None,
) -> LoadHeadroom | None:
    """The traffic multiple the engine holds, from the risk model's forecast and the
    batch; None without traffic to scale (nothing running, waiting or held). With the
    deployment's KV bytes per token and weights (per GPU), a larger batch's slower steps
    are counted (``rate_for_growth``)."""
    points, capacity_tokens, max_num_seqs = (
        inputs.points,
        inputs.capacity_tokens,
        inputs.max_num_seqs,
    )
    if not points or capacity_tokens <= 0:
        return None
    last = points[-1]
    pts = current_epoch(points)
    level = [p.running for p in pts[since(pts, last.t - LEVEL_SECONDS) :]]
    queue = [p.waiting for p in pts[since(pts, last.t - QUEUE_SECONDS) :]]
    demand = sum(level) / len(level) + sum(queue) / len(queue)
    if risk.level_tokens <= 0 and demand <= 0:
        return None
    share = 0.0
    if kv_bytes_per_token and weights_bytes:
        share = kv_read_share(risk.level_tokens, kv_bytes_per_token, weights_bytes)
    kv = rate_for_growth(kv_multiple(risk.level_tokens, risk.spread_tokens, capacity_tokens), share)
    if ceiling_fits(inputs):
        kv = math.inf
    seqs = rate_for_growth(max_num_seqs / demand, share) if max_num_seqs and demand > 0 else None
    if seqs is not None and seqs < kv:
        return LoadHeadroom(seqs, "max_num_seqs", kv, seqs)
    if math.isinf(kv):
        return None
    return LoadHeadroom(kv, "kv_cache", kv, seqs)
