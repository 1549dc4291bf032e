"""The risk model's windows by bisection and its statistics in fewer passes (issue 17)
change no figure: today's ``assess`` against the one before, on what the sidecar's own
poll pipeline hands it while replaying library scenarios."""

from __future__ import annotations

import dataclasses
import math

import pytest

from benchmarks import poll_reference
from exporter import snapshot
from exporter.risk.model import Inputs, Risk, assess
from exporter.simulator.replay import replay
from exporter.simulator.simulation import load_scenario

# A ramp into preemption, a cache capped by max_num_seqs, a scheduler stall, parallel
# sampling, a long-context burst and prefill-bound bursts from a real trace (Mooncake):
# every term of the model is exercised, first polls (priors) included.
SCENARIOS = (
    "demo",
    "steady-full",
    "scheduler-stall",
    "parallel-sampling",
    "long-context-burst",
    "trace-prefill-bursts-overload",
)
MAX_SECONDS = 720.0  # each scenario's first 12 minutes: well past the 5-minute windows


def replayed_inputs(name: str, monkeypatch: pytest.MonkeyPatch) -> list[Inputs]:
    """Every ``Inputs`` the snapshot handed the risk model while replaying ``name``."""
    seen: list[Inputs] = []

    def spy(inputs: Inputs) -> Risk:
        seen.append(inputs)
        return assess(inputs)

    monkeypatch.setattr(snapshot, "assess", spy)
    scenario = load_scenario(name)
    replay(dataclasses.replace(scenario, duration=min(scenario.duration, MAX_SECONDS)))
    return seen


def restarted(inputs: Inputs) -> Inputs:
    """The same history with vLLM restarting half-way (a new epoch)."""
    half = len(inputs.points) // 2
    points = [
        dataclasses.replace(p, epoch=p.epoch + 1) if i >= half else p
        for i, p in enumerate(inputs.points)
    ]
    return dataclasses.replace(inputs, points=points)


def assert_same(new: Risk, before: Risk) -> None:
    for field in dataclasses.fields(Risk):
        a, b = getattr(new, field.name), getattr(before, field.name)
        assert a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9), (field.name, a, b)


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_risk_figure_is_the_one_the_previous_model_gave(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cases = replayed_inputs(name, monkeypatch)
    assert len(cases) >= 300  # a poll every 2 s for 10 minutes or more
    cases += [restarted(c) for c in cases[::10]]
    for inputs in cases:
        assert_same(assess(inputs), poll_reference.assess(inputs))
