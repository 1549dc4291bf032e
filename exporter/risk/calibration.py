"""What the deployment's own past says about the risk model's forecasts. Pure arithmetic
over what the model already computed; the poll loop keeps one per engine.

The score puts its bar (0.5) at ``Z_HALF`` spreads of headroom: a prior set for traffic
the model has never seen, where a burst of a few long requests can swing the occupancy
far more than its mean suggests. A server that has run for a while has shown how far its
occupancy actually climbs above the model's forecasts when they come near the top. Each
forecast within ``Z_HALF`` spreads of the capacity (one the prior pages on) is judged
once its horizon has passed: its **excursion** is the highest occupancy reached within
the horizon above the forecast level, in the forecast's spreads. Forecasts far below the
top are not judged: a burst into an idle server climbs many spreads above a tiny
forecast and says nothing about the forecasts the score is about. Bursts that peaked
below capacity are evidence about the next one of the same size: when the worst
excursion of the last hour was small, the bar comes down to it plus a margin of one
spread (risk/model.py, ``EXCURSION_MARGIN``), and an hour's repeated near-full peaks stop
paging. The bar only ever comes down from the prior (a deployment whose swings exceed the
prior is already warned at ``Z_HALF``), only once enough of the hour was judged, and it
forgets what a restart or a new capacity made irrelevant.

The constants were fixed before the fuzz tier measured them (docs/risk-model.md):
``WINDOW_SECONDS`` — an hour, about twenty horizons of three minutes: the worst of twenty
excursions is exceeded by the next one about one time in twenty-one, and the margin makes
that rarer; ``MIN_JUDGED_SECONDS`` — the first judged forecast twenty minutes back, about
six horizons, before the past counts at all.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

WINDOW_SECONDS = 3600.0  # the past that counts: excursions judged within the last hour
MIN_JUDGED_SECONDS = 1200.0  # how much of it must have been judged before the bar moves


@dataclass(frozen=True)
class _Look:
    t: float
    forecast: float  # tokens
    spread: float  # tokens


class Calibration:
    """One engine's judged excursions. ``observe`` each poll's occupancy and forecast (in
    order); ``worst`` is the highest excursion of the window, or None while the prior
    stands. O(1) amortized per poll: a sliding maximum of the occupancy over the
    horizon and another over the judged excursions."""

    def __init__(self, horizon: float, within: float) -> None:
        self.horizon = horizon
        self.within = within
        self._pending: deque[_Look] = deque()  # forecasts whose horizon has not passed
        # The occupancy since the oldest pending look, as a monotone (decreasing) deque of
        # (t, used): its head is the highest occupancy after any time still in it.
        self._peaks: deque[tuple[float, float]] = deque()
        # Judged excursions (t, spreads), decreasing: the head is the window's worst.
        self._worst: deque[tuple[float, float]] = deque()
        self._first_judged: float | None = None
        self._epoch: tuple[int, float] | None = None

    def observe(
        self, t: float, used: float, forecast: float, spread: float, epoch: tuple[int, float]
    ) -> None:
        """One poll: ``used`` the occupancy now, ``forecast`` and ``spread`` the model's
        for the horizon ahead (tokens); ``epoch`` the vLLM restart count and the capacity
        (tokens), a change of either starts afresh. ``within``: the spreads of headroom
        under which a forecast is judged."""
        if epoch != self._epoch:
            self._pending.clear()
            self._peaks.clear()
            self._worst.clear()
            self._first_judged = None
            self._epoch = epoch
        # Judge the looks whose horizon has passed, against the peak seen after them.
        while self._pending and self._pending[0].t + self.horizon <= t:
            look = self._pending.popleft()
            while self._peaks and self._peaks[0][0] <= look.t:
                self._peaks.popleft()
            peak = self._peaks[0][1] if self._peaks else look.forecast
            self._judge(look.t, (peak - look.forecast) / look.spread)
        while self._peaks and self._peaks[-1][1] <= used:
            self._peaks.pop()
        self._peaks.append((t, used))
        if spread > 0 and (epoch[1] - forecast) / spread < self.within:
            self._pending.append(_Look(t, forecast, spread))
        while self._worst and self._worst[0][0] < t - WINDOW_SECONDS:
            self._worst.popleft()
        if self._first_judged is not None and self._first_judged < t - WINDOW_SECONDS:
            self._first_judged = t - WINDOW_SECONDS

    def _judge(self, t: float, excursion: float) -> None:
        if self._first_judged is None:
            self._first_judged = t
        while self._worst and self._worst[-1][1] <= excursion:
            self._worst.pop()
        self._worst.append((t, excursion))

    def worst(self, now: float) -> float | None:
        """The highest the occupancy climbed above a judged forecast within its horizon
        over the window (spreads; 0 when it never reached one), or None until the first
        judged forecast is ``MIN_JUDGED_SECONDS`` old."""
        judged = self._first_judged
        if judged is None or now - self.horizon - judged < MIN_JUDGED_SECONDS:
            return None
        return max(0.0, self._worst[0][1]) if self._worst else 0.0


class Calibrations:
    """Each engine's ``Calibration``, as the poll loop keeps them: ``worst`` before a poll's
    risk is computed, ``observe`` its outcome after."""

    def __init__(self, horizon: float, within: float) -> None:
        self.horizon = horizon
        self.within = within
        self._engines: dict[str, Calibration] = {}

    def worst(self, now: float) -> dict[str, float | None]:
        return {engine: c.worst(now) for engine, c in self._engines.items()}

    def observe(
        self,
        engine: str,
        t: float,
        used: float,
        forecast: float,
        spread: float,
        epoch: tuple[int, float],
    ) -> None:
        calibration = self._engines.get(engine)
        if calibration is None:
            calibration = self._engines[engine] = Calibration(self.horizon, self.within)
        calibration.observe(t, used, forecast, spread, epoch)
