"""Renders rules/tests/runway.test.yml: promtool unit tests of the capacity runway.

Four tests. ``flat`` checks every record's exact value on a flat load, as itself (no
runway on 4 pods; runway 0 and the ticket on 2). ``exact`` is a noise-free linear load
whose every record is worked out by hand (exact_values says how). ``truths`` holds every
synthetic truth of tests/rules/runway_truths.py as one model each, six weeks every 15
minutes, evaluated at the end: the runway within ±25 % of the truth where it is 7-30 days
(compounding growth: within its own bound, long), absent or over 60 days where the load is
not growing, and the ticket firing for exactly the linear truths under 14 days. ``sweeps``
follows growing models day by day over nine weeks: no runway before the 34 days the method
needs, then the runway within ±25 % every day the truth is 7-30 days, and the ticket
firing on every day the truth is under 14 days and on none over it (outside the band the
runway's own error allows around 14).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import yaml

from tests.rules.rulefiles import RUNBOOK_BASE
from tests.rules.runway_truths import (
    COMPOUNDING,
    COMPOUNDING_TOLERANCE,
    RUNWAY_AFTER_DAYS,
    TICKET_BAND,
    Truth,
)

STEP_SECONDS = 900
STEP = "15m"
JOB = "kv-headroom"
ALERT = "VllmKvCacheRunwayShort"
TICKET_DAYS = 14.0
TOLERANCE = 0.25
NOT_GROWING_DAYS = 60.0
RUNWAY = "model:kv_headroom_runway_days"
# By name: `python -m tests.rules.runway_truths` makes a second copy of that module's truths.
COMPOUNDING_NAMES = frozenset(t.name for t in COMPOUNDING)


def _series(truth: Truth) -> list[dict[str, str]]:
    """The truth's sidecar series: a kv_headroom_info per pod, and the model's whole load
    on its first pod's engine (the others idle, exporting no ratio, add 0), so that
    model:kv_headroom_load:sum is 1 / ratio."""
    n = truth.history_days * 86400 // STEP_SECONDS
    loads = " ".join(f"{1 / load:.4g}" for _, load in truth.samples(STEP_SECONDS))
    info = [
        {"series": f'kv_headroom_info{{job="{JOB}",instance="{truth.name}-{i}:9847",'
                   f'model="{truth.name}"}}', "values": f"1x{n}"}
        for i in range(truth.pods)
    ]  # fmt: skip
    ratio = {
        "series": f'kv_headroom_load_headroom_ratio{{job="{JOB}",'
                  f'instance="{truth.name}-0:9847",engine="0"}}', "values": loads,
    }  # fmt: skip
    return [*info, ratio]


def _within(model: str, truth_days: float, low: float, high: float, at: str) -> dict[str, Any]:
    # (error > low) < bool high: nothing at or under low, 0 at or over high, else 1.
    error = f'{RUNWAY}{{model="{model}"}} / {truth_days:g} - 1'
    return {
        "expr": f"({error} > {low:g}) < bool {high:g}",
        "eval_time": at,
        "exp_samples": [{"labels": f'{{model="{model}"}}', "value": 1}],
    }


def _firing(models: Sequence[str], at: str) -> dict[str, Any]:
    return {
        "expr": f'ALERTS{{alertname="{ALERT}",alertstate="firing"}}',
        "eval_time": at,
        "exp_samples": [
            {"labels": f'ALERTS{{alertname="{ALERT}",alertstate="firing",model="{m}",'
                       'severity="warning"}', "value": 1}
            for m in sorted(models)
        ],
    }  # fmt: skip


def _firing_among(models: Sequence[str], among: Sequence[str], at: str) -> dict[str, Any]:
    """_firing, looking only at the models `among`."""
    check = _firing(models, at)
    check["expr"] = check["expr"][:-1] + f',model=~"{"|".join(sorted(among))}"}}'
    return check


def _minutes(day: float) -> str:
    return f"{round(day * 1440)}m"


def truths_test(truths: Sequence[Truth]) -> dict[str, Any]:
    checks: list[dict[str, Any]] = []
    end = _minutes(max(t.history_days for t in truths))
    for truth in truths:
        assert truth.history_days * 1440 == int(end[:-1]), "one end for every truth"
        if truth.runway_days is None:
            # Nothing, or a runway over 60 days.
            checks.append({"expr": f'{RUNWAY}{{model="{truth.name}"}} <= {NOT_GROWING_DAYS:g}',
                           "eval_time": end, "exp_samples": []})  # fmt: skip
        elif truth.name in COMPOUNDING_NAMES:
            checks.append(_within(truth.name, truth.runway_days, *COMPOUNDING_TOLERANCE, end))
        else:
            checks.append(_within(truth.name, truth.runway_days, -TOLERANCE, TOLERANCE, end))
    # Compounding growth reads late (runway_truths.COMPOUNDING): its ticket is not held to
    # the day, only its runway to its bound above.
    firing = [
        t.name
        for t in truths
        if t.runway_days is not None
        and t.runway_days < TICKET_DAYS
        and t.name not in COMPOUNDING_NAMES
    ]
    checks.append(
        _firing_among(firing, [t.name for t in truths if t.name not in COMPOUNDING_NAMES], end)
    )
    return {
        "name": "the runway of every synthetic truth, and the ticket for those under 14 days",
        "interval": STEP,
        "input_series": [s for t in truths for s in _series(t)],
        "promql_expr_test": checks,
    }


def sweeps_test(sweeps: Sequence[Truth]) -> dict[str, Any]:
    checks: list[dict[str, Any]] = []
    history = sweeps[0].history_days
    assert all(t.history_days == history for t in sweeps), "one timeline for every sweep"
    # Nothing the day before the history the method needs is there.
    checks.append({"expr": RUNWAY, "eval_time": _minutes(RUNWAY_AFTER_DAYS - 1),
                   "exp_samples": []})  # fmt: skip
    for day in range(RUNWAY_AFTER_DAYS, history + 1):
        at, t = _minutes(day), day - history
        firing = []
        for truth in sweeps:
            true = truth.runway_at(t)
            assert true is not None
            if 7 <= true <= 30:
                checks.append(_within(truth.name, true, -TOLERANCE, TOLERANCE, at))
            if true < TICKET_BAND[0]:
                firing.append(truth.name)
            elif true <= TICKET_BAND[1]:
                break  # this day the ticket may go either way for this model
        else:
            checks.append(_firing(firing, at))
    return {
        "name": "day by day: no runway before five weeks, then the runway and the ticket",
        "interval": STEP,
        "input_series": [s for t in sweeps for s in _series(t)],
        "promql_expr_test": checks,
    }


# The exact test: one model on 2 pods whose load grows by 0.1 pod a week, the same all
# day (no shape, no noise), six weeks every 15 minutes, so every record can be worked out.
EXACT_PODS = 2
EXACT_DAYS = 42
EXACT_PER_DAY = 0.1 / 7


def _exact_load(day: float) -> float:
    return 1.0 + EXACT_PER_DAY * day


def exact_values() -> dict[str, float]:
    """Every record of the capacity group at the end of the exact test, by hand:

    avg1h     the mean of the hour's five samples (0 to 60 minutes old: the range holds
              both ends): the load 30 minutes ago; a rising load's busy hour is its last,
              so max1d = max1w = avg1h.
    weekday   of seven days at this hour, ascending with age, the 2/3 quantile is the one
              two days old: weekday_avg1h = weekday_max1d = avg1h two days ago.
    growth    its week-over-week change, 0.1 every week, and so the median of three weeks.
    carried   each day carried forward at that growth lands on avg1h now, the curve's busy
              hour is the last, and half a day more of growth makes the peak now.
    """
    b = EXACT_PER_DAY
    avg1h = _exact_load(EXACT_DAYS - 30 / 1440)
    growth = 7 * b
    peak_now = avg1h + 0.5 * b
    peak_in_30d = peak_now + 30 * b
    return {
        "model:kv_headroom_pods:count": EXACT_PODS,
        "model:kv_headroom_pods:capacity": EXACT_PODS,
        "model:kv_headroom_load:avg1h": avg1h,
        "model:kv_headroom_load:max1d": avg1h,
        "model:kv_headroom_load:max1w": avg1h,
        "model:kv_headroom_load:weekday_avg1h": avg1h - 2 * b,
        "model:kv_headroom_load:weekday_max1d": avg1h - 2 * b,
        "model:kv_headroom_load_growth:delta1w": growth,
        "model:kv_headroom_load_growth:median3w_delta1w": growth,
        "model:kv_headroom_load:weekday_avg1h_carried": avg1h,
        "model:kv_headroom_load:peak_now": peak_now,
        "model:kv_headroom_runway_days": 7 * (EXACT_PODS - peak_now) / growth,
        "model:kv_headroom_load:peak_in_30d": peak_in_30d,
        "model:kv_headroom_replicas_needed_in_30d:ceil": math.ceil(1.5 * peak_in_30d),
    }


def exact_test() -> dict[str, Any]:
    n = EXACT_DAYS * 96
    ratio = " ".join(repr(1 / _exact_load(i / 96)) for i in range(n + 1))
    series = [
        *({"series": f'kv_headroom_info{{job="{JOB}",instance="exact-{i}:9847",model="exact"}}',
           "values": f"1x{n}"} for i in range(EXACT_PODS)),
        {"series": f'kv_headroom_load_headroom_ratio{{job="{JOB}",instance="exact-0:9847",'
                   'engine="0"}', "values": ratio},
    ]  # fmt: skip
    # Within a thousandth (of the value, where it is above 1): the capacity group reads
    # model:kv_headroom_load:sum, which another group records, and at a time both groups
    # evaluate promtool runs them in either order (seen: the same file passed once and
    # failed twice at 1e-9), so a record may or may not hold that group's newest sample:
    # the load moves 1.5e-4 pods a sample. The terms told apart here differ by 0.03 or more.
    checks = [
        {"expr": f'abs({name}{{model="exact"}} - {value!r}) < bool {1e-3 * max(1.0, abs(value)):g}',
         "eval_time": f"{EXACT_DAYS}d", "exp_samples": [{"labels": '{model="exact"}', "value": 1}]}
        for name, value in exact_values().items()
    ]  # fmt: skip
    return {
        "name": "every record of the capacity group on a noise-free linear load, by hand",
        "interval": STEP,
        "input_series": series,
        "promql_expr_test": checks,
    }


def flat_test() -> dict[str, Any]:
    """Every record's exact value on a flat load of 2 pods' worth, all day, six weeks: on 4
    pods it has no runway (no growth); on 2 pods its peak is at the capacity, runway 0, and
    the ticket fires. Values a float holds exactly, so each record is checked as itself."""
    n = EXACT_DAYS * 96
    series: list[dict[str, str]] = []
    for model, pods in (("flat", 4), ("full", 2)):
        series += [
            {"series": f'kv_headroom_info{{job="{JOB}",instance="{model}-{i}:9847",'
                       f'model="{model}"}}', "values": f"1x{n}"}
            for i in range(pods)
        ]  # fmt: skip
        series.append({
            "series": f'kv_headroom_load_headroom_ratio{{job="{JOB}",instance="{model}-0:9847",'
                      'engine="0"}', "values": f"0.5x{n}",
        })  # fmt: skip
    both: dict[str, float] = {"flat": 4, "full": 2}
    values: dict[str, dict[str, float]] = {
        "model:kv_headroom_pods:count": both,
        "model:kv_headroom_pods:capacity": both,
        **{
            name: {"flat": 2, "full": 2}
            for name in (
                "model:kv_headroom_load:avg1h", "model:kv_headroom_load:max1d",
                "model:kv_headroom_load:max1w", "model:kv_headroom_load:weekday_avg1h",
                "model:kv_headroom_load:weekday_max1d",
                "model:kv_headroom_load:weekday_avg1h_carried", "model:kv_headroom_load:peak_now",
                "model:kv_headroom_load:peak_in_30d",
            )
        },
        "model:kv_headroom_load_growth:delta1w": {"flat": 0, "full": 0},
        "model:kv_headroom_load_growth:median3w_delta1w": {"flat": 0, "full": 0},
        "model:kv_headroom_runway_days": {"full": 0},
        "model:kv_headroom_replicas_needed_in_30d:ceil": {"flat": 3, "full": 3},
    }  # fmt: skip
    at = f"{EXACT_DAYS}d"
    checks: list[dict[str, Any]] = [
        {"expr": name, "eval_time": at,
         "exp_samples": [{"labels": f'{name}{{model="{m}"}}', "value": v}
                         for m, v in sorted(by_model.items())]}
        for name, by_model in values.items()
    ]  # fmt: skip
    # Declared ceilings: none in the committed rules.
    checks.append({"expr": "model:kv_headroom_pods:ceiling", "eval_time": at, "exp_samples": []})
    checks.append(_firing(["full"], at))
    ticket = {
        "exp_labels": {"severity": "warning", "model": "full"},
        "exp_annotations": {
            "summary": "Capacity runway of full is about 0 days.",
            "description": (
                "At its growth of the last three weeks, the weekday peak load of full reaches "
                "the capacity it is measured against (2 pods) in 0.0 days: add replicas, raise "
                "the ceiling, or fit more traffic per pod before then. Replicas needed in 30 "
                "days: 3."
            ),
            "runbook_url": f"{RUNBOOK_BASE}#vllmkvcacherunwayshort",
        },
    }
    return {
        "name": "every record's exact value on a flat load, and the ticket at the capacity",
        "interval": STEP,
        "input_series": series,
        "promql_expr_test": checks,
        # Silent the day before the 34 days of history it needs, then a ticket, not a page.
        "alert_rule_test": [
            {"eval_time": f"{RUNWAY_AFTER_DAYS - 1}d", "alertname": ALERT, "exp_alerts": []},
            {"eval_time": at, "alertname": ALERT, "exp_alerts": [ticket]},
        ],
    }


def render_test_file(truths: Sequence[Truth], sweeps: Sequence[Truth]) -> str:
    doc = {
        "rule_files": ["../kv-headroom.rules.yml"],
        "evaluation_interval": STEP,
        "tests": [flat_test(), exact_test(), truths_test(truths), sweeps_test(sweeps)],
    }
    header = (
        "# Generated by `python -m tests.rules.runway_truths` from tests/rules/runway_truths.py\n"
        "# (the truths) and tests/rules/runway_promtool.py (the checks); do not edit.\n"
    )
    return header + yaml.safe_dump(doc, sort_keys=False, width=10**9)
