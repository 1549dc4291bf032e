"""The longest recent prompt, as the bottleneck gauge reads it from vLLM's length buckets."""

from __future__ import annotations

from exporter.capacity.histogram import Histogram
from exporter.snapshot import _longest

BOUNDS = (1000.0, 2000.0, 5000.0, 10000.0, 20000.0)  # 1-2-5 up to a 32,768 max_model_len


def test_the_longest_prompt_is_the_upper_bound_of_the_highest_bucket_holding_one() -> None:
    h = Histogram(BOUNDS, (3.0, 5.0, 9.0, 9.0, 9.0, 9.0), 20_000.0, 9.0)
    assert _longest(h, 32_768) == 5000.0


def test_a_prompt_past_the_last_bucket_is_at_most_max_model_len() -> None:
    h = Histogram(BOUNDS, (3.0, 5.0, 9.0, 9.0, 9.0, 10.0), 50_000.0, 10.0)
    assert _longest(h, 32_768) == 32_768.0
    assert _longest(h, None) == 20000.0


def test_no_prompt_seen_has_no_longest() -> None:
    assert _longest(None, 32_768) is None
    assert _longest(Histogram(BOUNDS, (0.0,) * 6, 0.0, 0.0), 32_768) is None
