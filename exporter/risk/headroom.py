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

What it leaves out: a larger batch makes each step slower (more KV to read), so requests
live longer and the occupancy grows a little faster than ``m``; and prefill compute
(``max_num_batched_tokens``) can bind before either — the benchmark
(``benchmarks/load_headroom.py``) measures how far that takes the ratio from the truth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from exporter.risk.model import LEVEL_SECONDS, QUEUE_SECONDS, Z_HALF, Inputs, Risk, capped_touch

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


def load_headroom(risk: Risk, inputs: Inputs) -> LoadHeadroom | None:
    """The traffic multiple the engine holds, from the risk model's forecast and the
    batch; None without traffic to scale (nothing running, waiting or held)."""
    points, capacity_tokens, max_num_seqs = (
        inputs.points,
        inputs.capacity_tokens,
        inputs.max_num_seqs,
    )
    if not points or capacity_tokens <= 0:
        return None
    last = points[-1]
    pts = [p for p in points if p.epoch == last.epoch]
    level = [p.running for p in pts if p.t >= last.t - LEVEL_SECONDS]
    queue = [p.waiting for p in pts if p.t >= last.t - QUEUE_SECONDS]
    demand = sum(level) / len(level) + sum(queue) / len(queue)
    if risk.level_tokens <= 0 and demand <= 0:
        return None
    kv = kv_multiple(risk.level_tokens, risk.spread_tokens, capacity_tokens)
    if ceiling_fits(inputs):
        kv = math.inf
    seqs = max_num_seqs / demand if max_num_seqs and demand > 0 else None
    if seqs is not None and seqs < kv:
        return LoadHeadroom(seqs, "max_num_seqs", kv, seqs)
    if math.isinf(kv):
        return None
    return LoadHeadroom(kv, "kv_cache", kv, seqs)
