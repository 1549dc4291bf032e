"""A slice of the alert benchmark's fuzz tier, as CI runs it: two drawn hours (a light one
and an abrupt overload whose placement searches are quick), placed, replayed with the
sidecar's own poll pipeline, recorded and scored. The whole tier is a documented command
(docs/risk-model.md), too long for CI."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import cast

import pytest

from benchmarks import alert_scoring, frontier_rules, fuzz, fuzz_frontier
from exporter.simulator import family

SLICE = (11, 12)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[fuzz.FuzzRun]]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fuzz, "CACHE", tmp_path_factory.mktemp("fuzz-cache"))
        yield fuzz.run_fuzz(list(SLICE), 2.0, jobs=1, use_cache=True)


def test_the_slice_runs_every_hour_it_draws(runs: list[fuzz.FuzzRun]) -> None:
    assert [r.seed for r in runs] == list(SLICE)
    assert all(r.replay is not None and r.multiple is not None for r in runs)
    assert [r.kind for r in runs] == [family.draw(s).kind for s in SLICE]


def test_an_abrupt_overload_preempts_and_is_scored_as_one(runs: list[fuzz.FuzzRun]) -> None:
    kinds = fuzz.score(runs)["kinds"]
    assert kinds["abrupt-overload"]["overload_runs"] == 1
    assert kinds["abrupt-overload"]["recall"] is not None
    assert kinds["safe-light"]["safe_runs"] == 1


def test_a_recorded_hour_rescored_by_the_same_model_gives_the_risk_it_had(
    runs: list[fuzz.FuzzRun],
) -> None:
    # The record is exact: re-scored by the model that ran, every poll's figures come back,
    # so a model change scored from records is scored as if the hours were replayed.
    for run in runs:
        assert run.recorded is not None
        assert run.replay is not None
        live = run.recorded.replay.ticks
        assert len(run.recorded.inputs) >= len(live) - 1
        assert [(t.t, t.preemption_risk, t.seconds_to_exhaustion) for t in run.replay.ticks] == [
            (t.t, t.preemption_risk, t.seconds_to_exhaustion) for t in live
        ]


def test_the_reliability_table_counts_every_poll_before_the_first_preemption(
    runs: list[fuzz.FuzzRun],
) -> None:
    polls = sum(row["polls"] for row in fuzz.score(runs)["reliability"])
    expected = 0
    for r in runs:
        assert r.replay is not None
        first = r.replay.first_preemption_at
        expected += sum(1 for t in r.replay.ticks if first is None or t.t < first)
    assert polls == expected


def test_a_second_run_reads_its_hours_from_the_cache_and_scores_them_alike(
    runs: list[fuzz.FuzzRun],
) -> None:
    assert len(list(fuzz.CACHE.glob("v*/*.json"))) == len(SLICE)  # the placements
    assert len(list(fuzz.CACHE.glob("runs/*.pkl.gz"))) == len(SLICE)  # the replayed hours
    again = fuzz.run_fuzz(list(SLICE), 2.0, jobs=1, use_cache=True)

    def scored(rs: list[fuzz.FuzzRun]) -> str:
        result = fuzz.score(rs)
        per_run = [r.get("result") for r in result["runs"]]
        return json.dumps([result["kinds"], result["reliability"], per_run], default=fuzz._json)

    assert scored(again) == scored(runs)


def test_the_frontier_scores_the_shipped_alert_as_the_tier_does(
    runs: list[fuzz.FuzzRun],
) -> None:
    # benchmarks/fuzz_frontier.py sweeps rules over the same hours; its row for the shipped
    # rule must be the tier's own figures, or its other rows compare unlike with unlike.
    # The shipped page is alert_quality's first rule (the score and the usage's peak), not
    # the score alone: the two agree only on hours where the usage gate never binds.
    page = alert_scoring.RULES[0]
    assert page.name == "kv_headroom"
    # Replays hold their ticks in a list, which the page's condition memoises by identity.
    point = fuzz_frontier.frontier_point(
        runs, "page", cast(fuzz_frontier.Condition, page.condition)
    )
    kinds = fuzz.score(runs)["kinds"]
    for kind in fuzz_frontier.SAFE:
        fa = point.false_alarm[kind]
        assert (None if fa is None else round(fa, 2)) == kinds[kind][
            "false_alarm_minutes_per_safe_hour"
        ]
    for kind in fuzz_frontier.OVERLOAD:
        assert point.median_lead[kind] == kinds[kind]["median_lead_seconds"]
        warned = point.warned[kind]
        assert (None if warned is None else round(warned, 3)) == kinds[kind][
            "warned_before_first_preemption"
        ]
    assert kinds["abrupt-overload"]["median_lead_seconds"] is not None  # compared, not None


def test_the_frontier_command_prints_every_rule_and_the_fitted_one(
    runs: list[fuzz.FuzzRun], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--fuzz", "1", "--seed", "11", "--fit", "1", "--fit-seed", "12"]
    assert fuzz_frontier.main(argv) == 0
    out = capsys.readouterr().out
    for name, _ in fuzz_frontier.sweeps():
        assert f"| `{name}` |" in out
    assert "| `fitted > 0.5` |" in out
    assert "abrupt-overload: 1 runs; the lowest usage" in out


def test_a_fuzz_family_scores_the_shipped_page_as_the_tier_does(
    runs: list[fuzz.FuzzRun],
) -> None:
    # The frontier's families regroup the tier's runs (safe hours by kind, every run that
    # preempted as the set's overloads): the shipped page must read as the tier reads it.
    light = next(f for f in fuzz_frontier.fuzz_families("dev", runs) if f.name.endswith("light"))
    page = next(r for r in frontier_rules.shipped() if r.name == frontier_rules.PAGE)
    scored = fuzz_frontier.score_family(light, page)
    kinds = fuzz.score(runs)["kinds"]
    assert scored.false_alarm is not None
    assert round(scored.false_alarm, 2) == kinds["safe-light"]["false_alarm_minutes_per_safe_hour"]
    assert scored.lead == kinds["abrupt-overload"]["median_lead_seconds"]
    assert scored.recall == kinds["abrupt-overload"]["recall"]


def test_an_abrupt_overload_is_visible_before_its_first_preemption(
    runs: list[fuzz.FuzzRun],
) -> None:
    abrupt = next(r for r in runs if r.kind == "abrupt-overload")
    assert abrupt.replay is not None
    assert abrupt.replay.first_preemption_at is not None
    seen = fuzz_frontier.visible_at(abrupt.replay.ticks)
    assert seen is not None
    assert seen < abrupt.replay.first_preemption_at
