"""An engine's judged past (exporter/risk/calibration.py) and how it moves the score."""

from __future__ import annotations

import dataclasses

from exporter.risk.calibration import MIN_JUDGED_SECONDS, WINDOW_SECONDS, Calibration
from exporter.risk.model import RISK_HALF, Z_HALF, Inputs, Point, assess

HORIZON = 180.0
EPOCH = (0, 10_000.0)


def steady(cal: Calibration, start: float, end: float, used: float, forecast: float) -> None:
    """Polls every 2 s at a flat occupancy with a flat forecast and a spread of 100: a
    forecast within ``Z_HALF`` spreads of the capacity (10,000) is one the prior pages on."""
    t = start
    while t < end:
        cal.observe(t, used, forecast, 100.0, EPOCH)
        t += 2.0


def test_the_prior_stands_until_twenty_minutes_were_judged() -> None:
    cal = Calibration(HORIZON, Z_HALF)
    steady(cal, 0.0, HORIZON + MIN_JUDGED_SECONDS - 10.0, 9_700.0, 9_700.0)
    assert cal.worst(HORIZON + MIN_JUDGED_SECONDS - 10.0) is None


def test_a_flat_occupancy_that_never_passed_its_forecast_has_no_excursion() -> None:
    cal = Calibration(HORIZON, Z_HALF)
    steady(cal, 0.0, 1800.0, 9_700.0, 9_700.0)
    assert cal.worst(1800.0) == 0.0


def test_the_worst_excursion_is_the_highest_climb_above_a_forecast_in_spreads() -> None:
    cal = Calibration(HORIZON, Z_HALF)
    steady(cal, 0.0, 600.0, 9_700.0, 9_700.0)
    cal.observe(600.0, 9_950.0, 9_700.0, 100.0, EPOCH)  # a burst 2.5 spreads above
    steady(cal, 602.0, 1800.0, 9_700.0, 9_700.0)
    assert cal.worst(1800.0) == 2.5


def test_a_climb_after_the_horizon_is_not_charged_to_the_forecast() -> None:
    cal = Calibration(HORIZON, Z_HALF)
    cal.observe(0.0, 9_500.0, 9_500.0, 100.0, EPOCH)
    # Nothing forecast after it: the climb at 200 s is beyond the first look's horizon.
    cal.observe(200.0, 9_900.0, 9_900.0, 0.0, EPOCH)
    steady(cal, 202.0, 1800.0, 9_900.0, 9_900.0)
    assert cal.worst(1800.0) == 0.0


def test_an_excursion_older_than_the_window_is_forgotten() -> None:
    cal = Calibration(HORIZON, Z_HALF)
    steady(cal, 0.0, 300.0, 9_700.0, 9_700.0)
    cal.observe(300.0, 9_990.0, 9_700.0, 100.0, EPOCH)
    steady(cal, 302.0, 300.0 + WINDOW_SECONDS + HORIZON + 10.0, 9_700.0, 9_700.0)
    assert cal.worst(300.0 + WINDOW_SECONDS + HORIZON + 10.0) == 0.0


def test_a_forecast_far_below_the_top_is_not_judged() -> None:
    # A burst into an idle server climbs many spreads above a tiny forecast: that says
    # nothing about how far a forecast near the top, the one the score is about, may miss.
    cal = Calibration(HORIZON, Z_HALF)
    steady(cal, 0.0, 1800.0, 100.0, 100.0)
    assert cal.worst(1800.0) is None


def test_a_restart_starts_the_judged_past_afresh() -> None:
    cal = Calibration(HORIZON, Z_HALF)
    steady(cal, 0.0, 1800.0, 9_700.0, 9_700.0)
    cal.observe(1800.0, 9_700.0, 9_700.0, 100.0, (1, EPOCH[1]))
    assert cal.worst(1802.0) is None


def near_full_inputs() -> Inputs:
    """Five minutes of a cache flat at 80 %, many requests: the forecast sits under two spreads
    below the top."""
    points = [Point(t, 0.8, 100.0, 0.0, t / 4.0, t * 20.0, 0) for t in range(0, 302, 2)]
    return Inputs(points, 100_000.0, 16, None, None, None)


def test_a_past_whose_bursts_stayed_low_lowers_the_score() -> None:
    inputs = near_full_inputs()
    prior = assess(inputs).preemption_risk
    assert prior > RISK_HALF
    judged = assess(dataclasses.replace(inputs, excursion=0.0)).preemption_risk
    assert judged < RISK_HALF


def test_a_past_that_swung_wider_than_the_prior_never_raises_the_score() -> None:
    inputs = near_full_inputs()
    wild = assess(dataclasses.replace(inputs, excursion=100.0)).preemption_risk
    assert wild == assess(inputs).preemption_risk
