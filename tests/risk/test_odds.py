"""The calibrated probability: a fresh engine reads the prior; what followed each score
on this engine moves its band."""

from __future__ import annotations

import pytest

from exporter.risk import odds
from exporter.risk.odds import Odds

HORIZON = 180.0


def _feed(o: Odds, start: float, seconds: float, score: float, counted: float = 0.0) -> float:
    t = start
    while t < start + seconds:
        t += 2.0
        o.observe(t, score, counted)
    return t


def test_a_fresh_engine_reads_the_prior_in_every_band() -> None:
    o = Odds(HORIZON)
    assert [o.probability(b + 0.01) for b in odds.BANDS] == pytest.approx(odds.PRIOR)
    assert list(odds.PRIOR) == sorted(odds.PRIOR)


def test_high_scores_a_preemption_never_followed_lower_their_band() -> None:
    o = Odds(HORIZON)
    _feed(o, 0.0, 3600.0, 0.95)
    assert o.probability(0.95) < odds.PRIOR[-1] / 2
    assert o.probability(0.05) == pytest.approx(odds.PRIOR[0])  # no poll there: the prior stands


def test_a_counted_preemption_raises_the_band_of_the_polls_before_it() -> None:
    o = Odds(HORIZON)
    t = _feed(o, 0.0, 600.0, 0.95)
    before = o.probability(0.95)
    o.observe(t + 2.0, 0.95, 1.0)
    assert o.probability(0.95) > before


def test_polls_not_yet_past_their_horizon_are_not_judged() -> None:
    o = Odds(HORIZON)
    _feed(o, 0.0, HORIZON - 10.0, 0.95)
    assert o.probability(0.95) == pytest.approx(odds.PRIOR[-1])


def test_the_probability_never_falls_as_the_score_rises() -> None:
    o = Odds(HORIZON)
    t = _feed(o, 0.0, 3600.0, 0.95)  # the top band learnt low, below the prior of 0.7-0.9
    t = _feed(o, t, 300.0, 0.8)
    o.observe(t + 2.0, 0.8, 1.0)
    table = o.table()
    assert table == sorted(table)


def test_a_restarted_counter_is_not_a_preemption() -> None:
    o = Odds(HORIZON)
    t = _feed(o, 0.0, 600.0, 0.95, counted=5.0)
    low = o.probability(0.95)
    o.observe(t + 2.0, 0.95, 0.0)
    assert o.probability(0.95) == pytest.approx(low, rel=0.05)


def test_what_was_learnt_fades_with_the_half_life() -> None:
    o = Odds(HORIZON)
    t = _feed(o, 0.0, 1800.0, 0.95)
    learnt = o.probability(0.95)
    o.observe(t + 4 * odds.HALF_LIFE_SECONDS, 0.0, 0.0)
    assert learnt < o.probability(0.95) < odds.PRIOR[-1]


def test_each_engine_learns_on_its_own() -> None:
    engines = odds.EngineOdds(HORIZON)
    t = 0.0
    while t < 3600.0:
        t += 2.0
        engines.observe("a", 0, t, 0.95, 0.0)  # high scores, never followed by a preemption
        engines.observe("b", 0, t, 0.05, 0.0)
    assert engines.observe("a", 0, t + 2.0, 0.95, 0.0) < odds.PRIOR[-1] / 2
    assert engines.observe("b", 0, t + 2.0, 0.95, 0.0) == pytest.approx(odds.PRIOR[-1])


def test_a_vllm_restart_starts_the_engine_from_the_prior_again() -> None:
    engines = odds.EngineOdds(HORIZON)
    t = 0.0
    while t < 3600.0:
        t += 2.0
        engines.observe("a", 0, t, 0.95, 0.0)
    assert engines.observe("a", 1, t + 2.0, 0.95, 0.0) == pytest.approx(odds.PRIOR[-1])


def test_a_gap_in_the_polls_does_not_count_as_time_at_the_score_after_it() -> None:
    # vLLM silent for an hour or for two minutes, then one poll at a high score that no
    # preemption follows: either way it stands for one poll's worth, not the silence.
    hour, minutes = Odds(HORIZON), Odds(HORIZON)
    for o, gap in ((hour, 3600.0), (minutes, 120.0)):
        o.observe(0.0, 0.95, 0.0)
        o.observe(gap, 0.95, 0.0)
        o.observe(gap + HORIZON + 2.0, 0.0, 0.0)  # judged: nothing followed
    assert hour.probability(0.95) == pytest.approx(minutes.probability(0.95))
    assert hour.probability(0.95) > odds.PRIOR[-1] / 2
