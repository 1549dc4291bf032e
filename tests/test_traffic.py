"""Headroom in units of traffic: coupled scaling, the replay's verdict, the search."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path

import pytest

from exporter.plan.traffic import (
    COPY_SPREAD_SECONDS,
    DEFAULT_MAX_QUEUE_WAIT,
    Outcome,
    Traffic,
    assess_traffic,
    load_traffic,
    parallel_replays,
    replay,
    search,
    split_traffic,
)
from exporter.simulator.engine import EngineConfig
from exporter.simulator.scenario import Arrival

TRACE = Path(__file__).parent / "fixtures" / "traces" / "mooncake-conversation-10m.jsonl"


def outcome(m: float, held: bool) -> Outcome:
    return Outcome(m, 0, 0, None, 0.0, 0.0, {"p95": 0.0}, {}, 0.0, 0.0, True, held)


def test_search_brackets_the_threshold_within_the_precision() -> None:
    limit = search(lambda m: outcome(m, m <= 3.3), precision=0.02)
    assert limit.held is not None
    assert limit.failed is not None
    assert limit.held <= 3.3 < limit.failed
    assert limit.failed / limit.held - 1 <= 0.02


def test_search_goes_below_one_when_today_already_fails() -> None:
    limit = search(lambda m: outcome(m, m <= 0.3), precision=0.05)
    assert limit.held is not None
    assert 0.3 / 1.05 <= limit.held <= 0.3


def test_search_says_unbounded_when_the_largest_multiple_holds() -> None:
    limit = search(lambda m: outcome(m, True))
    assert limit.failed is None
    assert limit.precision is None


def test_search_says_nothing_holds_when_the_smallest_multiple_fails() -> None:
    limit = search(lambda m: outcome(m, False))
    assert limit.held is None
    assert limit.failed is not None


def test_search_from_a_guess_needs_fewer_probes_than_from_one() -> None:
    def holds(m: float) -> Outcome:
        return outcome(m, m <= 5.1)

    cold = search(holds, precision=0.05)
    warm = search(holds, precision=0.05, start=5.0, step=1.25)
    assert len(warm.probes) < len(cold.probes)


def arrivals(n: int, **kw: object) -> list[Arrival]:
    return [Arrival(float(i), 100, 10, **kw) for i in range(n)]  # type: ignore[arg-type]


def test_a_larger_multiple_keeps_every_request_a_smaller_one_keeps() -> None:
    traffic = Traffic.of("t", arrivals(500), seed=3)
    smaller = {(a.time, a.prompt) for a in traffic.at(0.4)}
    larger = {(a.time, a.prompt) for a in traffic.at(0.7)}
    assert smaller
    assert smaller <= larger


def test_a_multiple_keeps_about_that_share_of_the_requests() -> None:
    traffic = Traffic.of("t", arrivals(2000), seed=1)
    assert len(traffic.at(2.5)) == pytest.approx(5000, rel=0.05)


def test_a_conversation_is_kept_or_dropped_whole() -> None:
    turns = [Arrival(float(i), 100 + 50 * i, 10, prefix_key=7, cache_len=400) for i in range(3)]
    others = [Arrival(float(i), 100 + 50 * i, 10, prefix_key=8, cache_len=400) for i in range(3)]
    traffic = Traffic.of("t", turns + others, seed=0)
    for m in (0.2, 0.5, 0.8):
        kept = [a.prefix_key for a in traffic.at(m)]
        assert kept.count(7) in (0, 3)
        assert kept.count(8) in (0, 3)


def test_a_copied_conversation_is_another_conversation_with_its_turns_in_order() -> None:
    turns = [Arrival(10.0 * i, 100 + 50 * i, 10, prefix_key=7, cache_len=400) for i in range(3)]
    copies = [a for a in Traffic.of("t", turns).at(2.0) if a.prefix_key != 7]
    assert len(copies) == 3
    assert len({a.prefix_key for a in copies}) == 1
    assert [a.prompt for a in sorted(copies, key=lambda a: a.time)] == [100, 150, 200]
    assert all(
        0 <= c.time - t.time < COPY_SPREAD_SECONDS for c, t in zip(copies, turns, strict=False)
    )


def test_a_copied_request_with_block_hashes_shares_no_prefix_block_with_its_original() -> None:
    shared_prompt = [
        Arrival(float(i), 256, 8, prefix_key=1, prefix_len=256, cache_len=256,
                block_hashes=(5, 6 + i), hash_tokens=128)
        for i in range(2)
    ]  # fmt: skip
    traffic = Traffic.of("t", shared_prompt).at(2.0)
    originals = [a.block_hashes for a in traffic if a.block_hashes[0] == 5]
    copies = [a.block_hashes for a in traffic if a.block_hashes[0] != 5]
    assert len(originals) == len(copies) == 2
    assert not {h for c in copies for h in c} & {5, 6, 7}
    assert len({c[0] for c in copies}) == 1  # the copies share their own first block


def test_twice_a_hashed_log_costs_about_twice_the_kv_cache_of_once() -> None:
    """Copies served from the original's prefix cache would cost no KV of their own."""
    traffic, _ = load_traffic(str(TRACE), columns={"hashes": "hash_ids"}, time_unit="ms")
    first = Traffic.of("1m", [a for a in traffic.base if a.time < 60.0])
    # Fast enough that nobody queues: the cache holds what arrives.
    big = dataclasses.replace(SMALL, num_blocks=200_000, max_model_len=200_000, max_num_seqs=512,
                              max_num_batched_tokens=65_536, per_prefill_token_s=1e-8)  # fmt: skip
    once = replay(first, big, 1.0, stop_after=None)
    twice = replay(first, big, 2.0, stop_after=None)
    assert twice.p95_kv_usage > 1.6 * once.p95_kv_usage


SMALL = EngineConfig(
    num_blocks=400,
    block_size=16,
    max_num_seqs=64,
    max_num_batched_tokens=2048,
    max_model_len=4096,
    step_base_s=0.02,
    per_prefill_token_s=1e-5,
    per_kv_token_s=1e-7,
)


def test_a_replay_that_preempts_does_not_hold() -> None:
    # 1,000-token prompts growing 1,000 tokens, one a second: far more than 400 blocks.
    traffic = Traffic.of("t", [Arrival(float(i), 1000, 1000) for i in range(60)])
    result = replay(traffic, SMALL, 1.0)
    assert result.preemptions > 0
    assert not result.held
    assert result.binding == "kv_cache"


def test_a_light_replay_holds_and_reports_its_figures() -> None:
    traffic = Traffic.of("t", [Arrival(float(i), 200, 50) for i in range(60)])
    result = replay(traffic, SMALL, 1.0)
    assert result.held
    assert result.complete
    assert result.preemptions == 0
    assert 0 < result.peak_kv_usage < 0.5
    assert result.queue_wait_seconds["p99"] < 1.0


def test_a_queue_over_the_bound_does_not_hold_without_preempting() -> None:
    # max_num_seqs 2 and long answers: the cache has room, the batch has not.
    config = EngineConfig(**{**SMALL.__dict__, "max_num_seqs": 2})
    traffic = Traffic.of("t", [Arrival(float(i), 100, 300) for i in range(40)])
    result = replay(traffic, config, 1.0, max_queue_wait=2.0)
    assert result.preemptions == 0
    assert not result.held
    assert result.binding == "max_num_seqs"


def test_a_request_log_reads_with_mapped_columns() -> None:
    traffic, scenario = load_traffic(str(TRACE), columns={"hashes": "hash_ids"}, time_unit="ms")
    assert len(traffic.base) == 1750
    assert traffic.span == pytest.approx(597.0, abs=3.0)
    assert any(a.block_hashes for a in traffic.base)
    assert scenario.traffic[0].hash_block_tokens == 512


def test_the_search_agrees_with_a_scan_of_multiples_on_a_real_log() -> None:
    """Done-when: within 10 % of brute force. Multiples 10 % and more below the answer
    all hold, and 10 % and more above all fail (a scan on a grid around it)."""
    traffic, _ = load_traffic(str(TRACE), columns={"hashes": "hash_ids"}, time_unit="ms")
    first = Traffic.of("2m", [a for a in traffic.base if a.time < 120.0])
    config = EngineConfig(
        num_blocks=8000,
        block_size=16,
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        max_model_len=32768,
        step_base_s=0.008,
        per_prefill_token_s=4e-6,
        per_kv_token_s=1e-8,
    )

    def run(m: float) -> Outcome:
        return replay(first, config, m)

    limit = search(run, precision=0.03)
    assert limit.held is not None
    assert limit.failed is not None
    for f in (0.5, 0.7, 0.9):
        assert run(limit.held * f).held, f"×{limit.held * f:.3f} should hold"
    for f in (1.1, 1.4):
        assert not run(limit.held * f).held, f"×{limit.held * f:.3f} should fail"
    assert math.isfinite(limit.held)


def test_a_wider_search_needs_fewer_rounds_for_the_same_precision() -> None:
    rounds: list[int] = []

    def many(ms: Sequence[float]) -> list[Outcome]:
        rounds.append(len(ms))
        return [outcome(m, m <= 7.7) for m in ms]

    limit = search(lambda m: outcome(m, m <= 7.7), precision=0.02, width=4, evaluate_many=many)
    narrow = search(lambda m: outcome(m, m <= 7.7), precision=0.02)
    assert limit.held is not None
    assert limit.failed is not None
    assert limit.held <= 7.7 < limit.failed
    assert limit.failed / limit.held - 1 <= 0.02
    assert len(rounds) + 1 < len(narrow.probes)


def test_parallel_replays_give_the_sequential_verdicts() -> None:
    traffic = Traffic.of("t", [Arrival(float(i), 400, 200) for i in range(60)])
    many, close = parallel_replays(traffic, SMALL, DEFAULT_MAX_QUEUE_WAIT, 2)
    try:
        pooled = many([0.5, 3.0])
    finally:
        close()
    alone = [replay(traffic, SMALL, m) for m in (0.5, 3.0)]
    assert [o.held for o in pooled] == [o.held for o in alone]
    assert [o.preemptions for o in pooled] == [o.preemptions for o in alone]


def test_a_what_if_search_from_a_guess_does_not_replay_one_times_the_traffic() -> None:
    # Light traffic that holds far above 1×: the search from a guess of 4× never needs 1×.
    traffic = Traffic.of("t", [Arrival(float(i), 200, 50) for i in range(60)])
    headroom = assess_traffic(traffic, SMALL, guess=4.0, report_at_one=False)
    assert headroom.at_one is None
    assert 1.0 not in [p.multiplier for p in headroom.limit.probes]
    assert headroom.limit.held is not None


def test_replicas_share_the_requests_round_robin_and_a_conversation_stays_on_one() -> None:
    talk = [
        Arrival(float(i), 100 + 50 * i, 10, prefix_key=7, cache_len=200 + 50 * i) for i in range(4)
    ]
    alone = [Arrival(i + 0.5, 100, 10) for i in range(4)]
    traffic = Traffic.of("t", sorted(talk + alone, key=lambda a: a.time), seed=1)
    shares = split_traffic(traffic, 2)
    assert sum(len(s.base) for s in shares) == len(traffic.base)
    owners = {i for i, s in enumerate(shares) for a in s.base if a.prefix_key == 7}
    assert len(owners) == 1  # every turn where the first went
    # A first turn takes its turn in the deal; the rest of the conversation follows it.
    assert [len(s.base) for s in shares] == [6, 2]
    # A share at 2× is its replica's part of the whole at 2×.
    whole = sorted((a.time, a.prompt) for a in traffic.at(2.0))
    parts = sorted((a.time, a.prompt) for s in shares for a in s.at(2.0))
    assert parts == whole
