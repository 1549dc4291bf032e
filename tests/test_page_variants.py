"""Stop 56's page variant (benchmarks/page_variants.py) stands down where docs/risk-model.md
says it does: after ten minutes of page-level polls judged misses, and no sooner; a counted
preemption brings the page back; a score under the page's threshold is never judged."""

from __future__ import annotations

from benchmarks import page_variants
from benchmarks.alert_scoring import RULES
from exporter.replay import Tick
from exporter.risk.model import HORIZON

STEP = 2.0


def _ticks(n: int, risk: float, counted: list[float] | None = None) -> list[Tick]:
    counts = counted or [0.0] * n
    return [
        Tick(
            t=STEP * i, usage=0.95, preemptions_counted=counts[i], preempted=0, running=1.0,
            waiting=0.0, preemption_risk=risk, seconds_to_exhaustion=60.0, overcommit_ratio=1.0,
        )
        for i in range(n)
    ]  # fmt: skip


def _first_stood_down(flags: list[bool]) -> float | None:
    return next((STEP * i for i, f in enumerate(flags) if f), None)


def test_the_page_stands_down_once_ten_minutes_of_page_level_polls_were_misses() -> None:
    flags = page_variants.stood_down(_ticks(600, risk=1.0))
    # Judged misses pass PRIOR_SECONDS (the decay lowers them slightly) a horizon later.
    first = _first_stood_down(flags)
    assert first is not None
    assert HORIZON + page_variants.PRIOR_SECONDS <= first <= HORIZON + 700.0
    assert all(flags[int(first / STEP) :])


def test_a_counted_preemption_brings_the_page_back() -> None:
    n = 600
    counted = [0.0] * 500 + [1.0] * 100  # vLLM counts one at t = 1,000 s
    flags = page_variants.stood_down(_ticks(n, risk=1.0, counted=counted))
    assert flags[499]
    assert not flags[500]


def test_a_score_below_the_page_threshold_is_never_judged() -> None:
    assert not any(page_variants.stood_down(_ticks(1800, risk=0.98)))


def test_the_variant_fires_only_where_the_shipped_page_does() -> None:
    ticks = _ticks(600, risk=1.0)
    page = RULES[0]
    variant = page_variants.standing_down(page)
    for i in range(len(ticks)):
        assert not variant.condition(ticks, i) or page.condition(ticks, i)


def test_the_prior_is_the_share_of_page_level_polls_a_counted_preemption_followed() -> None:
    # Polls every 2 s from t = 0 to 598, all above the threshold; the counter moves at
    # t = 300. Followed: the 90 polls at 120-298. Judged: those, and the polls whose horizon
    # ended by the run's end without one (2-118 and 300-418, 119 of them); t = 0 stands for
    # no interval.
    counted = [0.0] * 150 + [1.0] * 150
    share = page_variants.prior_share([_ticks(300, risk=1.0, counted=counted)])
    assert HORIZON == 180.0
    assert share == 90 / (90 + 119)
