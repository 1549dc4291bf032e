"""The scenario library tells the stories it claims, on the virtual clock."""

from __future__ import annotations

import functools

import pytest

from benchmarks.library import builtin_names, load_scenario
from exporter.errors import InputError
from exporter.simulator.scenario import Scenario, parse_scenario
from exporter.simulator.simulation import Simulation

NAMES = builtin_names()


def outcome(name: str) -> tuple[float, float]:
    sim = Simulation(load_scenario(name))
    peak, t = 0.0, 0.0
    while t < sim.scenario.duration:
        t += 2.0
        sim.advance_to(t)
        peak = max(peak, sim.engine.usage)
    return sim.engine.stats.preemptions, peak


def test_the_library_has_every_story_the_benchmark_needs() -> None:
    for name in ("steady", "steady-full", "ramp-to-overload", "long-context-burst",
                 "context-shift", "parallel-sampling", "foreign-process"):  # fmt: skip
        assert name in NAMES


@pytest.mark.parametrize("name", NAMES)
def test_overload_scenarios_preempt_and_safe_ones_do_not(name: str) -> None:
    preemptions, _ = outcome(name)
    if load_scenario(name).expect == "overload":
        assert preemptions > 0
    else:
        assert preemptions == 0


def test_steady_full_runs_its_cache_full_without_preempting() -> None:
    preemptions, peak = outcome("steady-full")
    assert peak > 0.95
    assert preemptions == 0


def test_foreign_process_shows_on_the_simulated_gpu() -> None:
    sim = Simulation(load_scenario("foreign-process"))
    _, before, _ = sim.gpu_memory()
    sim.advance_to(11 * 60.0)
    _, after, _ = sim.gpu_memory()
    assert after - before == 6 * 2**30


def test_closed_loop_keeps_the_concurrency() -> None:
    text = """
name: loop
deployment: {model: meta-llama/Llama-3.1-8B-Instruct, gpu: L4, max_model_len: 4096}
closed_loop: {concurrency: 5, requests: 12, prompt: 100, generation: 20}
"""
    sim = Simulation(parse_scenario(text, "loop.yaml"))
    assert len(sim.engine.waiting) == 5
    sim.advance_to(600.0)
    assert sim.engine.stats.finished == 12


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("phases: [{rate: fast}]", "loop.yaml: phases[0].rate = 'fast': must be a number"),
        ("phases: [{rate: 1, prmpt: 3}]", "loop.yaml: phases[0].prmpt: unknown key"),
        ("phases: [{rate: 1, duration: soon}]", "phases[0].duration = 'soon': must be a duration"),
        ("expect: maybe\nphases: [{rate: 1}]", "expect = 'maybe': must be safe or overload"),
        ("name: x", "a scenario needs phases, traffic or closed_loop"),
        ("phases: [{rate: 1, prompt: {min: 9, max: 3}}]", "phases[0].prompt.min = 9: is above"),
        ("phases: [", "is not valid YAML"),
    ],
)
def test_a_bad_scenario_names_its_file_and_key(text: str, message: str) -> None:
    with pytest.raises(InputError) as e:
        parse_scenario(text, "loop.yaml")
    assert message in str(e.value)


def test_unknown_scenario_lists_the_library() -> None:
    with pytest.raises(InputError, match="steady"):
        load_scenario("no-such-scenario")


REAL_CLASSES = ("prefill-bound-burst", "max-num-seqs-busy", "daily-ramp", "long-context-tail",
                "multi-turn-prefix", "cold-start-burst")  # fmt: skip


@functools.cache
def library() -> list[Scenario]:
    return [load_scenario(n) for n in NAMES]


@pytest.mark.parametrize("klass", REAL_CLASSES)
def test_each_real_traffic_class_has_a_safe_and_an_overload_scenario(klass: str) -> None:
    found = {s.expect for s in library() if klass in s.tags and "real-traffic" in s.tags}
    assert found == {"safe", "overload"}


def test_the_real_traffic_library_spans_several_gpus_and_models() -> None:
    real = [s for s in library() if "real-traffic" in s.tags]
    assert len({s.deployment["gpu"] for s in real}) >= 4
    assert len({s.deployment["model"] for s in real}) >= 3
