"""The sidecar's own recent history, for the status page's chart.

One ``TrailPoint`` per snapshot, thinned to at most one per ``spacing`` seconds (plus the
newest, so the chart always ends at the latest poll) and kept for ``seconds``, so the ring
holds a fixed number of points whatever the poll interval: a 100 ms poll and a 10 s poll
both draw the last half hour. Preemptions are noticed on every snapshot, kept or not, so
the last one is never thinned away.

The poller owns one ``Trail`` (state, kept where the poll loop's other state is): it adds
each new snapshot, and the status page reads its points.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from exporter.snapshot import Snapshot

TRAIL_SECONDS = 1800.0  # the chart's span: half an hour
TRAIL_POINTS = 600  # at most, over that span: one every 3 s


@dataclass(frozen=True)
class TrailPoint:
    time: float
    kv_usage: float | None  # 0-1, as vLLM reports it
    used_tokens: int | None
    capacity_tokens: int | None  # usable tokens: the cache's size less vLLM's reserved block
    risk: float | None  # None while the risk model has no opinion
    running: float | None
    waiting: float | None
    preemptions_total: float


def point_of(snap: Snapshot) -> TrailPoint | None:
    """Engine 0's figures in ``snap``; None before vLLM has answered."""
    if not snap.engines:
        return None
    v = snap.engines[0]
    occ = v.occupancy
    risk = getattr(v.risk, "preemption_risk", None)
    return TrailPoint(
        time=snap.time,
        kv_usage=v.kv_usage,
        used_tokens=occ.used_tokens if occ is not None else None,
        capacity_tokens=occ.usable_blocks * occ.block_size if occ is not None else None,
        risk=float(risk) if risk is not None else None,
        running=v.running,
        waiting=v.waiting,
        preemptions_total=v.preemptions_total,
    )


class Trail:
    """A bounded ring of chart points and the time of the last preemption seen."""

    def __init__(self, seconds: float = TRAIL_SECONDS, max_points: int = TRAIL_POINTS) -> None:
        self.seconds = seconds
        self.spacing = seconds / max_points
        self._points: deque[TrailPoint] = deque(maxlen=max_points)
        self._head: TrailPoint | None = None  # the newest point, when thinned away
        self._preemptions: float | None = None
        self.last_preemption: float | None = None  # when a poll first saw the count rise

    def add(self, snap: Snapshot) -> None:
        point = point_of(snap)
        if point is None:
            return
        if self._preemptions is not None and point.preemptions_total > self._preemptions:
            self.last_preemption = point.time
        self._preemptions = point.preemptions_total
        last = self._points[-1] if self._points else None
        if last is not None and 0 <= point.time - last.time < self.spacing:
            # Not kept, but shown as the newest point until the next one is kept, so the
            # chart ends where the page's headline figures are.
            self._head = point
            return
        self._points.append(point)
        self._head = None
        while self._points and self._points[0].time < point.time - self.seconds:
            self._points.popleft()

    def points(self) -> tuple[TrailPoint, ...]:
        return (*self._points, self._head) if self._head is not None else tuple(self._points)
