"""Load headroom: the risk model's alert point solved for the arrival rate."""

from __future__ import annotations

import math

import pytest

from exporter.capacity.steptime import StepTimes
from exporter.risk.headroom import (
    kv_multiple,
    kv_read_share,
    load_headroom,
    prefill_share,
    rate_for_growth,
)
from exporter.risk.model import IDLE, RISK_HALF, Z_HALF, Inputs, Point, Risk, assess
from tests.risk.test_model import GENERATION, PROMPT, history, inputs


def risk(level: float, spread: float) -> Risk:
    return Risk(level, spread, 0.0, 0.0, 0.0, math.inf, 0.0)


def steady(
    running: float, waiting: float = 0.0, capacity: float = 100_000.0, max_num_seqs: int = 256
) -> Inputs:
    points = [Point(t, 0.5, running, waiting, t, 10 * t, 0) for t in range(0, 120, 2)]
    return Inputs(points, capacity, 16, max_num_seqs, PROMPT, GENERATION)


def test_the_multiple_puts_the_scaled_forecast_exactly_at_the_alert_point() -> None:
    level, spread, capacity = 20_000.0, 3_000.0, 100_000.0
    m = kv_multiple(level, spread, capacity)
    assert m * level + Z_HALF * spread * math.sqrt(m) == pytest.approx(capacity)


def test_a_forecast_already_at_the_alert_point_has_a_ratio_of_one() -> None:
    capacity, spread = 100_000.0, 2_000.0
    level = capacity - Z_HALF * spread
    assert kv_multiple(level, spread, capacity) == pytest.approx(1.0)


def test_without_spread_the_ratio_is_capacity_over_level() -> None:
    assert kv_multiple(25_000.0, 0.0, 100_000.0) == pytest.approx(4.0)


def test_the_spread_costs_headroom() -> None:
    assert kv_multiple(25_000.0, 5_000.0, 100_000.0) < kv_multiple(25_000.0, 0.0, 100_000.0)


def test_a_batch_near_max_num_seqs_binds_before_the_cache() -> None:
    h = load_headroom(risk(10_000.0, 1_000.0), steady(running=40, max_num_seqs=50))
    assert h is not None
    assert h.resource == "max_num_seqs"
    assert h.ratio == pytest.approx(50 / 40)


def test_waiting_requests_count_as_demand_for_the_batch() -> None:
    h = load_headroom(risk(1.0, 0.0), steady(running=50, waiting=50, max_num_seqs=50))
    assert h is not None
    assert h.ratio == pytest.approx(0.5)


def test_a_cache_that_fills_first_is_the_binding_resource() -> None:
    h = load_headroom(risk(50_000.0, 2_000.0), steady(running=20))
    assert h is not None
    assert h.resource == "kv_cache"
    assert h.ratio == pytest.approx(kv_multiple(50_000.0, 2_000.0, 100_000.0))


def test_an_idle_engine_has_no_ratio() -> None:
    assert load_headroom(IDLE, steady(running=0)) is None


@pytest.mark.parametrize("usage", [0.3, 0.6, 0.85])
def test_the_ratio_is_below_one_exactly_when_the_risk_alerts(usage: float) -> None:
    # Steady traffic at three loads; the risk model's own forecast and spread.
    points = history(300, lambda t: usage, lambda t: 40.0)
    given = inputs(points, max_num_seqs=10_000)
    got = assess(given)
    h = load_headroom(got, given)
    assert h is not None
    assert (h.ratio < 1) == (got.preemption_risk > RISK_HALF)


def test_a_batch_cap_that_fits_the_cache_leaves_only_the_batch_to_bind() -> None:
    # 40 sequences of 1,500 + 150 tokens at most: 66,000 of 100,000 tokens, whatever
    # the forecast level says.
    h = load_headroom(risk(90_000.0, 5_000.0), steady(running=30, max_num_seqs=40))
    assert h is not None
    assert h.resource == "max_num_seqs"
    assert math.isinf(h.kv_ratio)


def test_without_kv_reads_the_rate_grows_the_occupancy_in_proportion() -> None:
    assert rate_for_growth(3.0, 0.0) == pytest.approx(3.0)


def test_slower_steps_leave_less_rate_than_occupancy_growth() -> None:
    # A third of each step reads the KV: 3× the occupancy also makes steps 5/3 as long.
    assert rate_for_growth(3.0, 1 / 3) == pytest.approx(3.0 / (5 / 3))


# Llama-3.1-8B-like on an H100-like GPU: 20 ms a step for the weights, 0.05 µs per token
# of context read, 40 µs per prompt token computed.
STEPS = StepTimes(base_s=0.02, per_prefill_token_s=40e-6, per_kv_token_s=0.05e-6)


def test_the_kv_read_share_is_the_kv_time_over_the_whole_decode_step() -> None:
    # 400,000 tokens × 0.05 µs = 20 ms of KV next to 20 ms for the weights.
    assert kv_read_share(400_000, STEPS) == pytest.approx(0.5)


def test_the_prefill_share_is_the_prompt_tokens_computed_per_second_times_a_tokens_time() -> None:
    assert prefill_share(5_000, STEPS) == pytest.approx(0.2)


def test_the_prefill_share_is_at_most_the_whole_time() -> None:
    assert prefill_share(50_000, STEPS) == 1.0


def test_prefill_at_share_u_lets_the_rate_grow_at_most_one_over_u() -> None:
    assert rate_for_growth(1e12, 0.25) == pytest.approx(4.0, rel=1e-6)
    assert rate_for_growth(math.inf, 0.25) == pytest.approx(4.0)


def test_a_deployment_whose_steps_slow_down_holds_less_traffic() -> None:
    given = steady(running=20)
    plain = load_headroom(risk(20_000.0, 1_000.0), given)
    slowing = load_headroom(risk(20_000.0, 1_000.0), given, steps=STEPS)
    assert plain is not None
    assert slowing is not None
    assert 1 < slowing.ratio < plain.ratio


def prompted(running: float, prompt_per_s: float) -> Inputs:
    """Steady traffic whose engine computes ``prompt_per_s`` prompt tokens a second."""
    points = [
        Point(t, 0.5, running, 0.0, t, 10 * t, 0, prompt=prompt_per_s * t) for t in range(0, 120, 2)
    ]
    return Inputs(points, 100_000.0, 16, 256, PROMPT, GENERATION)


def test_an_engine_busy_computing_prompts_holds_less_traffic() -> None:
    idle = load_headroom(risk(20_000.0, 1_000.0), prompted(20, 0.0), steps=STEPS)
    busy = load_headroom(risk(20_000.0, 1_000.0), prompted(20, 10_000.0), steps=STEPS)
    assert idle is not None
    assert busy is not None
    assert busy.ratio < idle.ratio
    assert busy.ratio < 1 / prefill_share(10_000.0, STEPS)


def test_prompts_the_prefix_cache_served_cost_no_prefill_time() -> None:
    given = prompted(20, 10_000.0)
    idle = load_headroom(risk(20_000.0, 1_000.0), prompted(20, 0.0), steps=STEPS)
    cached = load_headroom(risk(20_000.0, 1_000.0), given, steps=STEPS, prefix_hit_ratio=1.0)
    assert idle is not None
    assert cached is not None
    assert cached.ratio == pytest.approx(idle.ratio)


def test_prefill_never_lifts_a_ratio_below_one_towards_one() -> None:
    # The forecast is over the cache already; the GPU computes prompts all the time.
    over = risk(120_000.0, 1_000.0)
    without = load_headroom(over, prompted(20, 0.0), steps=STEPS)
    saturated = load_headroom(over, prompted(20, 25_000.0), steps=STEPS)
    assert without is not None
    assert saturated is not None
    assert saturated.ratio == pytest.approx(without.ratio)
    assert saturated.ratio < 1
