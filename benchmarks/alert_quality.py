"""How early, and how rarely wrongly, each alert rule warns of vLLM's first preemption —
per scenario class, on synthetic and real traffic — and how often the sidecar's
bottleneck gauge names what really kept requests waiting.

Every scenario of the simulator's library (and any ``--scenario FILE``) runs on the
virtual clock, once per seed (``--seeds N``: the file's seed, +100, +200, ...; for a
request-log scenario each seed replays a different sample of the log), with the
sidecar's own poll pipeline watching it every 2 s. The simulator knows when vLLM first
preempted (not when its lagging counter said so) and why requests waited at every step.
Rules are evaluated on the polled series with Prometheus's ``for:`` logic:

* ``kv_headroom``                  the shipped page (``VllmKvCachePreemptionImminent``)
* ``kv_headroom_warning``          the shipped warning (``VllmKvCachePreemptionLikely``)
* ``usage_above_90_for_10m``       ``vllm:kv_cache_usage_perc > 0.9 for 10m``
* ``usage_above_90``               ``vllm:kv_cache_usage_perc > 0.9``
* ``preemption_in_last_5m``        ``increase(vllm:num_preemptions_total[5m]) > 0``

Per rule and per scenario class (a scenario's first tag; untagged ones are
``synthetic``): recall on the runs that preempted (the alert fired at all), lead before
the first preemption (the firing episode that covers it, or the first one after it —
then the lead is negative), false-alarm minutes per hour of runs that never preempted.
A run is judged by what happened, not by the scenario's ``expect``; a run whose outcome
contradicts ``expect`` is listed. Bottleneck: the share of polls where the sidecar's
``EngineView.bottleneck`` names the reason requests waited longest over the poll's
interval ("n/a" while the sidecar has no such gauge); per run, whether the resource the
gauge named for most waiting requests (requests waiting × poll interval) is the reason
requests waited on most (request-seconds, which the simulator counts); and how soon a
stall is flagged. Where two resources bound in the same step (the token budget spent on
running prefills while the head does not fit the free blocks), the simulator labels the
step ``kv_cache`` by convention but records both: a run is judged right when the gauge's
resource bound for at least as many request-seconds as any other bound without it
(``held_longest``); the count by the simulator's one label is printed beside it. A poll
sees the queue at one instant, not the head request's length, which decides between
``compute`` and ``kv_cache`` on a saturated server: the per-poll figure has a ceiling
below 1 that no reading of ``/metrics`` lifts, so it is printed, not a target.

    python benchmarks/alert_quality.py [--scenario FILE ...] [--no-library] [--only NAME ...]
        [--seeds N] [--fast] [--jobs N] [--output json] [--plot [DIR]]

``--fuzz N --seed S`` runs N hours drawn from the randomized family instead
(``benchmarks/fuzz.py``).

``--fast`` (CI): one seed, polls every 5 s, each run cut to its first 10 minutes.
``--plot`` writes one PNG per real-traffic scenario (first seed) into DIR (docs/traffic).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.library import builtin_names, load_scenario
from exporter.log import configure
from exporter.metrics import USAGE_PEAK_PAGE, USAGE_PEAK_WARNING
from exporter.replay import Replay, Tick, replay
from exporter.risk.model import (
    ALERT_FOR_SECONDS,
    ALERT_THRESHOLD,
    ALERT_USAGE,
    ALERT_USAGE_WINDOW_SECONDS,
    HORIZON,
    WARNING_CERTAIN,
    WARNING_FOR_SECONDS,
    WARNING_THRESHOLD,
    WARNING_USAGE,
    WARNING_USAGE_WINDOW_SECONDS,
    page_holds,
    warning_holds,
)
from exporter.simulator.scenario import Scenario

Condition = Callable[[list[Tick], int], bool]
REAL = "real-traffic"
FAST_SECONDS = 600.0
# A safe run's alert minutes that follow a poll at this usage by at most the model's horizon
# are reported apart ("near a miss"): the cache came within 5 % of preempting, so a warning
# there is arguably due. A reporting split only: nothing in the model reads it.
NEAR_MISS_USAGE = 0.95
STALL_FLAG_SECONDS = 60.0  # issue 13: a stall is flagged as ``stalled`` within a minute
DEFAULT_PLOTS = Path(__file__).resolve().parent.parent / "docs" / "traffic"


@dataclass(frozen=True)
class Rule:
    name: str
    expr: str
    condition: Condition
    for_seconds: float


def _recent_counted_increase(ticks: list[Tick], i: int, window: float = 300.0) -> bool:
    """``increase(vllm:num_preemptions_total[5m]) > 0`` at poll ``i``."""
    now = ticks[i].t
    j = i
    while j > 0 and ticks[j - 1].t >= now - window:
        j -= 1
    return ticks[i].preemptions_counted > ticks[max(0, j - 1)].preemptions_counted


def max_over_time(ticks: list[Tick], window: float) -> list[float]:
    """``max_over_time(usage[window])`` at every poll (the sidecar's or vLLM's): the highest usage
    among the samples in ``(t - window, t]`` (a monotone deque, so one pass)."""
    out: list[float] = []
    kept: deque[int] = deque()  # indices of decreasing usages, oldest first
    for i, x in enumerate(ticks):
        while kept and ticks[kept[-1]].usage <= x.usage:
            kept.pop()
        kept.append(i)
        while ticks[kept[0]].t <= x.t - window:  # left-open, as a range selector is
            kept.popleft()
        out.append(ticks[kept[0]].usage)
    return out


def series_above(series: Callable[[list[Tick]], list[float]], th: float) -> Condition:
    """A condition on a value worked out over a whole run (once per run's tick list)."""
    memo: dict[int, tuple[list[Tick], list[float]]] = {}

    def condition(ticks: list[Tick], i: int) -> bool:
        held = memo.get(id(ticks))
        if held is None or held[0] is not ticks:
            held = (ticks, series(ticks))
            memo.clear()  # one run at a time: the last run's values are not needed again
            memo[id(ticks)] = held
        return held[1][i] > th

    return condition


def score_and_usage_peak(th: float, u: float, window: float) -> Condition:
    """``kv_headroom_preemption_risk > th and max_over_time(usage[window]) > u``: the score
    above ``th`` while the cache was above ``u`` at some sample of the last ``window``
    seconds, a gate a batch finishing between two evaluations does not reset."""

    def gated(ticks: list[Tick]) -> list[float]:
        peak = max_over_time(ticks, window)
        return [m if t.preemption_risk > th else -1.0 for t, m in zip(ticks, peak, strict=True)]

    return series_above(gated, u)


def shipped_condition(holds: Callable[[float, float | None], bool], window: float) -> Condition:
    """A shipped alert's expression at every poll: ``holds`` (the model's ``page_holds`` or
    ``warning_holds``, which the status page and the e2e checks ask too) on the score and
    the usage's peak over ``window``."""

    def held(ticks: list[Tick]) -> list[float]:
        peak = max_over_time(ticks, window)
        return [float(holds(t.preemption_risk, m)) for t, m in zip(ticks, peak, strict=True)]

    return series_above(held, 0.5)


RULES = (
    # The shipped page and warning, as rules/kv-headroom.rules.yml writes them.
    Rule(
        "kv_headroom",
        f"kv_headroom_preemption_risk > {ALERT_THRESHOLD:g} and "
        f"kv_headroom_{USAGE_PEAK_PAGE} > {ALERT_USAGE:g} for {ALERT_FOR_SECONDS:g}s",
        shipped_condition(page_holds, ALERT_USAGE_WINDOW_SECONDS),
        ALERT_FOR_SECONDS,
    ),
    Rule(
        "kv_headroom_warning",
        f"kv_headroom_preemption_risk > {WARNING_THRESHOLD:g} and "
        f"kv_headroom_{USAGE_PEAK_WARNING} > {WARNING_USAGE:g} "
        f"or kv_headroom_preemption_risk > {WARNING_CERTAIN:g} for {WARNING_FOR_SECONDS:g}s",
        shipped_condition(warning_holds, WARNING_USAGE_WINDOW_SECONDS),
        WARNING_FOR_SECONDS,
    ),
    Rule(
        "usage_above_90_for_10m",
        "vllm:kv_cache_usage_perc > 0.9 for 10m",
        lambda ticks, i: ticks[i].usage > 0.9,
        600.0,
    ),
    Rule("usage_above_90", "vllm:kv_cache_usage_perc > 0.9", lambda t, i: t[i].usage > 0.9, 0.0),
    Rule(
        "preemption_in_last_5m",
        "increase(vllm:num_preemptions_total[5m]) > 0",
        _recent_counted_increase,
        0.0,
    ),
)


def episodes(ticks: list[Tick], rule: Rule) -> list[tuple[float, float]]:
    """(firing from, firing until) with Prometheus's for: a condition must hold at every
    evaluation for ``for_seconds`` before the alert fires; one false evaluation resets it."""
    out: list[tuple[float, float]] = []
    pending: float | None = None
    firing: float | None = None
    for i, tick in enumerate(ticks):
        if rule.condition(ticks, i):
            pending = tick.t if pending is None else pending
            if firing is None and tick.t - pending >= rule.for_seconds:
                firing = tick.t
        else:
            if firing is not None:
                out.append((firing, tick.t))
            pending = firing = None
    if firing is not None:
        out.append((firing, ticks[-1].t))
    return out


def lead(eps: Sequence[tuple[float, float]], preempted_at: float) -> float | None:
    for start, end in eps:
        if start <= preempted_at <= end:
            return preempted_at - start
    later = [start for start, _ in eps if start > preempted_at]
    return preempted_at - later[0] if later else None


def scenario_class(scenario: Scenario) -> str:
    tags = [t for t in scenario.tags if t != REAL]
    return tags[0] if tags else "synthetic"


def bottleneck_score(rep: Replay) -> dict[str, Any]:
    """Gauge vs the simulator's truth: accuracy over the polls where the gauge reads; the
    reason requests waited on most over the run (request-seconds, the simulator) against
    the resource the gauge named for most of them (requests waiting × poll interval); and
    seconds from each stall's start to the first poll that says ``stalled``."""
    read = [t for t in rep.ticks if t.gauge is not None]
    waited = {k: v for k, v in rep.request_seconds.items() if k != "none" and v > 0}
    named: dict[str, float] = {}
    for before, tick in itertools.pairwise(read):  # each poll weighs the interval before it
        if tick.gauge is not None and tick.gauge != "none":
            named[tick.gauge] = named.get(tick.gauge, 0.0) + tick.waiting * (tick.t - before.t)
    main = max(waited.items(), key=lambda kv: kv[1])[0] if waited else None
    gauge_main = max(named.items(), key=lambda kv: kv[1])[0] if named else None
    # Without the simulator's binding sets (an older replay), each reason bound alone.
    binding = dict(rep.binding_seconds) or waited
    joint = sum(v for k, v in binding.items() if "+" in k)
    judged = main is not None and bool(read)  # nobody waited, or the sidecar has no gauge
    out: dict[str, Any] = {
        "polls": len(read),
        "accuracy": round(sum(t.gauge == t.truth for t in read) / len(read), 3) if read else None,
        "truth_share": _shares([t.truth for t in rep.ticks]),
        "waited_share": _weights(waited),
        "bound_share": _weights(binding),  # by the set of resources that bound at once
        "jointly_bound_share": round(joint / sum(binding.values()), 3) if joint else 0.0,
        "named_share": _weights(named),
        "names_main_reason": (
            None if not judged else gauge_main is not None and held_longest(gauge_main, binding)
        ),
        # The stricter reading: the one reason the simulator records per step, where it
        # breaks a tie between two resources that bound at once by its own convention.
        "names_main_reason_by_label": None if not judged else gauge_main == main,
    }
    delays: list[float | None] = []
    for begin, _end in rep.scenario.stalls:
        flagged = [t.t for t in read if t.t >= begin and t.gauge == "stalled"]
        delays.append(round(flagged[0] - begin, 1) if flagged and read else None)
    if rep.scenario.stalls:
        out["stall_flagged_after_seconds"] = delays
    return out


def _held(binding: dict[str, float], resource: str, without: str | None = None) -> float:
    """Request-seconds in which ``resource`` bound (alone or with others; keys are
    resources joined by "+"), leaving out those in which ``without`` bound too."""
    total = 0.0
    for key, seconds in binding.items():
        held = key.split("+")
        if resource in held and (without is None or without not in held):
            total += seconds
    return total


def held_longest(resource: str, binding: dict[str, float]) -> bool:
    """Whether ``resource`` is the main reason requests waited: it bound (alone or with
    another) for at least as many request-seconds as any other resource bound without it.

    Where two bound in the same step (the token budget spent on running prefills and the
    head too long for the free blocks), vLLM's scheduler stops at the first it checks and
    either cure alone would not admit the head: calling one of them the cause is a
    convention, and a gauge is not wrong for naming the other."""
    others = {r for key in binding for r in key.split("+")} - {resource, "none"}
    mine = _held(binding, resource)
    return all(mine >= _held(binding, r, without=resource) for r in others)


def _shares(values: Sequence[str]) -> dict[str, float]:
    counts: dict[str, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return {k: round(n / len(values), 3) for k, n in sorted(counts.items())} if values else {}


def _weights(values: dict[str, float]) -> dict[str, float]:
    total = sum(values.values())
    return {k: round(v / total, 3) for k, v in sorted(values.items())} if total else {}


def _share_text(shares: dict[str, float]) -> str:
    return ",".join(f"{k}:{v:.2f}" for k, v in shares.items())


def near_miss_seconds(ticks: Sequence[Tick], eps: Sequence[tuple[float, float]]) -> float:
    """Seconds of the firing episodes that lie within ``HORIZON`` after a poll at
    ``NEAR_MISS_USAGE`` or more (a poll at that usage counts from itself on)."""
    highs = [t.t for t in ticks if t.usage >= NEAR_MISS_USAGE]
    near = [(h, h + HORIZON) for h in highs]
    total = 0.0
    for start, end in eps:
        covered = [(max(start, a), min(end, b)) for a, b in near if a < end and b > start]
        reach = start
        for a, b in sorted(covered):  # the union of the overlaps, counted once
            if b > reach:
                total += b - max(a, reach)
                reach = b
    return total


def _summary(entries: Sequence[dict[str, Any]], rule: Rule) -> dict[str, Any]:
    overload = [s for s in entries if s["first_preemption_seconds"] is not None]
    safe = [s for s in entries if s["first_preemption_seconds"] is None]
    leads = [s["rules"][rule.name]["lead_seconds"] for s in overload]
    found = sorted(v for v in leads if v is not None)
    minutes = sum(b - a for s in safe for a, b in s["rules"][rule.name]["episodes"]) / 60
    near = sum(s["rules"][rule.name].get("near_miss_minutes", 0.0) for s in safe)
    hours = sum(s["duration_seconds"] for s in safe) / 3600
    return {
        "expr": rule.expr,
        "overload_runs": len(overload),
        "safe_runs": len(safe),
        "recall": round(len(found) / len(overload), 3) if overload else None,
        "median_lead_seconds": statistics.median(found) if found else None,
        "worst_lead_seconds": found[0] if found else None,
        "false_alarm_minutes": round(minutes, 2),
        "false_alarm_minutes_near_a_miss": round(near, 2),
        "safe_hours": round(hours, 3),
        "false_alarm_minutes_per_safe_hour": round(minutes / hours, 2) if hours else None,
    }


def evaluate(replays: Sequence[Replay]) -> dict[str, Any]:
    scenarios: list[dict[str, Any]] = []
    for rep in replays:
        duration = rep.ticks[-1].t if rep.ticks else 0.0
        entry: dict[str, Any] = {
            "name": rep.scenario.name,
            "seed": rep.scenario.seed,
            "class": scenario_class(rep.scenario),
            "real_traffic": REAL in rep.scenario.tags,
            "expect": rep.scenario.expect,
            "duration_seconds": duration,
            "first_preemption_seconds": rep.first_preemption_at,
            "rules": {},
            "bottleneck": bottleneck_score(rep),
        }
        for rule in RULES:
            eps = episodes(rep.ticks, rule)
            row: dict[str, Any] = {"episodes": [[round(a, 1), round(b, 1)] for a, b in eps]}
            if rep.first_preemption_at is not None:
                value = lead(eps, rep.first_preemption_at)
                row["lead_seconds"] = None if value is None else round(value, 1)
            else:
                row["false_alarm_minutes"] = round(sum(b - a for a, b in eps) / 60, 2)
                row["near_miss_minutes"] = round(near_miss_seconds(rep.ticks, eps) / 60, 2)
            entry["rules"][rule.name] = row
        scenarios.append(entry)
    groups: dict[str, list[dict[str, Any]]] = {}
    for s in scenarios:
        groups.setdefault(s["class"], []).append(s)
    real = [s for s in scenarios if s["real_traffic"]]
    return {
        "rules": {rule.name: _summary(scenarios, rule) for rule in RULES},
        "real_traffic": {rule.name: _summary(real, rule) for rule in RULES} if real else {},
        "classes": {
            name: {
                "rules": {rule.name: _summary(group, rule) for rule in RULES},
                "bottleneck_accuracy": _mean_accuracy(group),
                "bottleneck_main_reason": _main_reason(group),
                "bottleneck_main_reason_by_label": _main_reason(
                    group, "names_main_reason_by_label"
                ),
            }
            for name, group in sorted(groups.items())
        },
        "bottleneck_accuracy": _mean_accuracy(scenarios),
        "bottleneck_main_reason": _main_reason(scenarios),
        "bottleneck_main_reason_by_label": _main_reason(scenarios, "names_main_reason_by_label"),
        "stall_flagged_after_seconds": _stall_delays(scenarios),
        "outcome_differs_from_expect": [
            f"{s['name']} seed {s['seed']}"
            for s in scenarios
            if (s["first_preemption_seconds"] is not None) != (s["expect"] == "overload")
        ],
        "scenarios": scenarios,
    }


def _mean_accuracy(entries: Sequence[dict[str, Any]]) -> float | None:
    values = [s["bottleneck"]["accuracy"] for s in entries]
    known = [v for v in values if v is not None]
    return round(statistics.fmean(known), 3) if known else None


def _main_reason(entries: Sequence[dict[str, Any]], key: str = "names_main_reason") -> list[int]:
    """[runs whose main reason the gauge named, runs where requests waited]."""
    judged = [s["bottleneck"][key] for s in entries]
    known = [v for v in judged if v is not None]
    return [sum(known), len(known)]


def _stall_delays(entries: Sequence[dict[str, Any]]) -> list[float | None]:
    """Seconds from each simulated stall's start to the first poll saying ``stalled``."""
    return [d for s in entries for d in s["bottleneck"].get("stall_flagged_after_seconds", [])]


def _ge(value: float | None, bound: float) -> bool:
    return value is not None and value >= bound


def targets(result: dict[str, Any]) -> list[tuple[str, bool | None]]:
    """Issue 13's bar; None where it cannot be judged yet (no run of that kind, no gauge)."""
    ours = result["rules"]["kv_headroom"]
    ramps = [
        s["rules"]["kv_headroom"].get("lead_seconds")
        for s in result["scenarios"]
        if "ramp" in s["class"] or "ramp" in s["name"]
        if s["first_preemption_seconds"] is not None
    ]
    fa_hour = ours["false_alarm_minutes_per_safe_hour"]
    checks: list[tuple[str, bool | None]] = [
        ("recall ≥ 0.9", None if ours["recall"] is None else ours["recall"] >= 0.9),
        ("median lead ≥ 60 s", None if ours["recall"] is None else
         _ge(ours["median_lead_seconds"], 60)),
        ("worst lead ≥ 0 s on ramping scenarios", None if not ramps else
         all(v is not None and v >= 0 for v in ramps)),
        ("≤ 1 false-alarm minute per safe hour", None if fa_hour is None else fa_hour <= 1),
    ]  # fmt: skip
    real = result["real_traffic"].get("kv_headroom")
    if real:
        fa_real = real["false_alarm_minutes_per_safe_hour"]
        checks.append(
            ("≤ 1 false-alarm minute per safe hour on real traffic",
             None if fa_real is None else fa_real <= 1)
        )  # fmt: skip
    for name, other in result["rules"].items():
        if name == "kv_headroom" or other["false_alarm_minutes"] > ours["false_alarm_minutes"]:
            continue
        mine, theirs = ours["median_lead_seconds"], other["median_lead_seconds"]
        longer = (mine if mine is not None else -math.inf) > (
            theirs if theirs is not None else -math.inf
        )
        checks.append((f"median lead longer than {name} (as few or fewer false alarms)", longer))
    named, runs = result["bottleneck_main_reason"]
    checks.append(
        ("bottleneck gauge names the main reason requests waited on, every run",
         None if not runs else named == runs)
    )  # fmt: skip
    stalls = result["stall_flagged_after_seconds"]
    checks.append(
        (f"every stall flagged as stalled within {STALL_FLAG_SECONDS:.0f} s",
         None if not stalls else all(d is not None and d <= STALL_FLAG_SECONDS for d in stalls))
    )  # fmt: skip
    return checks


# -- running ------------------------------------------------------------------------------


def _run(args: tuple[Scenario, float]) -> Replay:
    return replay(*args)


def quiet_worker() -> None:
    """A worker process logs errors only, as ``main`` does: configured where the process
    starts, not per run, so a test that runs the benchmark in-process keeps its logging."""
    configure("error", "json", sys.stderr)


def run_all(scenarios: Sequence[Scenario], interval: float, jobs: int) -> list[Replay]:
    work = [(s, interval) for s in scenarios]
    if jobs <= 1 or len(work) <= 1:
        return [_run(w) for w in work]
    with ProcessPoolExecutor(max_workers=jobs, initializer=quiet_worker) as pool:
        return list(pool.map(_run, work))


def choose(args: argparse.Namespace) -> list[Scenario]:
    names = [] if args.no_library else [n for n in builtin_names() if n != "demo"]
    if args.only:
        unknown = sorted(set(args.only) - set(names))
        if unknown:
            raise SystemExit(f"--only: no library scenario {unknown[0]!r}")
        names = [n for n in names if n in args.only]
    scenarios = [load_scenario(n) for n in names] + [load_scenario(f) for f in args.scenario]
    if args.fast:
        scenarios = [
            dataclasses.replace(s, duration=min(s.duration, FAST_SECONDS)) for s in scenarios
        ]
    return [
        dataclasses.replace(s, seed=s.seed + 100 * k) for s in scenarios for k in range(args.seeds)
    ]


# -- reporting ----------------------------------------------------------------------------


def _seconds(v: float | None) -> str:
    return "–" if v is None else f"{v:+.0f} s"


def _number(v: float | None, fmt: str) -> str:
    return "n/a" if v is None else format(v, fmt)


def _rule_rows(rules: dict[str, Any], indent: str = "") -> list[str]:
    rows = []
    for name, row in rules.items():
        rows.append(
            f"{indent}{name:<24} {_number(row['recall'], '.2f'):>6} "
            f"{_seconds(row['median_lead_seconds']):>11} {_seconds(row['worst_lead_seconds']):>10} "
            f"{_number(row['false_alarm_minutes_per_safe_hour'], '.1f'):>10} "
            f"{row['overload_runs']:>4}/{row['safe_runs']:<4}"
        )
    return rows


def render(result: dict[str, Any], runs: int, seeds: int, interval: float) -> str:
    head = (
        f"{'rule':<24} {'recall':>6} {'median lead':>11} {'worst lead':>10} "
        f"{'FA min/h':>10} {'runs o/s':>9}"
    )
    out = [
        f"{runs} runs ({seeds} seeds per scenario), polled every {interval:g} s on the "
        "virtual clock; FA min/h = false-alarm minutes per hour of runs that never preempted\n",
        "all scenarios",
        head,
        *_rule_rows(result["rules"]),
    ]
    if result["real_traffic"]:
        out += ["", "real traffic", head, *_rule_rows(result["real_traffic"])]
        ours = result["real_traffic"]["kv_headroom"]
        out.append(
            f"kv_headroom false alarms on real traffic: {ours['false_alarm_minutes']:.1f} min, "
            f"{ours['false_alarm_minutes_near_a_miss']:.1f} of them within {HORIZON:.0f} s "
            f"after a poll at ≥ {NEAR_MISS_USAGE:.0%} usage (a near miss)"
        )
    out += ["", "per class"]
    for name, cls in result["classes"].items():
        acc = _number(cls["bottleneck_accuracy"], ".2f")
        named, runs = cls["bottleneck_main_reason"]
        by_label = cls["bottleneck_main_reason_by_label"][0]
        main = (
            f", main reason named in {named}/{runs} runs ({by_label}/{runs} by the "
            "simulator's one label)"
            if runs
            else ""
        )
        out += [
            f"  {name} (bottleneck gauge accuracy {acc}{main})",
            *_rule_rows(cls["rules"], "    "),
        ]
    out.append("")
    for s in result["scenarios"]:
        cells = []
        for name, row in s["rules"].items():
            if "lead_seconds" in row:
                v = row["lead_seconds"]
                cells.append(f"{name} {'missed' if v is None else f'{v:+.0f}s'}")
            else:
                cells.append(f"{name} {row['false_alarm_minutes']:.1f}min")
        first = s["first_preemption_seconds"]
        when = f"first preemption {first:.0f} s" if first is not None else "never preempts"
        b = s["bottleneck"]
        joint = b.get("jointly_bound_share", 0.0)
        waited = (
            f"  waited on {_share_text(b['waited_share'])}"
            + (f" (two at once {joint:.2f})" if joint >= 0.005 else "")
            + f"; gauge {_share_text(b['named_share'])}"
            if b["waited_share"]
            else ""
        )
        out.append(
            f"  {s['name']:<34} {s['seed']:>4} {when:<24} "
            + " · ".join(cells)
            + f"  [{_share_text(b['truth_share'])}]"
            + waited
        )
    if result["outcome_differs_from_expect"]:
        out += [
            "",
            "outcome differs from expect: " + ", ".join(result["outcome_differs_from_expect"]),
        ]
    out.append("")
    for label, ok in targets(result):
        mark = "·" if ok is None else "✓" if ok else "✗"
        out.append(f"  {mark} {label}" + (" (n/a)" if ok is None else ""))
    return "\n".join(out)


COLORS = {"kv_headroom": "tab:red", "kv_headroom_warning": "gold",
          "usage_above_90_for_10m": "tab:purple", "usage_above_90": "tab:orange",
          "preemption_in_last_5m": "tab:gray"}  # fmt: skip
TRUTH_COLORS = {"kv_cache": "tab:red", "max_num_seqs": "tab:purple", "compute": "tab:orange",
                "stalled": "black", "none": "white"}  # fmt: skip


def plot(replays: Sequence[Replay], result: dict[str, Any], folder: Path) -> list[Path]:
    """One PNG per real-traffic scenario (its first seed)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot needs matplotlib (pip install -e '.[dev]')") from None
    folder.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    done: set[str] = set()
    for rep, entry in zip(replays, result["scenarios"], strict=True):
        if not entry["real_traffic"] or rep.scenario.name in done:
            continue
        done.add(rep.scenario.name)
        ts = [t.t / 60 for t in rep.ticks]
        fig, ax = plt.subplots(figsize=(10, 4.8))
        waiting = [t.waiting for t in rep.ticks]
        top = max(max(waiting, default=0.0), 1.0)
        ax.plot(ts, [t.usage for t in rep.ticks], lw=0.8, color="tab:blue", label="KV usage (vLLM)")
        ax.plot(ts, [t.preemption_risk for t in rep.ticks], lw=1.2, color="tab:red",
                label="preemption risk")  # fmt: skip
        ax.plot(ts, [w / top for w in waiting], lw=0.6, color="tab:brown", alpha=0.6,
                label=f"waiting (÷{top:.0f})")  # fmt: skip
        for k, (name, row) in enumerate(entry["rules"].items()):
            for a, b in row["episodes"]:
                ax.axvspan(a / 60, b / 60, ymin=1.0 + 0.04 * k, ymax=1.035 + 0.04 * k,
                           color=COLORS[name], clip_on=False)  # fmt: skip
            ax.plot([], [], color=COLORS[name], lw=4, label=f"fires: {name}")
        ax.scatter(ts, [-0.04] * len(ts), c=[TRUTH_COLORS[t.truth] for t in rep.ticks],
                   marker="|", s=60, clip_on=False)  # fmt: skip
        for reason in ("kv_cache", "max_num_seqs", "compute", "stalled"):
            ax.plot([], [], color=TRUTH_COLORS[reason], lw=4, label=f"waits on: {reason}")
        if rep.first_preemption_at is not None:
            first = rep.first_preemption_at / 60
            ax.axvline(first, color="black", ls="--", lw=1, label="first preemption")
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("minutes")
        title = f"{rep.scenario.name}, seed {rep.scenario.seed} ({rep.scenario.expect})"
        ax.set_title(title, loc="left", pad=26)
        ax.legend(loc="upper left", bbox_to_anchor=(0, -0.16), fontsize=7, ncol=4, frameon=False)
        fig.tight_layout()
        path = folder / f"{rep.scenario.name}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--scenario", action="append", default=[], help="a scenario YAML file")
    parser.add_argument("--only", action="append", default=[], help="only this library scenario")
    parser.add_argument("--output", choices=("table", "json"), default="table")
    parser.add_argument(
        "--plot", type=Path, nargs="?", const=DEFAULT_PLOTS,
        help=f"write one PNG per real-traffic scenario into this folder ({DEFAULT_PLOTS})",
    )  # fmt: skip
    parser.add_argument("--interval", type=float, default=None, help="poll interval, seconds")
    parser.add_argument("--seeds", type=int, default=None, help="runs of each scenario (seeds)")
    parser.add_argument("--fast", action="store_true", help="CI: 1 seed, 5 s polls, 10 min runs")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes")
    parser.add_argument(
        "--no-library", action="store_true", help="only the --scenario files, not the library"
    )
    parser.add_argument(
        "--fuzz", type=int, metavar="N", help="run N hours drawn from the randomized family"
    )
    parser.add_argument("--seed", type=int, default=0, help="the first family seed (--fuzz)")
    parser.add_argument("--no-cache", action="store_true", help="--fuzz: recompute every placement")
    args = parser.parse_args(argv)
    configure("error", "json", sys.stderr)  # the report owns stdout
    if args.fuzz:
        from benchmarks.fuzz import main_fuzz

        return main_fuzz(
            args.fuzz, args.seed, args.interval or 2.0, args.jobs, not args.no_cache, args.output
        )
    args.seeds = args.seeds or (1 if args.fast else 3)
    interval = args.interval or (5.0 if args.fast else 2.0)
    started = time.monotonic()
    scenarios = choose(args)
    replays = run_all(scenarios, interval, args.jobs)
    result = evaluate(replays)
    result["wall_seconds"] = round(time.monotonic() - started, 1)
    result["jobs"] = args.jobs
    if args.plot:
        for path in plot(replays, result, args.plot):
            print(f"wrote {path}", file=sys.stderr)
    if args.output == "json":
        print(json.dumps(result, indent=2))
        return 0
    print(render(result, len(scenarios), args.seeds, interval))
    print(f"\n{len(scenarios)} runs took {result['wall_seconds']:.0f} s with {args.jobs} processes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
