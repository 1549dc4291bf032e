"""The risk model on hand-made histories: what it must say, and what it must not."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from exporter.capacity.histogram import Histogram
from exporter.risk.model import ALERT_THRESHOLD, IDLE, Inputs, Point, assess

BOUNDS = (100.0, 200.0, 1000.0, 2000.0)


def lengths(bucket: int, count: float = 100.0) -> Histogram:
    """``count`` requests, all in bucket ``bucket`` of BOUNDS (so at its midpoint)."""
    counts = tuple(count if i >= bucket else 0.0 for i in range(len(BOUNDS) + 1))
    lower = BOUNDS[bucket - 1] if bucket else 0.0
    return Histogram(BOUNDS, counts, count * (lower + BOUNDS[bucket]) / 2, count)


PROMPT = lengths(3)  # 1,500 tokens
GENERATION = lengths(1)  # 150 tokens


def history(
    seconds: float,
    usage: Callable[[float], float],
    running: Callable[[float], float],
    *,
    finish_rate: float = 2.0,
    epoch: Callable[[float], int] = lambda t: 0,
    step: float = 2.0,
) -> list[Point]:
    """A poll every ``step`` seconds; ~25 tokens per second per running sequence."""
    points = []
    for i in range(int(seconds / step) + 1):
        t = i * step
        points.append(Point(t, usage(t), running(t), 0.0, finish_rate * t, 25.0 * 40 * t, epoch(t)))
    return points


def inputs(points: list[Point], capacity: float = 84_000.0, max_num_seqs: int = 256) -> Inputs:
    return Inputs(
        points=points,
        capacity_tokens=capacity,
        block_size=16,
        max_num_seqs=max_num_seqs,
        prompt=PROMPT,
        generation=GENERATION,
        recent_prompt=PROMPT,
        recent_generation=GENERATION,
    )


def test_a_full_cache_that_admission_control_caps_is_not_at_risk() -> None:
    # 50 sequences of 1,500 + 150 tokens at most: 82,500 of 84,000 tokens. The cache
    # runs ~94 % full forever and vLLM never preempts.
    jitter = random.Random(1)
    points = history(300, lambda t: 0.9375 + jitter.uniform(-0.01, 0.01), lambda t: 50.0)
    risk = assess(inputs(points, max_num_seqs=50))
    assert risk.preemption_risk < 0.01
    assert risk.overcommit_ratio < 1.0


def test_fast_growth_is_a_risk() -> None:
    # From 30 % to 80 % in five minutes: at this rate the cache is full in two.
    points = history(300, lambda t: 0.3 + 0.5 * t / 300, lambda t: 20 + 60 * t / 300)
    assert assess(inputs(points)).preemption_risk > ALERT_THRESHOLD


def test_fast_growth_has_a_finite_time_to_exhaustion() -> None:
    points = history(300, lambda t: 0.3 + 0.5 * t / 300, lambda t: 20 + 60 * t / 300)
    # 20 % of the cache left, filling at 50 % per 300 s: 120 s.
    assert math.isclose(assess(inputs(points)).seconds_to_exhaustion, 120.0, rel_tol=0.02)


def test_a_flat_cache_never_exhausts() -> None:
    points = history(300, lambda t: 0.5, lambda t: 30.0)
    assert assess(inputs(points)).seconds_to_exhaustion == math.inf


def test_noise_around_a_steady_level_is_no_risk() -> None:
    # A 2 s poll on a busy server: ±15 % swings around half full.
    jitter = random.Random(2)
    points = history(300, lambda t: 0.5 + jitter.uniform(-0.15, 0.15), lambda t: 30.0)
    assert assess(inputs(points)).preemption_risk < ALERT_THRESHOLD / 2


def test_traffic_that_stepped_up_and_then_held_is_no_trend() -> None:
    # Idle, then half full from t=100 and steady since: steep over the five minutes, flat
    # over their last half. A step is not a ramp; projecting it would page on every
    # morning's first traffic (real vLLM, one client after an idle minute, did).
    jitter = random.Random(3)
    points = history(
        260,
        lambda t: 0.0 if t < 100 else 0.5 + jitter.uniform(-0.05, 0.05),
        lambda t: 0.0 if t < 100 else 25.0,
    )
    assert assess(inputs(points)).preemption_risk < ALERT_THRESHOLD


def test_a_ramp_that_keeps_rising_is_still_a_trend() -> None:
    # 10 % to 60 % over five minutes, rising in both halves: 80 % projected 180 s ahead.
    points = history(300, lambda t: 0.1 + 0.5 * t / 300, lambda t: 5 + 30 * t / 300)
    assert assess(inputs(points)).level_tokens > 84_000 * 0.75


def test_a_restart_does_not_spike() -> None:
    # Growing fast and 85 % full, then vLLM restarts at t=300 and fills from empty.
    def usage(t: float) -> float:
        return 0.45 + 0.4 * t / 300 if t < 300 else 0.3 * (t - 300) / 60

    points = history(360, usage, lambda t: 40.0, epoch=lambda t: 0 if t < 300 else 1)
    assert assess(inputs(points)).preemption_risk < 0.05


def test_the_first_seconds_after_a_restart_have_no_opinion() -> None:
    points = history(320, lambda t: 0.8, lambda t: 40.0, epoch=lambda t: 0 if t < 300 else 1)
    assert assess(inputs(points)) == IDLE


def test_an_idle_server_has_no_risk() -> None:
    points = history(300, lambda t: 0.0, lambda t: 0.0, finish_rate=0.0)
    risk = assess(inputs(points))
    assert (risk.preemption_risk, risk.seconds_to_exhaustion, risk.overcommit_ratio) == (
        0.0,
        math.inf,
        0.0,
    )


def test_a_batch_that_outgrows_the_free_space_is_a_risk_at_once() -> None:
    # Half full for minutes, then 150 sequences land: their 75 remaining tokens each
    # (11,250) are far more than the 5 % left (4,200).
    points = history(300, lambda t: 0.5 if t < 290 else 0.95, lambda t: 30.0 if t < 290 else 150.0)
    risk = assess(inputs(points))
    assert risk.overcommit_ratio > 2.0
    assert risk.preemption_risk > ALERT_THRESHOLD


def test_committed_tokens_are_the_running_sequences_mean_remaining_generation() -> None:
    # Generation lengths all 150: a sequence caught mid-run has 75 still to go.
    points = history(300, lambda t: 0.5, lambda t: 40.0)
    assert assess(inputs(points)).committed_tokens == 40 * 75


def test_a_waiting_queue_adds_its_prompts_to_the_forecast_level() -> None:
    quiet = history(300, lambda t: 0.5, lambda t: 30.0)
    queued = [Point(p.t, p.usage, p.running, 20.0, p.finished, p.generated, p.epoch) for p in quiet]
    # 20 waiting prompts of 1,500 tokens are 30,000 tokens the cache will hold soon.
    gap = assess(inputs(queued)).level_tokens - assess(inputs(quiet)).level_tokens
    assert math.isclose(gap, 20 * 1500)
