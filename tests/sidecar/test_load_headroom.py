"""The live load headroom, from the sidecar's own poll pipeline watching a simulated vLLM."""

from __future__ import annotations

import dataclasses

from exporter.simulator.replay import replay
from exporter.simulator.simulation import load_scenario


def test_a_ramp_to_overload_loses_its_headroom_before_it_preempts() -> None:
    scenario = dataclasses.replace(load_scenario("demo"), duration=240.0)
    run = replay(scenario)
    assert run.first_preemption_at is not None
    early = [t.load_headroom_ratio for t in run.ticks if 20 <= t.t <= 30]
    before = [t for t in run.ticks if t.t < run.first_preemption_at]
    assert all(r is not None and r > 1 for r in early)
    assert any(t.load_headroom_ratio is not None and t.load_headroom_ratio < 1 for t in before)


def test_the_binding_resource_is_named_with_the_ratio() -> None:
    scenario = dataclasses.replace(load_scenario("steady-full"), duration=180.0)
    ticks = [t for t in replay(scenario).ticks if t.load_headroom_ratio is not None]
    assert ticks
    assert {t.load_headroom_resource for t in ticks} <= {"kv_cache", "max_num_seqs"}
    assert ticks[-1].load_headroom_resource == "max_num_seqs"
