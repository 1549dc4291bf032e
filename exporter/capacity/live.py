"""Live capacity: what the running server holds, and what fits at the contexts it really sees.

Pure functions of what vLLM reports (its cache config, usage, histograms over a window)
and of the KV layout the capacity engine built for the model. Definitions:

* used / free tokens are KV slots: ``usage × (num_blocks − 1) × block_size`` — vLLM's
  usage counts whole blocks over the blocks a request can use (one is its null block).
* the context distribution is prompt + generation of the requests that finished in the
  window (histogram deltas, so a shift shows within minutes). Its quantile ``q`` is read as
  ``Q_prompt(q) + Q_generation(q)`` — exact when long prompts get long answers, and always
  between ``max(Q_prompt(q), Q_generation(q))`` and ``Q_prompt(q') + Q_generation(q')`` with
  ``q' = (1 + q) / 2`` (for p95: p97.5 + p97.5), since P(P + G > a + b) ≤ P(P > a) + P(G > b).
  Quantiles interpolate inside buckets as Prometheus's ``histogram_quantile`` does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from exporter.capacity.histogram import Histogram, histogram_quantile
from exporter.capacity.kvcache import Layout, cdiv

CONTEXTS = ("mean", "p50", "p95", "p99", "max_model_len")
QUANTILES = {"p50": 0.5, "p95": 0.95, "p99": 0.99}


@dataclass(frozen=True)
class ContextStats:
    """Tokens per finished request (prompt + generation) over the window."""

    requests: float
    mean: float
    quantiles: Mapping[str, float]  # p50/p95/p99 of prompt + generation
    prompt_quantiles: Mapping[str, float]
    generation_quantiles: Mapping[str, float]


def context_stats(prompt: Histogram | None, generation: Histogram | None) -> ContextStats | None:
    if prompt is None or generation is None or prompt.count <= 0:
        return None
    pq, gq = {}, {}
    for label, q in QUANTILES.items():
        p, g = histogram_quantile(q, prompt), histogram_quantile(q, generation)
        if p is None or g is None:
            return None
        pq[label], gq[label] = p, g
    return ContextStats(
        requests=prompt.count,
        mean=(prompt.sum + generation.sum) / prompt.count,
        quantiles={label: pq[label] + gq[label] for label in QUANTILES},
        prompt_quantiles=pq,
        generation_quantiles=gq,
    )


def blocks_per_sequence(layout: Layout | None, block_size: int, tokens: float) -> int:
    """Blocks one sequence of ``tokens`` pins (with a drafter's lookahead slots, where the
    layout has them); without a layout, full attention is assumed."""
    length = max(1, math.ceil(tokens))
    if layout is None:
        return cdiv(length, block_size)
    return layout.blocks_per_request(layout.running_tokens(length), 0)


@dataclass(frozen=True)
class Occupancy:
    num_blocks: int
    block_size: int
    usage: float  # 0-1 as vLLM reports it
    running: float

    @property
    def usable_blocks(self) -> int:
        return max(0, self.num_blocks - 1)

    @property
    def used_blocks(self) -> int:
        return round(min(1.0, max(0.0, self.usage)) * self.usable_blocks)

    @property
    def free_blocks(self) -> int:
        return self.usable_blocks - self.used_blocks

    @property
    def used_tokens(self) -> int:
        return self.used_blocks * self.block_size

    @property
    def free_tokens(self) -> int:
        return self.free_blocks * self.block_size

    @property
    def tokens_per_running_sequence(self) -> float | None:
        return self.used_tokens / self.running if self.running > 0 else None


def context_tokens(stats: ContextStats | None, max_model_len: int | None) -> dict[str, float]:
    """Tokens per sequence at each context label that is known."""
    out: dict[str, float] = {}
    if stats is not None:
        out["mean"] = stats.mean
        out.update(stats.quantiles)
    if max_model_len:
        out["max_model_len"] = float(max_model_len)
    return out


def ceilings(
    occupancy: Occupancy, layout: Layout | None, contexts: Mapping[str, float]
) -> tuple[dict[str, int], dict[str, int]]:
    """Sequences that fit in the whole pool, and in what is free now, at each context."""
    total, free = {}, {}
    for label, tokens in contexts.items():
        per = blocks_per_sequence(layout, occupancy.block_size, tokens)
        total[label] = occupancy.usable_blocks // per
        free[label] = occupancy.free_blocks // per
    return total, free


def ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator > 0 else None
