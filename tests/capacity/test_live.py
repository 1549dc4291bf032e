"""Live capacity figures: histogram windows and quantiles, occupancy, ceilings."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from exporter.capacity.histogram import Histogram, histogram_delta, histogram_quantile
from exporter.capacity.live import Occupancy, ceilings, context_stats

BOUNDS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0)


def hist(counts: Sequence[float], total_sum: float) -> Histogram:
    return Histogram(BOUNDS, tuple(counts), total_sum, counts[-1])


def test_quantile_interpolates_inside_the_bucket_like_prometheus() -> None:
    h = hist([0, 0, 0, 0, 0, 0, 0, 0, 10, 10, 10, 10], 4000)  # all in (200, 500]
    assert histogram_quantile(0.5, h) == pytest.approx(350)


def test_quantile_in_the_inf_bucket_is_the_largest_finite_bound() -> None:
    h = hist([0] * 11 + [5], 50000)
    assert histogram_quantile(0.95, h) == 2000


def test_empty_histogram_has_no_quantile() -> None:
    assert histogram_quantile(0.5, hist([0] * 12, 0)) is None


def test_window_delta_subtracts_bucket_by_bucket() -> None:
    then = hist([0] * 8 + [5, 5, 5, 5], 1500)
    now = hist([0] * 8 + [5, 12, 12, 12], 8000)
    d = histogram_delta(now, then)
    assert d is not None
    assert d.count == 7
    assert d.counts[8] == 0
    assert d.sum == 6500


def test_window_delta_after_a_restart_is_the_new_histogram() -> None:
    then = hist([0] * 8 + [50] * 4, 15000)
    now = hist([0] * 8 + [3] * 4, 900)
    assert histogram_delta(now, then) == now


def test_context_is_prompt_plus_generation_quantile_and_exact_mean() -> None:
    prompt = hist([0] * 8 + [10] * 4, 3000)  # (200, 500]
    gen = hist([0] * 9 + [10] * 3, 7000)  # (500, 1000]
    stats = context_stats(prompt, gen)
    assert stats is not None
    assert stats.mean == 1000
    assert stats.quantiles["p50"] == pytest.approx(350 + 750)


def test_occupancy_counts_slots_over_usable_blocks() -> None:
    occ = Occupancy(num_blocks=48, block_size=128, usage=0.5, running=4)
    assert occ.usable_blocks == 47
    assert occ.used_blocks == 24
    assert occ.used_tokens == 24 * 128
    assert occ.free_tokens == 23 * 128
    assert occ.tokens_per_running_sequence == 24 * 128 / 4


def test_ceilings_count_whole_sequences_in_the_pool_and_in_what_is_free() -> None:
    occ = Occupancy(num_blocks=48, block_size=128, usage=0.5, running=4)
    total, free = ceilings(occ, None, {"p95": 2048.0, "p50": 600.0})
    assert total == {"p95": 2, "p50": 9}
    assert free == {"p95": 1, "p50": 4}


def test_no_running_sequence_has_no_tokens_per_sequence() -> None:
    assert Occupancy(10, 16, 0.0, 0).tokens_per_running_sequence is None
