"""How one alert rule is scored on replayed runs — the part of ``alert_quality.py`` that
``fuzz.py`` and ``fuzz_frontier.py`` score with too, so that none of them imports another's
command line.

Rules are evaluated on the polled series with Prometheus's ``for:`` logic (``episodes``);
a run that preempted gives a lead before its first preemption (``lead``), a run that never
did gives false-alarm minutes; ``evaluate`` sums them per rule and scenario class with the
bottleneck gauge's accuracy; ``targets`` is issue 13's bar. What each figure means is
``alert_quality.py``'s docstring.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from exporter.metrics import USAGE_PEAK_PAGE, USAGE_PEAK_WARNING
from exporter.replay import Replay, Tick
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
# A safe run's alert minutes that follow a poll at this usage by at most the model's horizon
# are reported apart ("near a miss"): the cache came within 5 % of preempting, so a warning
# there is arguably due. A reporting split only: nothing in the model reads it.
NEAR_MISS_USAGE = 0.95
STALL_FLAG_SECONDS = 60.0  # issue 13: a stall is flagged as ``stalled`` within a minute


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


def share_text(shares: dict[str, float]) -> str:
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
