"""The simulated engine schedules, allocates and preempts as vLLM V1 does."""

from __future__ import annotations

import pytest

from exporter.simulator import engine as engine_module
from exporter.simulator.engine import Engine, EngineConfig, token_buckets
from exporter.simulator.simulation import Simulation, load_scenario


def small(**kw: object) -> Engine:
    cfg: dict[str, object] = {
        "num_blocks": 11,
        "block_size": 16,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 64,
        "max_model_len": 512,
        "enable_prefix_caching": False,
    }
    cfg.update(kw)
    return Engine(EngineConfig(**cfg))  # type: ignore[arg-type]


def run_steps(e: Engine, steps: int) -> None:
    for _ in range(steps):
        e.step()


def test_one_block_is_reserved_and_usage_counts_the_rest() -> None:
    e = small()
    e.submit(prompt_len=40, max_tokens=5)
    e.step()
    assert e.pool.usable == 10
    assert e.pool.used == 3  # ceil(40 / 16)
    assert e.usage == pytest.approx(0.3)


def test_prefill_is_chunked_by_the_token_budget() -> None:
    e = small(max_num_batched_tokens=16)
    [req] = e.submit(prompt_len=40, max_tokens=5)
    e.step()
    assert req.num_computed == 16
    assert req.output == 0
    run_steps(e, 2)
    assert req.num_computed == 40
    assert req.output == 1


def test_admission_needs_the_whole_sequence_to_fit() -> None:
    e = small(num_blocks=5)  # 4 usable blocks = 64 tokens
    e.submit(prompt_len=80, max_tokens=5)  # needs 5 blocks: never admitted alone
    e.step()
    assert not e.running
    assert len(e.waiting) == 1


def test_decode_grows_one_block_every_block_size_tokens() -> None:
    e = small()
    [req] = e.submit(prompt_len=16, max_tokens=40)
    e.step()  # prefill: 1 block, first token
    assert req.held_blocks == 1
    e.step()  # computes token 17: a second block
    assert req.held_blocks == 2


def test_the_last_running_request_is_preempted_and_goes_first_in_line() -> None:
    e = small(num_blocks=5, max_num_batched_tokens=512)  # 4 usable blocks
    a = e.submit(prompt_len=32, max_tokens=100)[0]
    b = e.submit(prompt_len=31, max_tokens=100)[0]
    e.step()  # both admitted: 2 + 2 blocks, the pool is full
    assert e.running == [a, b]
    run_steps(e, 2)  # a needs a third block: b, the last, is preempted
    assert b not in e.running
    assert e.waiting[0] is b
    assert b.num_computed == 0
    assert b.preemptions == 1


def test_preemption_is_counted_when_the_request_next_emits_a_token() -> None:
    e = small(num_blocks=5, max_num_batched_tokens=512)
    e.submit(prompt_len=32, max_tokens=30)  # 62 tokens: fits alone in the 4 blocks
    b = e.submit(prompt_len=31, max_tokens=10)[0]
    run_steps(e, 3)
    assert b.preemptions == 1
    assert e.stats.preemptions == 0  # vLLM reports it with b's next output
    run_steps(e, 40)  # a finishes, b is recomputed and emits again
    assert b.output >= 2
    assert e.stats.preemptions == 1


def test_max_num_seqs_bounds_the_running_batch() -> None:
    e = small(max_num_seqs=2, num_blocks=100)
    for _ in range(5):
        e.submit(prompt_len=8, max_tokens=50)
    e.step()
    assert len(e.running) == 2
    assert len(e.waiting) == 3


def test_a_shared_prefix_is_served_from_the_cache() -> None:
    e = small(num_blocks=40, enable_prefix_caching=True, max_num_batched_tokens=512)
    e.submit(prompt_len=100, max_tokens=3, prefix_key=7, prefix_len=64)
    run_steps(e, 5)  # computed and finished: its prefix blocks stay cached, free
    assert not e.running
    assert e.pool.used == 0
    [second] = e.submit(prompt_len=100, max_tokens=3, prefix_key=7, prefix_len=64)
    e.step()
    assert e.stats.prefix_hits == 64
    assert len(second.cached) == 4


def test_parallel_sampling_fans_out_and_records_n_once() -> None:
    e = small(num_blocks=60, enable_prefix_caching=True, max_num_batched_tokens=512)
    children = e.submit(prompt_len=40, max_tokens=4, n=4)
    assert len(children) == 4
    run_steps(e, 20)
    assert e.stats.finished == 4
    assert e.stats.n_param.count == 1
    assert e.stats.n_param.sum == 4


def test_token_buckets_are_vllms_1_2_5_up_to_max_model_len() -> None:
    assert token_buckets(2048) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)


def test_jumping_over_pure_decode_gives_exactly_the_step_by_step_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def outcome() -> tuple[float, ...]:
        sim = Simulation(load_scenario("ramp-to-overload"))
        for t in range(2, 602, 2):
            sim.advance_to(float(t))
        s = sim.engine.stats
        # Time is a float sum: k steps at once and k single steps round differently.
        return (s.preemptions, s.finished, s.generation_tokens, round(sim.engine.now, 6))

    jumped = outcome()
    monkeypatch.setattr(engine_module.Engine, "_jump", lambda self, horizon: False)
    assert outcome() == jumped
