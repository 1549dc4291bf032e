"""The simulator against real vLLM 0.32: the same workload, the same KV cache, the same
limits — preemptions within ±30 % and the same peak usage within 5 points."""

from __future__ import annotations

import pytest

from exporter.simulator.engine import Engine, EngineConfig
from tests.e2e.conftest import OverloadRun
from tests.e2e.vllm_harness import Request

# What the real server runs with: 48 blocks of 128 (--num-gpu-blocks-override 48),
# --max-num-seqs 64, --max-model-len 2048, vLLM 0.32's CPU default of 2048 batched
# tokens, prefix caching on (its default).
REAL_CACHE = EngineConfig(
    num_blocks=48,
    block_size=128,
    max_num_seqs=64,
    max_num_batched_tokens=2048,
    max_model_len=2048,
    enable_prefix_caching=True,
)


def simulate(requests: list[Request], concurrency: int) -> tuple[float, float]:
    """The closed loop the harness drives: each client sends its next request when its
    previous one finishes."""
    engine = Engine(REAL_CACHE)
    queue = list(requests)

    def next_request(_: object = None) -> None:
        if queue:
            r = queue.pop(0)
            engine.submit(r.prompt_tokens, r.max_tokens)

    engine.on_finish = next_request
    for _ in range(concurrency):
        next_request()
    peak, t = 0.0, 0.0
    while (engine.running or engine.waiting or queue) and t < 3600:
        t += 0.25  # the harness samples every 0.25 s too
        engine.run_until(t)
        peak = max(peak, engine.usage)
    return engine.stats.preemptions, peak


@pytest.mark.vllm
def test_simulator_preempts_as_often_as_vllm(overload_run: OverloadRun) -> None:
    real = overload_run.result
    simulated, _ = simulate(overload_run.requests, overload_run.concurrency)
    print(f"\nfidelity: vLLM preempted {real.preemptions:g} times, the simulator {simulated:g}")
    assert real.preemptions > 0
    assert abs(simulated - real.preemptions) <= 0.3 * real.preemptions


@pytest.mark.vllm
def test_simulator_reaches_the_same_peak_usage(overload_run: OverloadRun) -> None:
    real = overload_run.result
    _, peak = simulate(overload_run.requests, overload_run.concurrency)
    print(f"\nfidelity: peak KV usage vLLM {real.peak_usage:.3f}, simulator {peak:.3f}")
    assert abs(peak - real.peak_usage) <= 0.05
