"""Synthetic multi-week load with a known capacity runway, for the runway rules' tests.

A model's load (pods' worth of traffic, as ``model:kv_headroom_load:sum`` reads it) is its
*peak envelope* — the load at the weekday peak hour, the figure capacity is planned on —
times a weekly and daily shape whose maximum is 1, times noise. The truth is the
envelope's: the true runway is the number of days from the end of the series until the
envelope reaches the model's capacity (its pods), and ``None`` where it never does
(flat, stepped, falling). Times are in days, the series ending at 0.

``rules/tests/runway.test.yml`` (promtool) and ``tests/rules/test_runway_e2e.py`` (a real
Prometheus) are built from these; ``python -m tests.rules.runway_truths`` rewrites the
former, and tests/rules/test_runway.py fails when it is stale.

The method needs five weeks of load before it says anything (RUNWAY_AFTER_DAYS); the
truths have six, and the ones the ticket is followed over (SWEEPS) nine.
"""

from __future__ import annotations

import itertools
import math
import random
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

HISTORY_DAYS = 42
# The load the runway needs (docs/rules.md#capacity-runway): three weeks of week-over-week
# changes of a weekday profile of seven days: 34 days (7 + 7 + 20 of offsets).
RUNWAY_AFTER_DAYS = 34
# The series ends on a Wednesday at 18:00 unless a truth says otherwise (day 0 of the
# week is Monday; hours are in the series' own clock).
END_WEEKDAY, END_HOUR = 2, 18.0
# A day's shape: (hour, share of the day's peak), linear between; the peak is at 14:00.
DAY_SHAPE = ((0, 0.35), (6, 0.3), (9, 0.8), (14, 1.0), (17, 0.95), (21, 0.6), (24, 0.35))
# Weekdays at their full peak, weekends lower.
WEEK_SHAPE = (1.0, 1.0, 1.0, 1.0, 1.0, 0.55, 0.5)
# Relative noise: a draw every sample (bursts), and one every hour (slower swings).
NOISE = 0.05
HOURLY_NOISE = 0.015


@dataclass(frozen=True)
class Truth:
    name: str
    pods: int
    envelope: Callable[[float], float]
    runway_days: float | None
    # Days (whole, counted back from the end: -9 is nine days before) whose peak is half.
    holidays: tuple[int, ...] = ()
    end_weekday: int = END_WEEKDAY
    end_hour: float = END_HOUR
    seed: int = 1
    history_days: int = HISTORY_DAYS
    note: str = field(default="", compare=False)

    def runway_at(self, t: float) -> float | None:
        """The true runway at day t (t <= 0): runway_days counts from the end."""
        return None if self.runway_days is None else self.runway_days - t

    def load(self, t: float, rng: random.Random, hourly: dict[int, float]) -> float:
        """The load at day t (t <= 0), noise drawn from rng (the hour's from `hourly`)."""
        hours = self.end_hour + 24 * t
        day = math.floor(hours / 24)
        weekday = (self.end_weekday + day) % 7
        hour = hours - 24 * day
        factor = WEEK_SHAPE[weekday] * _interpolate(DAY_SHAPE, hour)
        if day in self.holidays:
            factor *= 0.5
        if math.floor(hours) not in hourly:
            hourly[math.floor(hours)] = HOURLY_NOISE * rng.gauss(0.0, 1.0)
        noise = hourly[math.floor(hours)] + NOISE * rng.gauss(0.0, 1.0)
        return self.envelope(t) * factor * (1 + noise)

    def samples(self, step_seconds: int) -> Iterator[tuple[float, float]]:
        """(day, load) every step_seconds from -history_days to 0, deterministic per truth."""
        rng = random.Random(self.seed)
        hourly: dict[int, float] = {}
        n = self.history_days * 86400 // step_seconds
        for i in range(n + 1):
            t = -self.history_days + i * step_seconds / 86400
            yield t, max(self.load(t, rng, hourly), 1e-3)


def _interpolate(points: tuple[tuple[float, float], ...], x: float) -> float:
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x0 <= x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    raise ValueError(x)


def linear_growth(
    name: str,
    pods: int,
    runway: float,
    start_share: float = 0.45,
    *,
    history_days: int = HISTORY_DAYS,
    holidays: tuple[int, ...] = (),
    end_weekday: int = END_WEEKDAY,
    end_hour: float = END_HOUR,
    seed: int = 1,
) -> Truth:
    """An envelope growing linearly from start_share of the pods at the first sample to
    the pods `runway` days after the last."""
    slope = pods * (1 - start_share) / (runway + history_days)

    def envelope(t: float) -> float:
        return pods - slope * (runway - t)

    return Truth(
        name, pods, envelope, runway, holidays=holidays, end_weekday=end_weekday,
        end_hour=end_hour, seed=seed, history_days=history_days,
    )  # fmt: skip


def exponential_growth(name: str, pods: int, runway: float, weekly: float, seed: int) -> Truth:
    """Growing by `weekly` (0.05 = 5 %) a week, compounded, reaching the pods at `runway`."""

    def envelope(t: float) -> float:
        return pods * math.pow(1 + weekly, (t - runway) / 7)

    return Truth(name, pods, envelope, runway, seed=seed)


def constant(level: float) -> Callable[[float], float]:
    return lambda t: level


def step(before: float, after: float, at: float) -> Callable[[float], float]:
    return lambda t: after if t >= at else before


def falling(start: float, end: float) -> Callable[[float], float]:
    return lambda t: end + (start - end) * (-t / HISTORY_DAYS)


# Growing: the runway within ±25 %; the alert fires under 14 days and only then.
GROWING = (
    linear_growth("growth-7d", 4, 7.0, seed=11),
    linear_growth("growth-10d", 4, 10.0, seed=12),
    linear_growth("growth-12d", 6, 12.0, seed=13),
    linear_growth("growth-17d", 4, 17.0, seed=14),
    linear_growth("growth-20d", 8, 20.0, seed=15),
    linear_growth("growth-30d", 4, 30.0, seed=16),
    # Read on a Monday morning, when the week's highest peak is Friday's.
    linear_growth("growth-10d-monday", 4, 10.0, end_weekday=0, end_hour=8.0, seed=17),
    # A public holiday (a Monday) nine days ago and another a month ago.
    linear_growth("growth-10d-holidays", 4, 10.0, holidays=(-9, -30), seed=18),
)
# Compounding growth: the linear method reads it at its growth of about two and a half
# weeks ago, so the runway errs long (late), never short; held to that, within +70 %
# (docs/rules.md#capacity-runway gives the measured error).
COMPOUNDING = (
    exponential_growth("growth-5pct-weekly-12d", 4, 12.0, weekly=0.05, seed=19),
    exponential_growth("growth-5pct-weekly-25d", 6, 25.0, weekly=0.05, seed=20),
)
COMPOUNDING_TOLERANCE = (-0.05, 0.7)
# Not growing: no runway, or one over 60 days; the alert stays silent.
NOT_GROWING = (
    Truth("flat", 4, constant(2.8), None, seed=21),
    Truth("flat-holidays", 4, constant(2.8), None, holidays=(-9, -16, -30), seed=22),
    # A tenant onboarded: the level steps up once, 10 days ago, 3 days ago, 4 weeks ago.
    Truth("step-10d-ago", 4, step(1.8, 3.0, -10), None, seed=23),
    Truth("step-3d-ago", 4, step(1.8, 3.0, -3), None, seed=24),
    Truth("step-28d-ago", 4, step(1.8, 3.0, -28), None, seed=25),
    Truth("falling", 4, falling(3.4, 2.0), None, seed=26),
)
TRUTHS = GROWING + COMPOUNDING + NOT_GROWING
# Followed day by day over nine weeks, the true runway falling from about 60 days to 2:
# the ticket silent before the method's history and while the runway is over 14 days (by
# more than the runway's error), firing once it is under.
SWEEPS = (
    linear_growth("sweep-linear", 4, 2.0, start_share=0.3, history_days=63, seed=41),
    linear_growth("sweep-linear-8", 8, 3.0, start_share=0.5, history_days=63, seed=42),
)
# Days the ticket is not held to either way: the runway's error (±25 %) around 14 days.
TICKET_BAND = (14.0 / 1.25, 14.0 * 1.25)

TEST_FILE = Path(__file__).resolve().parents[2] / "rules" / "tests" / "runway.test.yml"


def main() -> int:
    from tests.rules.runway_promtool import render_test_file

    TEST_FILE.write_text(render_test_file(TRUTHS, SWEEPS), encoding="utf-8")
    print(f"wrote {TEST_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
