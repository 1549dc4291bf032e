"""Today's risk model gives, figure by figure, what the model of a pinned git revision
gave, on what the sidecar's own poll pipeline hands it while replaying library scenarios.

The models before are read from git (``git show <revision>:exporter/risk/model.py``) and
imported from a temporary directory, never kept as an edited copy: a copy drifts with
the code it is meant to hold still. ``BEFORE`` is main before issue 27 began (543e2a9):
every poll is compared, and the only fields left out are those ``CHANGED_ON_PURPOSE``
since. ``BEFORE_PACED`` is the model just before a queue waiting for prefill compute
narrowed the spread (``paced_factor``, 020a786): against it, the compute-bound polls may
differ in the spread and the score alone, and only narrow the spread. Since stop 47 a
compute-bound poll is paced only once its queue has stood ``PACED_SECONDS``; the pinned
models score the others as unpaced when handed them as ``max_num_seqs``-bound (the one
other label that holds a queue out of the KV forecast, and none of them paces it).

CI clones with full history; without git or a revision these tests fail (never skip).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from benchmarks.library import load_scenario
from exporter import snapshot
from exporter.replay import replay
from exporter.risk.model import (
    PACED_SECONDS,
    Inputs,
    Risk,
    assess,
    current_epoch,
    queued_throughout,
)

ROOT = Path(__file__).resolve().parents[2]
MODEL_PATH = "exporter/risk/model.py"
BEFORE = "543e2a9c4f81dba684ddc53dfbea4af758d802ef"  # main before issue 27
BEFORE_PACED = "5e164568f1a3a225bf7ce63cbc302bfc4b56d33f"  # the parent of 020a786
BEFORE_RESIDENT = "977ceb2786697a6cd57b422d5144f3149a27a576"  # before the resident ceiling
# The one scenario whose cache is capped by max_num_seqs: the ceiling term binds there, so
# its score moved when the ceiling came to weigh residents by their length (issue 34).
CEILING_BINDS = "steady-full"

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

# Changed on purpose since BEFORE (issue 27): the time to exhaustion comes from the
# forecast the score rests on, not from the last minute's growth; the forecast usage is
# new. A field added or dropped since must be named here, or the comparison fails.
CHANGED_ON_PURPOSE = frozenset({"seconds_to_exhaustion", "forecast_usage"})


def model_at(revision: str, into: Path) -> ModuleType:
    """``exporter/risk/model.py`` as it was at ``revision``, imported under its own name
    (it imports today's package for anything outside the file, as ``Histogram``)."""
    git = shutil.which("git")
    if git is None:
        pytest.fail("the pinned risk models are read with git, and git is not installed")
    shown = subprocess.run(
        [git, "-C", str(ROOT), "show", f"{revision}:{MODEL_PATH}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if shown.returncode != 0:
        pytest.fail(
            f"git show {revision[:7]}:{MODEL_PATH} failed (a shallow clone? CI fetches full "
            f"history): {shown.stderr.strip()}"
        )
    name = f"risk_model_at_{revision[:7]}"
    path = into / f"{name}.py"
    path.write_text(shown.stdout)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # dataclasses look their module up in sys.modules while the file runs.
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def before(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    return model_at(BEFORE, tmp_path_factory.mktemp("before"))


@pytest.fixture(scope="module")
def before_paced(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    return model_at(BEFORE_PACED, tmp_path_factory.mktemp("before_paced"))


@pytest.fixture(scope="module")
def before_resident(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    return model_at(BEFORE_RESIDENT, tmp_path_factory.mktemp("before_resident"))


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


def as_pinned_sees_it(inputs: Inputs) -> Inputs:
    """What a pinned model must be handed to score a poll as today's does: a compute-bound
    poll whose queue has not stood ``PACED_SECONDS`` is not paced today, so the pinned model
    gets it labelled ``max_num_seqs`` (unpaced, its queue held out of the forecast alike)."""
    if inputs.bottleneck != "compute" or not inputs.points:
        return inputs
    if queued_throughout(current_epoch(inputs.points), PACED_SECONDS):
        return inputs
    return dataclasses.replace(inputs, bottleneck="max_num_seqs")


def restarted(inputs: Inputs) -> Inputs:
    """The same history with vLLM restarting half-way (a new epoch)."""
    half = len(inputs.points) // 2
    points = [
        dataclasses.replace(p, epoch=p.epoch + 1) if i >= half else p
        for i, p in enumerate(inputs.points)
    ]
    return dataclasses.replace(inputs, points=points)


def assert_same(new: Risk, old: Any, changed: frozenset[str] = CHANGED_ON_PURPOSE) -> None:
    """Every field of both Risks but those in ``changed``; a field only one of them has
    fails unless it is named there, so nothing is left out unsaid."""
    ours = {f.name for f in dataclasses.fields(new)}
    theirs = {f.name for f in dataclasses.fields(old)}  # the pinned model's own Risk
    assert ours ^ theirs <= changed, ("fields added or dropped, not named", ours ^ theirs)
    for name in sorted((ours & theirs) - changed):
        a, b = getattr(new, name), getattr(old, name)
        assert a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9), (name, a, b)


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_risk_figure_is_the_one_the_model_before_issue_27_gave_but_those_changed_on_purpose(
    name: str, before: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every poll, compute-bound ones included, against the model at ``BEFORE``; where the
    ceiling binds, the score is pinned against ``BEFORE_RESIDENT`` instead (below)."""
    cases = replayed_inputs(name, monkeypatch)
    assert len(cases) >= 300  # a poll every 2 s for 10 minutes or more
    cases += [restarted(c) for c in cases[::10]]
    changed = CHANGED_ON_PURPOSE | ({"preemption_risk"} if name == CEILING_BINDS else set())
    for inputs in cases:
        assert_same(assess(inputs), before.assess(as_pinned_sees_it(inputs)), frozenset(changed))


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_resident_weighted_ceiling_only_raises_the_score_where_the_ceiling_binds(
    name: str, before_resident: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against the model before the ceiling weighed residents by their length: every field
    of every poll the same, but the score where ``max_num_seqs`` caps the cache, which only
    rises (the residents' mean length is at least a finished request's)."""
    cases = replayed_inputs(name, monkeypatch)
    raised = 0
    for inputs in cases:
        new, old = assess(inputs), before_resident.assess(as_pinned_sees_it(inputs))
        if name != CEILING_BINDS:
            assert_same(new, old, frozenset())
            continue
        assert_same(new, old, frozenset({"preemption_risk"}))
        assert new.preemption_risk >= old.preemption_risk - 1e-12
        raised += new.preemption_risk > old.preemption_risk + 1e-9
    if name == CEILING_BINDS:
        assert raised >= len(cases) // 2


def test_every_name_changed_on_purpose_is_a_risk_field(before: ModuleType) -> None:
    """A stale name would widen the exclusion without anyone noticing."""
    names = {f.name for f in dataclasses.fields(Risk)} | {
        f.name for f in dataclasses.fields(before.Risk)
    }
    assert names >= CHANGED_ON_PURPOSE


def test_a_queue_waiting_for_compute_only_narrows_the_spread(
    before_paced: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against the model before paced admission, a compute-bound poll (its queue standing
    ``PACED_SECONDS``) differs in the spread and the score alone (besides
    ``CHANGED_ON_PURPOSE``), and the spread narrows."""
    cases = [
        c
        for c in replayed_inputs("trace-prefill-bursts-overload", monkeypatch)
        if as_pinned_sees_it(c).bottleneck == "compute"
    ]
    narrower = 0
    for inputs in cases:
        new, old = assess(inputs), before_paced.assess(inputs)
        assert_same(new, old, CHANGED_ON_PURPOSE | {"spread_tokens", "preemption_risk"})
        assert new.spread_tokens <= old.spread_tokens * (1 + 1e-9)
        narrower += new.spread_tokens < old.spread_tokens * 0.99
    assert narrower >= len(cases) // 2 > 0


def test_a_queue_that_has_not_stood_its_time_is_not_paced(monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo's ramp has compute-bound polls whose queue came between two steps: today's
    model scores them as unpaced, and the pinned comparisons above do see such polls."""
    cases = replayed_inputs("trace-prefill-bursts-overload", monkeypatch)
    cases += replayed_inputs("demo", monkeypatch)
    compute = [c for c in cases if c.bottleneck == "compute"]
    fresh = [c for c in compute if as_pinned_sees_it(c) is not c]
    assert fresh
    assert len(fresh) < len(compute)
    for inputs in fresh:
        assert assess(inputs) == assess(dataclasses.replace(inputs, bottleneck="max_num_seqs"))
