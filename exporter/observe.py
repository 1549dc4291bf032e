"""Observations and their bounded history, with counters that survive vLLM restarts.

vLLM's counters and histograms restart from zero with the process. Each observation keeps
``Totals``: everything counted *since the sidecar started*, advanced by the increase
between two reads (the new value itself when it went down: a restart), so a window's
delta is one subtraction and never negative. ``fold`` is the one place that decides a
restart happened (a new start time, counters going backwards, a re-sized cache) and turns
a page into the next observation. Pure.
"""

from __future__ import annotations

import functools
import itertools
from bisect import bisect_left
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from operator import add, attrgetter

from exporter.cache_config import CacheConfig
from exporter.capacity.histogram import Histogram, histogram_delta
from exporter.labels import MAX_ENGINES
from exporter.risk.model import Point
from exporter.sources.vllm_page import EngineMetrics, VllmPage

# Per-engine counter state is kept across polls so totals survive restarts; engines that
# stop appearing are forgotten, least recently seen first, beyond this many.
MAX_TRACKED_ENGINES = 2 * MAX_ENGINES

_COUNTERS = (
    "preemptions",
    "prompt_tokens",
    "generation_tokens",
    "requests_finished",
    "prefix_queries",
    "prefix_hits",
)
_HISTOGRAMS = ("prompt_len", "generation_len", "max_tokens_param", "n_param")


@dataclass(frozen=True)
class Totals:
    """Counts since the sidecar started, per engine (monotonic across vLLM restarts)."""

    preemptions: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    requests_finished: float = 0.0
    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    prompt_len: Histogram | None = None
    generation_len: Histogram | None = None
    max_tokens_param: Histogram | None = None
    n_param: Histogram | None = None


def _increase(now: float | None, before: float | None) -> float:
    if now is None or before is None:
        return 0.0
    return now - before if now >= before else now


def _add(total: Histogram | None, delta: Histogram | None) -> Histogram | None:
    if delta is None:
        return total
    if total is None or total.bounds != delta.bounds:
        return delta
    if len(total.counts) != len(delta.counts):
        raise ValueError("_add: bucket counts of different lengths")
    return Histogram(
        total.bounds,
        tuple(map(add, total.counts, delta.counts)),  # map() in C: one call a histogram
        total.sum + delta.sum,
        total.count + delta.count,
    )


def restarted(before: EngineMetrics, now: EngineMetrics) -> bool:
    """Did a counter go backwards between two reads of the same engine?"""
    for name in _COUNTERS:
        a, b = getattr(before, name), getattr(now, name)
        if a is not None and b is not None and b < a:
            return True
    for name in _HISTOGRAMS:
        a, b = getattr(before, name), getattr(now, name)
        if a is not None and b is not None and b.count < a.count:
            return True
    return False


def advance(
    total: Totals | None,
    before: EngineMetrics | None,
    now: EngineMetrics,
    reset: bool | None = None,
) -> Totals:
    """The totals after one more read of an engine. The first read counts nothing.

    ``reset``: whether the engine restarted between the reads, when the caller already
    knows (``fold`` asks once per engine and poll); else it is worked out here.
    """
    total = total or Totals()
    if before is None:
        return total
    if reset is None:
        reset = restarted(before, now)
    counters = {
        name: getattr(total, name) + _increase(getattr(now, name), getattr(before, name))
        for name in _COUNTERS
    }
    histograms = {}
    for name in _HISTOGRAMS:
        cur, prev = getattr(now, name), getattr(before, name)
        delta = cur if reset else histogram_delta(cur, prev)
        if prev is None and not reset:
            delta = None  # a family that just appeared: its past is not ours to count
        histograms[name] = _add(getattr(total, name), delta)
    return Totals(**counters, **histograms)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Observation:
    """One poll: when, what vLLM said (None if it could not be read), and the totals."""

    time: float
    page: VllmPage | None
    totals: Mapping[str, Totals] = field(default_factory=dict)
    epoch: int = 0  # counts vLLM restarts seen: trends never span one

    @functools.cached_property
    def points(self) -> Mapping[str, Point]:
        """The risk model's view of each engine that answered with a usage figure.

        Built once per observation and kept with it in the history: every poll's risk
        reads the last five minutes of these, and rebuilding them each poll (one scan of
        the page per engine per observation) was the largest part of a poll.
        """
        if self.page is None:
            return {}
        out: dict[str, Point] = {}
        seen: set[str] = set()  # the first read of an engine is its read (VllmPage.engine)
        for raw in self.page.engines:
            if raw.engine in seen:
                continue
            seen.add(raw.engine)
            totals = self.totals.get(raw.engine)
            if totals is None or raw.kv_usage is None:
                continue
            out[raw.engine] = Point(
                self.time,
                raw.kv_usage,
                raw.running or 0.0,
                raw.waiting or 0.0,
                totals.requests_finished,
                totals.generation_tokens,
                self.epoch,
                totals.prompt_tokens,
                totals.preemptions,
            )
        return out


# The cache_config_info figures that size the cache: only a restart changes them.
_CAPACITY_FIELDS = ("num_gpu_blocks", "block_size", "kv_cache_memory_bytes", "cache_dtype")


def capacity_changes(before: EngineMetrics, now: EngineMetrics) -> dict[str, str]:
    """The cache_config_info figures that size the cache and differ between two reads."""
    a, b = before.cache_config or CacheConfig(), now.cache_config or CacheConfig()
    changed = {k: (getattr(a, k), getattr(b, k)) for k in _CAPACITY_FIELDS}
    return {k: f"{x} → {y}" for k, (x, y) in changed.items() if x != y}


@dataclass(frozen=True)
class Folder:
    """What folding remembers between polls: each engine's last read (least recently seen
    first) and totals, vLLM's process start time, and how many restarts were seen."""

    raw: Mapping[str, EngineMetrics] = field(default_factory=dict)
    totals: Mapping[str, Totals] = field(default_factory=dict)
    start_time: float | None = None
    epoch: int = 0


@dataclass(frozen=True)
class Fold:
    """One poll folded: the next folder, the observation, and why vLLM restarted (if so)."""

    folder: Folder
    observation: Observation
    restart_reasons: tuple[str, ...] = ()
    # (engine, {label: "before → now"}) for each engine whose cache was re-sized.
    cache_changes: tuple[tuple[str, Mapping[str, str]], ...] = ()

    @property
    def restarted(self) -> bool:
        return bool(self.restart_reasons)


def fold(folder: Folder, now: float, page: VllmPage | None) -> Fold:
    """The observation of one poll, and the folder for the next one."""
    if page is None:
        return Fold(folder, Observation(now, None, folder.totals, folder.epoch))
    reasons: list[str] = []
    start = folder.start_time
    if start is not None and page.process_start_time not in (None, start):
        reasons.append("process_start_time_seconds changed")
    if page.process_start_time is not None:  # 0.0 is a start time too, not a missing one
        start = page.process_start_time
    raw = dict(folder.raw)
    totals = dict(folder.totals)
    changes: list[tuple[str, Mapping[str, str]]] = []
    for read in page.engines:
        before = raw.pop(read.engine, None)  # re-inserted below: the most recently seen
        reset = before is not None and restarted(before, read)
        if reset:
            reasons.append(f"engine {read.engine}: counters went backwards")
        if before is not None:
            changed = capacity_changes(before, read)
            if changed:
                # Only a restart re-sizes the cache, even one the counters do not show.
                changes.append((read.engine, changed))
                reasons.append(f"engine {read.engine}: cache_config_info changed")
        totals[read.engine] = advance(totals.get(read.engine), before, read, reset)
        raw[read.engine] = read
    while len(raw) > MAX_TRACKED_ENGINES:
        gone = next(iter(raw))
        del raw[gone]
        totals.pop(gone, None)
    epoch = folder.epoch + 1 if reasons else folder.epoch
    return Fold(
        Folder(raw, totals, start, epoch),
        Observation(now, page, totals, epoch),
        tuple(reasons),
        tuple(changes),
    )


_TIME = attrgetter("time")
_T = attrgetter("t")


class History:
    """A bounded ring of observations, oldest first."""

    def __init__(self, keep_seconds: float, max_len: int) -> None:
        self._keep = keep_seconds
        self._ring: deque[Observation] = deque(maxlen=max_len)
        # Each engine's risk-model points, oldest first, kept as observations come and go:
        # every poll reads the last minutes of them, and gathering them from the
        # observations was a scan of the whole ring per engine per poll.
        self._series: dict[str, deque[Point]] = {}

    def __len__(self) -> int:
        return len(self._ring)

    def __iter__(self) -> Iterator[Observation]:
        return iter(self._ring)

    def append(self, obs: Observation) -> None:
        if len(self._ring) == self._ring.maxlen:
            self._forget(self._ring[0], oldest=True)  # the ring is about to drop it
        self._ring.append(obs)
        for engine, point in obs.points.items():
            self._series.setdefault(engine, deque()).append(point)
        while self._ring and self._ring[0].time < obs.time - self._keep:
            self._forget(self._ring.popleft(), oldest=True)

    def drop_latest(self) -> None:
        """Forget the newest observation (one whose poll failed half-way)."""
        if self._ring:
            self._forget(self._ring.pop(), oldest=False)

    def _forget(self, obs: Observation, *, oldest: bool) -> None:
        for engine in obs.points:
            series = self._series[engine]
            series.popleft() if oldest else series.pop()
            if not series:
                del self._series[engine]

    def points(self, engine: str, since: float) -> list[Point]:
        """One engine's points no older than ``since``, oldest first."""
        series = self._series.get(engine)
        if not series:
            return []
        return list(itertools.islice(series, bisect_left(series, since, key=_T), None))

    @property
    def latest(self) -> Observation | None:
        return self._ring[-1] if self._ring else None

    def last_good(self) -> Observation | None:
        """The newest observation in which vLLM answered."""
        for obs in reversed(self._ring):
            if obs.page is not None:
                return obs
        return None

    def at_or_after(self, when: float) -> Observation | None:
        """The oldest observation no older than ``when`` (the start of a window)."""
        i = self._first_at_or_after(when)
        return self._ring[i] if i < len(self._ring) else None

    def recent(self, since: float) -> list[Observation]:
        """The observations no older than ``since``, oldest first."""
        return list(itertools.islice(self._ring, self._first_at_or_after(since), None))

    def _first_at_or_after(self, when: float) -> int:
        # Times never decrease: a bisection every poll, not a scan of the whole ring
        # (450 observations at the defaults).
        return bisect_left(self._ring, when, key=_TIME)
