"""The engine's truth about why requests wait, its stall fault, and the prefix cache that
request logs drive (hashes, sessions)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from exporter.simulator.engine import Engine, EngineConfig
from exporter.simulator.scenario import parse_scenario
from exporter.simulator.simulation import Simulation


def engine(**overrides: int) -> Engine:
    cfg: dict[str, Any] = {"num_blocks": 101, "block_size": 16, "max_num_seqs": 8,
           "max_num_batched_tokens": 4096, "max_model_len": 4096, **overrides}  # fmt: skip
    return Engine(EngineConfig(**cfg))


def test_nobody_waiting_reads_none() -> None:
    e = engine()
    e.submit(100, 10)
    e.run_until(5.0)
    assert e.reason == "none"


def test_a_full_batch_reads_max_num_seqs() -> None:
    e = engine(max_num_seqs=2)
    for _ in range(4):
        e.submit(50, 500)
    e.run_until(0.5)
    assert e.waiting
    assert e.reason == "max_num_seqs"


def test_a_spent_token_budget_reads_compute() -> None:
    e = engine(max_num_batched_tokens=256)
    for _ in range(6):
        e.submit(1000, 4)
    e.step()
    assert e.waiting
    assert e.reason == "compute"


def test_a_spent_budget_with_a_head_the_free_blocks_would_not_hold_reads_kv_cache() -> None:
    e = engine(num_blocks=71, max_num_batched_tokens=256)  # 70 usable blocks
    e.submit(800, 4)  # 50 blocks, prefilled 256 tokens (16 blocks) a step
    e.submit(1000, 4)  # 63 blocks: the 54 left after the first step do not hold it
    e.step()
    assert e.waiting
    assert e.reason == "kv_cache"


def test_a_spent_budget_and_a_head_too_long_for_the_free_blocks_both_bind() -> None:
    e = engine(num_blocks=71, max_num_batched_tokens=256)  # as above: labelled kv_cache
    e.submit(800, 4)
    e.submit(1000, 4)
    e.step()
    assert set(e.binding_seconds) == {"kv_cache+compute"}
    assert e.binding_seconds["kv_cache+compute"] == e.request_seconds["kv_cache"]


def test_a_spent_budget_with_a_head_that_fits_binds_alone() -> None:
    e = engine(max_num_batched_tokens=256)
    for _ in range(6):
        e.submit(1000, 4)
    e.step()
    assert set(e.binding_seconds) == {"compute"}


def test_a_full_batch_whose_head_would_not_fit_either_binds_both() -> None:
    e = engine(num_blocks=41, max_num_seqs=1)  # 640 tokens: the second 400 would not fit
    e.submit(400, 200)
    e.submit(400, 200)
    e.run_until(0.5)
    assert e.reason == "max_num_seqs"
    assert set(e.binding_seconds) == {"kv_cache+max_num_seqs"}


def test_a_budget_spent_recomputing_a_preempted_request_reads_kv_cache() -> None:
    e = engine(num_blocks=21, max_num_batched_tokens=32)  # 20 usable blocks
    e.submit(150, 15)  # needs an 11th block at its 11th token: the last one goes
    b = e.submit(150, 200)[0]
    while not b.preemptions:
        e.step()
    e.submit(8, 4)  # would fit any free block; waits behind b's recompute
    while b not in e.running:
        e.step()
    before = dict(e.binding_seconds)
    e.step()  # b recomputes its context 32 tokens a step, the budget's all
    assert b.num_computed < b.num_tokens - 1
    assert e.waiting
    assert e.reason == "kv_cache"
    # The budget binds too: the step counts for both.
    grown = {k for k, v in e.binding_seconds.items() if v > before.get(k, 0.0)}
    assert grown == {"kv_cache+compute"}


def test_blocks_too_few_for_the_head_read_kv_cache() -> None:
    e = engine(num_blocks=41)  # 40 usable blocks, 640 tokens
    e.submit(400, 200)
    e.submit(400, 200)
    e.run_until(0.5)
    assert len(e.running) == 1
    assert e.reason == "kv_cache"


def test_a_stalled_engine_finishes_its_running_requests_and_empties_its_cache() -> None:
    e = engine()
    e.submit(200, 20)
    e.run_until(0.05)
    e.stalled = True
    e.submit(200, 20)
    e.run_until(30.0)
    assert not e.running
    assert len(e.waiting) == 1
    assert e.usage == 0.0
    assert e.reason == "stalled"
    e.stalled = False
    e.run_until(60.0)
    assert not e.waiting
    assert e.stats.finished == 2


def test_request_seconds_weigh_each_reason_by_the_requests_waiting_on_it() -> None:
    e = engine()
    e.submit(200, 20)
    e.run_until(0.05)
    e.stalled = True
    for _ in range(3):
        e.submit(200, 20)
    start = e.now
    e.run_until(30.0)
    stalled_seconds = e.reason_seconds["stalled"]
    assert stalled_seconds > 0.9 * (30.0 - start)
    assert abs(e.request_seconds["stalled"] - 3 * stalled_seconds) < 1e-6


def test_a_step_counts_a_prompt_in_iteration_tokens_only_when_its_prefill_completes() -> None:
    # As vLLM 0.32 observes it: chunks before a request's first token count nothing.
    e = engine(max_num_batched_tokens=256)
    e.submit(1000, 4)
    for _ in range(4):  # 256 + 256 + 256 + 232 prompt tokens, the last with a token
        e.step()
    hist = e.stats.iteration_tokens
    assert hist.count == 4
    assert hist.sum == 1000 + 1
    assert hist.buckets[0] == 3  # three steps observed 0 tokens


def test_requests_sharing_prefix_hashes_reuse_those_blocks() -> None:
    e = engine()
    hashes = (7, 8, 9)  # 3 × 64 tokens
    e.submit(200, 5, prefix_key=1, prefix_len=192, block_hashes=hashes, hash_tokens=64)
    e.run_until(5.0)
    e.submit(250, 5, prefix_key=1, prefix_len=192, block_hashes=(7, 8, 10), hash_tokens=64)
    e.run_until(10.0)
    assert e.stats.prefix_hits == 128  # the first two hash blocks, not the third


def test_a_sessions_next_turn_reuses_the_previous_prompt_and_answer() -> None:
    e = engine()
    e.submit(100, 60, prefix_key=5, prefix_len=0, cache_len=160)
    e.run_until(5.0)
    e.submit(200, 10, prefix_key=5, prefix_len=160, cache_len=210)
    e.run_until(10.0)
    # 159 tokens have KV (the last answer token is sampled, never computed): 9 blocks.
    assert e.stats.prefix_hits == 144


STALL = """\
name: stall
duration: 8m
seed: 2
deployment: {model: meta-llama/Llama-3.1-8B-Instruct, gpu: L40S, max_model_len: 8192}
stalls: [{at: 3m, duration: 2m}]
phases:
  - {duration: 8m, rate: 2.0, prompt: {median: 600, sigma: 0.3}, generation: {median: 150}}
"""


def test_a_scenario_stall_stops_admission_then_lets_go() -> None:
    sim = Simulation(parse_scenario(STALL, "stall.yaml"))
    sim.advance_to(4 * 60.0 + 55)
    assert sim.bottleneck == "stalled"
    assert len(sim.engine.waiting) > 100
    assert sim.engine.usage == 0.0
    during = sim.bottleneck_between(200.0, 290.0)
    assert during["stalled"] == 90.0
    sim.advance_to(8 * 60.0)
    assert sim.bottleneck_between(420.0, 480.0)["stalled"] == 0.0


def test_bottleneck_seconds_add_up_to_the_time_asked() -> None:
    sim = Simulation(parse_scenario(STALL, "stall.yaml"))
    sim.advance_to(300.0)
    assert abs(sum(sim.bottleneck_between(10.0, 250.0).values()) - 240.0) < 1e-6


SESSIONS = """\
name: sessions
duration: 5m
deployment: {model: meta-llama/Llama-3.1-8B-Instruct, gpu: L40S, max_model_len: 8192}
traffic: {file: chat.csv, columns: {time: t, prompt: in, output: out, session: conv}}
"""


def test_a_logged_conversation_hits_the_prefix_cache_on_its_later_turns(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(SESSIONS)
    (tmp_path / "chat.csv").write_text(
        "t,in,out,conv\n0,1000,200,a\n30,1300,100,a\n60,1500,100,a\n"
    )
    sim = Simulation(parse_scenario(SESSIONS, str(tmp_path / "s.yaml")))
    sim.advance_to(120.0)
    stats = sim.engine.stats
    assert stats.finished == 3
    # Turn 2 reuses the 1,199 tokens of turn 1 that have KV (74 full blocks of 16),
    # turn 3 the 1,399 of turn 2 (87 blocks).
    assert stats.prefix_hits == 74 * 16 + 87 * 16


def test_a_block_another_request_cached_first_does_not_stop_later_blocks_caching() -> None:
    e = engine()
    # Both prefill block 0 (hash 7) in the same step: the second's copy stays private, yet its
    # own later blocks (hash 9) enter the cache for a third request to reuse.
    e.submit(150, 2, prefix_key=1, prefix_len=128, block_hashes=(7, 8), hash_tokens=64)
    e.submit(150, 2, prefix_key=1, prefix_len=128, block_hashes=(7, 9), hash_tokens=64)
    e.run_until(5.0)
    e.submit(150, 2, prefix_key=1, prefix_len=128, block_hashes=(7, 9), hash_tokens=64)
    e.run_until(10.0)
    assert e.stats.prefix_hits == 128
