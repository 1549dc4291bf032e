"""Simulated seconds per wall second with 256 running sequences, on the virtual clock.

The deployment is Llama-3.1-8B on an H100 with ``max_num_seqs`` 256; 256 closed-loop
clients keep 256 sequences running (prompts 200-800, answers 100-1500 tokens, so they all
fit and none is preempted). The baseline, measured in the same run, is the same engine
stepping one scheduler step at a time (no jumps over pure decode).

    python benchmarks/simulator.py [--seconds 600]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.simulator import engine as engine_module
from exporter.simulator.scenario import parse_scenario
from exporter.simulator.simulation import Simulation

SCENARIO = """
name: 256-running
deployment: {model: meta-llama/Llama-3.1-8B-Instruct, gpu: H100-80GB, max_model_len: 8192,
             max_num_seqs: 256}
closed_loop:
  concurrency: 256
  requests: 100000
  prompt: {min: 200, max: 800}
  generation: {min: 100, max: 1500}
"""


def measure(seconds: float, jumps: bool) -> tuple[float, float, int, int]:
    sim = Simulation(parse_scenario(SCENARIO, "256-running"))
    original = engine_module.Engine._jump
    if not jumps:
        engine_module.Engine._jump = lambda self, horizon: False  # type: ignore[method-assign]
    running = []
    try:
        t0 = time.perf_counter()
        t = 0.0
        while t < seconds:
            t += 2.0  # what a sidecar polling every 2 s would look at
            sim.advance_to(t)
            running.append(len(sim.engine.running))
        wall = time.perf_counter() - t0
    finally:
        engine_module.Engine._jump = original  # type: ignore[method-assign]
    steady = running[len(running) // 4 :]
    return seconds / wall, wall, min(steady), sim.engine.steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=600.0, help="simulated seconds")
    args = parser.parse_args()
    fast, fast_wall, fast_min, steps = measure(args.seconds, jumps=True)
    slow, slow_wall, _, _ = measure(args.seconds, jumps=False)
    print(f"{args.seconds:.0f} simulated seconds, {steps:,} scheduler steps, "
          f"at least {fast_min} sequences running after warm-up")  # fmt: skip
    rate = f"{fast:8.0f}× real time ({fast_wall:.2f} s wall)"
    print(f"  engine (jumps over pure decode): {rate}   target ≥100×")
    print(f"  baseline, one step at a time:    {slow:8.0f}× real time ({slow_wall:.2f} s wall)")
    print(f"  jumps vs baseline: {fast / slow:.1f}× faster")
    return 0


if __name__ == "__main__":
    sys.exit(main())
