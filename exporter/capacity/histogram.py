"""Cumulative histograms as vLLM exposes them: deltas over a window and quantiles."""

from __future__ import annotations

from dataclasses import dataclass
from operator import sub


@dataclass(frozen=True)
class Histogram:
    """A cumulative histogram: ``counts[i]`` observations ≤ ``bounds[i]``; last is +Inf."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]
    sum: float
    count: float


def histogram_delta(now: Histogram | None, then: Histogram | None) -> Histogram | None:
    """Observations between two cumulative histograms (``now`` alone after a reset)."""
    if now is None:
        return None
    if then is None or then.bounds != now.bounds or then.count > now.count:
        return now
    if len(now.counts) != len(then.counts):
        raise ValueError("histogram_delta: bucket counts of different lengths")
    # map() in C, and clamped only when a bucket went backwards: the same values, about
    # a third of the time of a generator of max() calls (nine deltas a poll per engine).
    counts = tuple(map(sub, now.counts, then.counts))
    if counts and min(counts) < 0.0:
        counts = tuple(max(0.0, c) for c in counts)
    return Histogram(now.bounds, counts, now.sum - then.sum, now.count - then.count)


def histogram_quantile(q: float, h: Histogram) -> float | None:
    """Prometheus ``histogram_quantile``: linear inside the bucket; None when empty."""
    if h.count <= 0:
        return None
    rank = q * h.count
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in zip(h.bounds, h.counts, strict=False):
        if count >= rank:
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (
                count - lower_count
            )
        lower_bound, lower_count = bound, count
    return h.bounds[-1] if h.bounds else None
