"""The live load headroom, from the sidecar's own poll pipeline watching a simulated vLLM."""

from __future__ import annotations

import dataclasses

from exporter.capacity.steptime import step_times
from exporter.replay import replay
from exporter.simulator.simulation import load_scenario, size
from exporter.snapshot import _step_times_of


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


def test_a_plans_step_times_are_worked_out_once_and_another_plan_gets_its_own() -> None:
    planned = size(load_scenario("steady")).plan
    first = _step_times_of(planned)
    assert _step_times_of(planned) is first  # no parameter count each poll
    assert _step_times_of(dataclasses.replace(planned)) is first  # rebuilt equal: the same
    other = size(load_scenario("demo")).plan
    assert other != planned
    assert _step_times_of(other) is not first
    assert _step_times_of(other) == step_times(other)
