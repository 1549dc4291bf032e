"""How often, on this engine, a given preemption-risk score was followed by a preemption
within the horizon: the score turned into a probability that calibrates itself on the
deployment it watches. Pure arithmetic over what the poll loop already has (the score and
vLLM's preemption counter); one per engine.

A fresh engine starts from a prior: for each band of the score, the share of polls in it
that a preemption followed within the horizon on the fuzz tier's dev hours
(docs/risk-model.md, the reliability table). Each poll is then judged once its horizon
has passed or a preemption was counted within it: a poll a preemption followed is a hit
for its band, one whose horizon passed without is a miss. A band's probability is its
hits plus ``PRIOR_SECONDS`` of the prior over its judged polls plus the same, each poll
weighed by its interval (so a faster poll does not count for more; at most
``MAX_WEIGHT``: a longer wait is a gap), and the bands are kept in order (pool-adjacent
violators): bursts that peaked and drained here lower the odds of the next, preemptions
raise them. What was learnt decays with a half-life of
``HALF_LIFE_SECONDS``, so a deployment whose traffic changed forgets it; memory is the
bands' two sums and the polls still waiting for their horizon (at most horizon / poll
interval). A restart keeps nothing: the engine starts from the prior again, as it would
on a new pod.

vLLM counts a preemption when the preempted request is scheduled again, seconds after the
event: a hit is credited to the polls within the horizon before the count, the few polls
between event and count included.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

# The score's bands (the reliability table's) and, for each, the share of dev fuzz polls
# a preemption followed within the horizon.
BANDS = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9)
PRIOR = (0.011, 0.021, 0.034, 0.041, 0.046, 0.137)  # 281,000 polls of the stop-44 tier
PRIOR_SECONDS = 1800.0  # the prior weighs as much as half an hour of polls in the band
HALF_LIFE_SECONDS = 86400.0  # a day: what was learnt fades as traffic changes
# A poll stands for at most this much polling: a longer wait since the last one is a gap
# (vLLM did not answer, the sidecar was stalled), not time spent at this score.
MAX_WEIGHT = 60.0


def band(score: float, bands: Sequence[float] = BANDS) -> int:
    """The band a score falls in (each holds its lower bound; the last, 0.9 and up)."""
    i = 0
    while i + 1 < len(bands) and score >= bands[i + 1]:
        i += 1
    return i


def _ordered(values: Sequence[float], weights: Sequence[float]) -> list[float]:
    """Pool-adjacent violators: the closest non-decreasing sequence (weighted)."""
    blocks: list[list[float]] = []  # [value, weight, count]
    for v, w in zip(values, weights, strict=True):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, n2 = blocks.pop()
            v1, w1, n1 = blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    out: list[float] = []
    for v, _w, n in blocks:
        out += [v] * int(n)
    return out


@dataclass
class _Poll:
    t: float
    band: int
    weight: float  # seconds of polling it stands for


class Odds:
    """One engine's calibrated probability. ``observe`` each poll (in time order) with its
    score and vLLM's preemption counter; ``probability`` maps a score to the chance of a
    preemption within the horizon, as this engine has shown it so far."""

    def __init__(
        self,
        horizon: float,
        prior: Sequence[float] = PRIOR,
        bands: Sequence[float] = BANDS,
        prior_seconds: float = PRIOR_SECONDS,
        half_life: float = HALF_LIFE_SECONDS,
    ) -> None:
        # Other bands, prior weights and half-lives judge polls the same way: the page's
        # variants in benchmarks/page_variants.py do.
        self.horizon = horizon
        self.prior = tuple(prior)
        self.bands = tuple(bands)
        self.prior_seconds = prior_seconds
        self.half_life = half_life
        self._hits = [0.0] * len(self.bands)
        self._seen = [0.0] * len(self.bands)
        self._pending: deque[_Poll] = deque()
        self._last_t: float | None = None
        self._counted: float | None = None
        self._table: list[float] | None = None

    def observe(self, t: float, score: float, preemptions_counted: float) -> None:
        if self._last_t is not None:
            decay = 0.5 ** ((t - self._last_t) / self.half_life)
            self._hits = [h * decay for h in self._hits]
            self._seen = [s * decay for s in self._seen]
        weight = 0.0 if self._last_t is None else min(max(0.0, t - self._last_t), MAX_WEIGHT)
        self._last_t = t
        counted = preemptions_counted
        if self._counted is not None and counted < self._counted:
            self._counted = None  # vLLM restarted: its counter with it
        if self._counted is not None and counted > self._counted:
            # A preemption counted now: every poll still within its horizon saw one coming.
            for p in self._pending:
                self._hits[p.band] += p.weight
                self._seen[p.band] += p.weight
            self._pending.clear()
        self._counted = counted
        while self._pending and self._pending[0].t <= t - self.horizon:
            p = self._pending.popleft()
            self._seen[p.band] += p.weight
        if weight > 0 and math.isfinite(score):
            self._pending.append(_Poll(t, band(score, self.bands), weight))
        self._table = None

    def table(self) -> list[float]:
        """Each band's probability, in order."""
        if self._table is None:
            raw = [
                (h + self.prior_seconds * p) / (s + self.prior_seconds)
                for h, s, p in zip(self._hits, self._seen, self.prior, strict=True)
            ]
            self._table = _ordered(raw, [s + self.prior_seconds for s in self._seen])
        return self._table

    def probability(self, score: float) -> float:
        return self.table()[band(score, self.bands)]

    def record(self, i: int) -> tuple[float, float]:
        """Band ``i``'s judged polls as they stand (decayed): the seconds a preemption
        followed, and all the seconds judged."""
        return self._hits[i], self._seen[i]


class EngineOdds:
    """Each engine's ``Odds``, as the poll loop keeps them: ``observe`` a poll's score and
    counted preemptions, read back the calibrated probability of that score. A vLLM
    restart (a new epoch) starts the engine from the prior again, as the module says."""

    def __init__(self, horizon: float) -> None:
        self.horizon = horizon
        self._engines: dict[str, tuple[int, Odds]] = {}

    def observe(self, engine: str, epoch: int, t: float, score: float, counted: float) -> float:
        kept = self._engines.get(engine)
        if kept is None or kept[0] != epoch:
            kept = self._engines[engine] = (epoch, Odds(self.horizon))
        odds = kept[1]
        odds.observe(t, score, counted)
        return odds.probability(score)
