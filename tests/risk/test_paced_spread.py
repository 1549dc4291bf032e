"""The spread of a queue that waits for prefill compute (``paced_factor``): tokens enter the
cache at the engine's pace, so only the decode lengths' spread moves the occupancy."""

from __future__ import annotations

import bisect
import math
import random
import statistics

from exporter.capacity.histogram import Histogram
from exporter.risk.model import paced_factor

FINE = tuple(float(b) for b in range(5, 5001, 5))  # buckets fine enough to test the algebra


def histogram(values: list[float], bounds: tuple[float, ...] = FINE) -> Histogram:
    ordered = sorted(values)
    counts = tuple(float(bisect.bisect_right(ordered, b)) for b in bounds)
    return Histogram(bounds, (*counts, float(len(values))), sum(values), float(len(values)))


def test_the_factor_is_one_half_for_exponential_decode_lengths() -> None:
    rng = random.Random(7)
    lengths = [rng.expovariate(1 / 200) for _ in range(20_000)]
    assert math.isclose(paced_factor(histogram(lengths)), 0.5, abs_tol=0.03)


def test_the_factor_is_near_zero_when_every_request_decodes_as_long() -> None:
    assert paced_factor(histogram([300.0] * 1000)) < 0.02


def test_the_factor_is_one_with_nothing_measured() -> None:
    assert paced_factor(None) == 1.0
    assert paced_factor(Histogram((10.0,), (0.0, 0.0), 0.0, 0.0)) == 1.0


def occupancy_variance(paced: bool, rng: random.Random) -> tuple[float, list[float]]:
    """The KV occupancy's variance, sampled at random times, for requests of lognormal
    prompts and decode lengths arriving at the same token rate: at random (Poisson) or back
    to back (a prompt's blocks filled as its chunks are prefilled)."""
    rate, step = 1000.0, 0.02  # tokens prefilled a second; seconds a decode step
    t, requests, lengths = 0.0, [], []
    for _ in range(30_000):
        prompt = rng.lognormvariate(math.log(1500), 0.5)
        generation = rng.lognormvariate(math.log(100), 1.0)
        prefill = prompt / rate if paced else 0.0
        if not paced:
            t += rng.expovariate(rate / 1500 / math.exp(0.125))  # the same tokens a second
        requests.append((t, prompt, prefill, t + prefill + generation * step))
        t += prefill  # paced: the next prompt starts where this one's prefill ends
        lengths.append(generation)
    starts = [r[0] for r in requests]
    longest = max(r[3] - r[0] for r in requests)
    samples = []
    for _ in range(6000):
        now = rng.uniform(0.2 * t, 0.8 * t)
        lo, hi = bisect.bisect_left(starts, now - longest), bisect.bisect_right(starts, now)
        samples.append(
            sum(
                min(p, (now - a) / f * p) if f > 0 and now < a + f else p
                for a, p, f, end in requests[lo:hi]
                if end > now
            )
        )
    return statistics.pvariance(samples), lengths


def test_the_factor_matches_a_simulation_of_admission_at_the_engines_pace() -> None:
    rng = random.Random(11)
    paced, lengths = occupancy_variance(True, rng)
    at_random, _ = occupancy_variance(False, rng)
    # Measured with this seed: 0.519 of the random arrivals' variance, against 0.526.
    assert math.isclose(paced / at_random, paced_factor(histogram(lengths)), rel_tol=0.1)
