"""The stack run's ramp is sized by the cache, and bounded by what the server has done."""

from __future__ import annotations

import math

from exporter.risk.model import TREND_MIN_SECONDS
from tests.e2e.stack import (
    ANSWER,
    ARCHITECTURES,
    FILLS,
    MIN_FILL_S,
    PROMPT,
    RAMP_CEILING_S,
    SAFE_S,
    STEP_S,
    TREND_MARGIN_S,
    clients,
    most_clients,
    ramp_bound,
    safe_phase,
)
from tests.e2e.vllm_harness import Sample


def sample(t: float, generated: float) -> Sample:
    return Sample(t=t, usage=0.5, running=4, waiting=0, preemptions=0, generated=generated)


def test_the_most_clients_hold_twice_the_cache_with_their_shortest_requests() -> None:
    for arch in ARCHITECTURES:
        most = most_clients(arch.tokens)
        assert most * (PROMPT[0] + ANSWER[0]) >= 2 * arch.tokens
        assert (most - 1) * (PROMPT[0] + ANSWER[0]) < 2 * arch.tokens


def test_the_ramp_adds_a_client_every_step_until_the_most() -> None:
    tokens = ARCHITECTURES[0].tokens
    assert clients(0.0, tokens) == clients(SAFE_S - 1, tokens) == 1
    assert clients(SAFE_S, tokens) == 2
    assert clients(SAFE_S + 3 * STEP_S, tokens) == 5
    assert clients(1e6, tokens) == most_clients(tokens)


def test_the_ramp_waits_until_the_sidecar_can_project_a_trend() -> None:
    # the ramp's first step comes at least TREND_MARGIN_S after the trend's least history
    for history in (0.0, None, 30.0, TREND_MIN_SECONDS):
        assert (history or 0.0) + safe_phase(history) >= TREND_MIN_SECONDS + TREND_MARGIN_S
        assert safe_phase(history) >= SAFE_S  # and the safe load runs its whole check


def test_a_later_ramp_adds_its_clients_and_ends_as_much_later() -> None:
    tokens, safe = ARCHITECTURES[0].tokens, SAFE_S + 45.0
    assert clients(safe - 1, tokens, safe) == 1
    assert clients(safe, tokens, safe) == 2
    fast = [sample(0, 0), sample(100, 100 * 1_000)]
    assert ramp_bound(fast, tokens, safe) == ramp_bound(fast, tokens) + 45.0


def test_the_ramp_bound_gives_a_slower_server_more_time() -> None:
    tokens = 6_144
    last_client = SAFE_S + (most_clients(tokens) - 2) * STEP_S
    fast = ramp_bound([sample(0, 0), sample(100, 100 * 1_000)], tokens)
    slow = ramp_bound([sample(0, 0), sample(100, 100 * 200)], tokens)
    assert fast == last_client + max(MIN_FILL_S, FILLS * tokens / 1_000)
    assert slow == last_client + FILLS * tokens / 200
    assert slow > fast


def test_a_server_that_generates_nothing_stops_at_the_ceiling() -> None:
    assert ramp_bound([sample(0, 0), sample(100, 0)], 6_144) == RAMP_CEILING_S
    assert ramp_bound([sample(0, 0)], 6_144) == RAMP_CEILING_S
    assert math.isfinite(RAMP_CEILING_S)
