"""The risk model on hand-made histories: what it must say, and what it must not."""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable

from exporter.capacity.histogram import Histogram
from exporter.risk.model import HORIZON, RISK_HALF, Inputs, Point, assess, usage_peak

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


def test_residents_already_past_the_ceiling_lift_its_cap() -> None:
    # 32 sequences of the mix's 1,500 + 150 tokens would hold 52,800 of 84,000 tokens, yet
    # 30 residents (longer than the mix, as a burst of long prompts brings) already hold
    # 97 % and keep growing: the cap is the chance the residents in hand reach the top.
    points = history(300, lambda t: 0.6 + 0.37 * t / 300, lambda t: 30.0)
    risk = assess(inputs(points, max_num_seqs=32))
    assert risk.preemption_risk > RISK_HALF
    # The same ramp under a ceiling the residents do not contradict stays capped.
    points = history(300, lambda t: 0.2 + 0.37 * t / 300, lambda t: 30.0)
    assert assess(inputs(points, max_num_seqs=32)).preemption_risk < 0.01


def test_fast_growth_is_a_risk() -> None:
    # From 30 % to 80 % in five minutes: at this rate the cache is full in two.
    points = history(300, lambda t: 0.3 + 0.5 * t / 300, lambda t: 20 + 60 * t / 300)
    assert assess(inputs(points)).preemption_risk > RISK_HALF


def test_fast_growth_is_exhausted_when_its_forecast_crosses_the_top() -> None:
    points = history(300, lambda t: 0.3 + 0.5 * t / 300, lambda t: 20 + 60 * t / 300)
    risk = assess(inputs(points))
    # The forecast is over the top at the horizon: it crosses it before then, from the
    # occupancy now towards the forecast level.
    used = 0.8 * 84_000
    expected = HORIZON * (84_000 - used) / (risk.level_tokens - used)
    assert risk.level_tokens >= 84_000
    assert math.isclose(risk.seconds_to_exhaustion, expected, rel_tol=1e-9)
    assert risk.seconds_to_exhaustion <= HORIZON


def test_a_forecast_below_the_top_is_not_exhausted_on_this_trend() -> None:
    # Filling a little (6 % a minute from 5 %), as the demo's first minute does: a growth
    # over a minute is no exhaustion when the forecast never reaches the top.
    points = history(360, lambda t: 0.05 + 0.06 * max(0.0, t - 300) / 60, lambda t: 5.0)
    risk = assess(inputs(points))
    assert risk.level_tokens < 84_000
    assert risk.preemption_risk < RISK_HALF
    assert risk.seconds_to_exhaustion > HORIZON


def test_a_flat_cache_never_exhausts() -> None:
    points = history(300, lambda t: 0.5, lambda t: 30.0)
    assert assess(inputs(points)).seconds_to_exhaustion == math.inf


def test_noise_around_a_steady_level_is_no_risk() -> None:
    # A 2 s poll on a busy server: ±15 % swings around half full.
    jitter = random.Random(2)
    points = history(300, lambda t: 0.5 + jitter.uniform(-0.15, 0.15), lambda t: 30.0)
    assert assess(inputs(points)).preemption_risk < RISK_HALF / 2


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
    assert assess(inputs(points)).preemption_risk < RISK_HALF


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


def test_the_first_seconds_after_a_restart_say_how_little_history_they_rest_on() -> None:
    points = history(320, lambda t: 0.8, lambda t: 40.0, epoch=lambda t: 0 if t < 300 else 1)
    assert assess(inputs(points)).history_seconds == 20


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
    assert risk.preemption_risk > RISK_HALF


def test_committed_tokens_are_the_running_sequences_mean_remaining_generation() -> None:
    # Generation lengths all 150: a sequence caught mid-run has 75 still to go.
    points = history(300, lambda t: 0.5, lambda t: 40.0)
    assert assess(inputs(points)).committed_tokens == 40 * 75


def queued(points: list[Point], waiting: float, admitted_per_finished: float) -> list[Point]:
    """The same history with a queue, prompts prefilled at a multiple of the finish rate."""
    return [
        dataclasses.replace(p, waiting=waiting, prompt=p.finished * admitted_per_finished * 1500)
        for p in points
    ]


def test_a_queue_admitted_faster_than_requests_finish_adds_to_the_forecast_level() -> None:
    quiet = history(300, lambda t: 0.5, lambda t: 30.0)
    # Admitting twice as fast as requests finish: 30 resident become 60 — 30 more of the
    # 40 waiting, each holding its 1,500-token prompt and half its 150-token answer.
    gap = assess(inputs(queued(quiet, 40, 2.0))).level_tokens - assess(inputs(quiet)).level_tokens
    assert math.isclose(gap, 30 * (1500 + 75))


def test_a_queue_admitted_as_fast_as_requests_finish_is_not_kv_pressure() -> None:
    # Prefill-bound: the queue drains one admission per finish, so the cache level holds.
    quiet = history(300, lambda t: 0.5, lambda t: 30.0)
    gap = assess(inputs(queued(quiet, 40, 1.0))).level_tokens - assess(inputs(quiet)).level_tokens
    assert gap == 0


def test_a_queue_behind_a_full_batch_is_not_kv_pressure() -> None:
    full = history(300, lambda t: 0.5, lambda t: 30.0)
    gap = (
        assess(inputs(queued(full, 40, 3.0), max_num_seqs=30)).level_tokens
        - assess(inputs(full, max_num_seqs=30)).level_tokens
    )
    assert gap == 0


def test_with_nothing_finished_yet_the_whole_queue_counts() -> None:
    quiet = history(300, lambda t: 0.5, lambda t: 30.0, finish_rate=0.0)
    gap = assess(inputs(queued(quiet, 20, 1.0))).level_tokens - assess(inputs(quiet)).level_tokens
    assert math.isclose(gap, 20 * (1500 + 75))


def test_a_burst_on_the_first_poll_is_a_risk_at_once() -> None:
    # A server the sidecar has seen once: 40 requests running (60 % full), 40 more
    # waiting, nothing finished yet. The waiting ones will not fit: an opinion now, not 0.
    first = [Point(0.0, 0.6, 40.0, 40.0, 0.0, 0.0, 0, prompt=0.0)]
    risk = assess(inputs(first, max_num_seqs=256))
    assert risk.preemption_risk > RISK_HALF
    assert risk.history_seconds == 0


def test_a_quiet_first_poll_is_no_risk() -> None:
    first = [Point(0.0, 0.1, 5.0, 0.0, 0.0, 0.0, 0, prompt=0.0)]
    assert assess(inputs(first)).preemption_risk < 0.05


def test_a_running_batch_with_nothing_finished_is_expected_to_grow_as_much_again() -> None:
    # 20 sequences have generated 4,000 tokens between them since the sidecar started
    # and none finished: the age prior expects 200 more each.
    points = [Point(t, 0.5, 20.0, 0.0, 0.0, 4000.0 * t / 10, 0) for t in (0.0, 2.0, 10.0)]
    risk = assess(dataclasses.replace(inputs(points), generation=None, recent_generation=None))
    assert math.isclose(risk.committed_tokens, 4000.0)


def test_a_prefill_bound_queue_on_a_fresh_server_is_not_counted_before_any_finish() -> None:
    # 63 waiting, one running, nothing finished yet: with the queue held back by the
    # token budget (not by blocks) it adds nothing (real vLLM 0.32, issue 13's case).
    first = [Point(t, 0.1, 1.0, 63.0, 0.0, 0.0, 0, prompt=1500.0 * t) for t in (0.0, 2.0)]
    compute = dataclasses.replace(inputs(first), bottleneck="compute")
    blocks = dataclasses.replace(inputs(first), bottleneck="kv_cache")
    assert assess(compute).preemption_risk < RISK_HALF
    assert assess(blocks).level_tokens > assess(compute).level_tokens


def compute_bound(points: list[Point], queued_for: float) -> Inputs:
    """A queue of 2 at the polls of the last ``queued_for`` seconds, labelled compute-bound."""
    last = points[-1].t
    waited = [dataclasses.replace(p, waiting=2.0) if p.t > last - queued_for else p for p in points]
    return dataclasses.replace(inputs(waited), bottleneck="compute")


def test_a_queue_that_stood_its_time_for_compute_narrows_the_spread() -> None:
    ramp = history(300, lambda t: 0.2 + 0.002 * t, lambda t: 10.0 + t / 10)
    paced, unpaced = compute_bound(ramp, 30.0), compute_bound(ramp, 30.0)
    unpaced = dataclasses.replace(unpaced, bottleneck="max_num_seqs")
    assert assess(paced).spread_tokens < 0.9 * assess(unpaced).spread_tokens


def test_a_queue_caught_between_two_steps_does_not_move_the_score() -> None:
    # Two requests waiting at this poll only, the step's budget admitting them: random
    # arrivals still. Paced, the demo's score fell 0.97 -> 0.47 for one poll.
    ramp = history(300, lambda t: 0.2 + 0.002 * t, lambda t: 10.0 + t / 10)
    one_poll = compute_bound(ramp, 1.0)
    assert (
        assess(one_poll).spread_tokens
        == assess(dataclasses.replace(one_poll, bottleneck="max_num_seqs")).spread_tokens
    )


def test_a_queue_that_has_drained_adds_nothing() -> None:
    quiet = history(300, lambda t: 0.5, lambda t: 30.0)
    queue = queued(quiet, 40, 2.0)
    drained = [*queue[:-1], dataclasses.replace(queue[-1], waiting=0.0)]
    gap = assess(inputs(drained)).level_tokens - assess(inputs(quiet)).level_tokens
    assert gap == 0


def burst_then_idle(now: float) -> list[Point]:
    """A server at 10 % with a request every 2 s, hit at 120 s by 150 requests at once that
    fill it to 90 % and finish by 200 s; quiet again until ``now``."""
    points, finished, arrived = [], 0.0, 0.0
    for i in range(int(now / 2) + 1):
        t = i * 2.0
        arrived += 1.0 if t > 0 else 0.0
        in_burst = 120 <= t < 200
        if t == 120:
            arrived += 150
        usage = 0.9 if in_burst else 0.1
        running = 40.0 if in_burst else 5.0
        waiting = max(0.0, 110.0 - (t - 120) * 2) if in_burst else 0.0
        finished = arrived - running - waiting
        generated = 25.0 * 40 * t
        points.append(Point(t, usage, running, waiting, finished, generated, 0, finished * 1500))
    return points


def test_a_burst_that_has_drained_leaves_no_risk_behind() -> None:
    # 40 s after the burst's last request left, arrivals are back to one every 2 s while the
    # level's two minutes still hold the burst: that load has gone.
    assert assess(inputs(burst_then_idle(240))).preemption_risk < 0.05


def test_the_same_burst_is_a_risk_while_it_runs() -> None:
    assert assess(inputs(burst_then_idle(170))).preemption_risk > RISK_HALF


def long_requests_then_short(now: float) -> list[Point]:
    """Requests arrive at 2 a second throughout. From 150 s long ones pile up (usage 0.15 →
    0.70, running 8 → 40); at 250 s they finish together and the cache falls to 0.05 with 6
    running, while the arrivals go on at the same rate — now short requests."""
    points = []
    for i in range(int(now / 2) + 1):
        t = i * 2.0
        if t < 150:
            usage, running = 0.15, 8.0
        elif t < 250:
            usage, running = 0.15 + 0.55 * (t - 150) / 100, 8.0 + 32 * (t - 150) / 100
        else:
            usage, running = 0.05, 6.0
        finished = 2.0 * t + (34.0 if t >= 250 else 0.0)
        points.append(Point(t, usage, running, 0.0, finished, 25.0 * 40 * t, 0))
    return points


def test_the_crash_of_swings_whose_requests_have_left_does_not_hold_the_risk_up() -> None:
    # 30 s after the long requests left, the arrival rate is unchanged, so only the fall in
    # requests resident says the swings' load has gone (before: risk 0.91 here).
    assert assess(inputs(long_requests_then_short(280))).preemption_risk < RISK_HALF


def test_the_same_long_requests_are_a_risk_while_they_pile_up() -> None:
    assert assess(inputs(long_requests_then_short(240))).preemption_risk > RISK_HALF


def test_the_usage_peak_is_the_highest_poll_inside_the_window_only() -> None:
    readings = ((0.0, 0.97), (10.0, 0.83), (70.0, 0.4))
    polls = [Point(t, u, 1.0, 0.0, 0.0, 0.0, 0) for t, u in readings]
    assert usage_peak(polls, 65.0) == 0.83
    # Left-open, as a range selector is: a poll exactly a window ago is outside it.
    assert usage_peak(polls, 60.0) == 0.4
    assert usage_peak(polls, 71.0) == 0.97
    assert usage_peak([], 60.0) is None
