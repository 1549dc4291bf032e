"""How early, and how rarely wrongly, each alert rule warns of vLLM's first preemption.

Every scenario of the simulator's library (and any ``--scenario FILE``) runs on the
virtual clock, once per seed (``--seeds N``: the file's seed, +100, +200, ...), with the
sidecar's own poll pipeline watching it every 2 s. For each
scenario the simulator knows when vLLM first preempted (not when its lagging counter
said so). Rules are evaluated on the polled series with Prometheus's ``for:`` logic:

* ``kv_headroom``                  ``kv_headroom_preemption_risk > 0.5`` (the shipped alert)
* ``usage_above_90_for_10m``       ``vllm:kv_cache_usage_perc > 0.9 for 10m``
* ``usage_above_90``               ``vllm:kv_cache_usage_perc > 0.9``
* ``preemption_in_last_5m``        ``increase(vllm:num_preemptions_total[5m]) > 0``

Per rule: recall on the overload scenarios (it fired at all), lead before the first
preemption (the firing episode that covers it, or the first one after it — then the
lead is negative), false-alarm minutes on the safe scenarios.

    python benchmarks/alert_quality.py [--scenario FILE ...] [--no-library] [--seeds N]
        [--output json] [--plot DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.log import configure
from exporter.risk.model import ALERT_FOR_SECONDS, ALERT_THRESHOLD
from exporter.simulator.replay import Replay, Tick, replay
from exporter.simulator.simulation import builtin_names, load_scenario

Condition = Callable[[list[Tick], int], bool]


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


RULES = (
    Rule(
        "kv_headroom",
        f"kv_headroom_preemption_risk > {ALERT_THRESHOLD} for {ALERT_FOR_SECONDS:g}s",
        lambda ticks, i: ticks[i].preemption_risk > ALERT_THRESHOLD,
        ALERT_FOR_SECONDS,
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


def evaluate(replays: Sequence[Replay]) -> dict[str, object]:
    rules: dict[str, dict[str, object]] = {}
    scenarios: list[dict[str, object]] = []
    per_rule_eps = {rule.name: [episodes(r.ticks, rule) for r in replays] for rule in RULES}
    for r_index, rep in enumerate(replays):
        entry: dict[str, object] = {
            "name": rep.scenario.name,
            "seed": rep.scenario.seed,
            "expect": rep.scenario.expect,
            "first_preemption_seconds": rep.first_preemption_at,
            "rules": {},
        }
        for rule in RULES:
            eps = per_rule_eps[rule.name][r_index]
            row: dict[str, object] = {"episodes": [[round(a, 1), round(b, 1)] for a, b in eps]}
            if rep.first_preemption_at is not None:
                value = lead(eps, rep.first_preemption_at)
                row["lead_seconds"] = None if value is None else round(value, 1)
            else:
                row["false_alarm_minutes"] = round(sum(b - a for a, b in eps) / 60, 2)
            entry["rules"][rule.name] = row  # type: ignore[index]
        scenarios.append(entry)
    overload = [s for s in scenarios if s["first_preemption_seconds"] is not None]
    safe = [s for s in scenarios if s["first_preemption_seconds"] is None]
    for rule in RULES:
        leads = [s["rules"][rule.name]["lead_seconds"] for s in overload]  # type: ignore[index]
        found = sorted(v for v in leads if v is not None)
        rules[rule.name] = {
            "expr": rule.expr,
            "recall": round(len(found) / len(overload), 3) if overload else None,
            "median_lead_seconds": statistics.median(found) if found else None,
            "worst_lead_seconds": found[0] if found else None,
            "false_alarm_minutes": round(
                sum(s["rules"][rule.name]["false_alarm_minutes"] for s in safe),  # type: ignore[index]
                2,
            ),
        }
    return {"rules": rules, "scenarios": scenarios}


def targets(result: dict[str, object]) -> list[tuple[str, bool]]:
    rules = result["rules"]
    ours = rules["kv_headroom"]  # type: ignore[index]
    checks = [
        ("recall ≥ 0.9", (ours["recall"] or 0) >= 0.9),
        ("median lead ≥ 60 s", (ours["median_lead_seconds"] or -math.inf) >= 60),
        ("no false alarm on the safe scenarios", ours["false_alarm_minutes"] == 0),
    ]
    for name, other in rules.items():  # type: ignore[attr-defined]
        if name == "kv_headroom" or other["false_alarm_minutes"] > ours["false_alarm_minutes"]:
            continue
        longer = (ours["median_lead_seconds"] or -math.inf) > (
            other["median_lead_seconds"] if other["median_lead_seconds"] is not None else -math.inf
        )
        checks.append((f"median lead longer than {name} (as few or fewer false alarms)", longer))
    return checks


def plot(replays: Sequence[Replay], result: dict[str, object], folder: Path) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot needs matplotlib (pip install -e '.[dev]')") from None
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    colors = {"kv_headroom": "tab:red", "usage_above_90_for_10m": "tab:purple",
              "usage_above_90": "tab:orange", "preemption_in_last_5m": "tab:gray"}  # fmt: skip
    for rep, entry in zip(replays, result["scenarios"], strict=True):  # type: ignore[call-overload]
        ts = [t.t / 60 for t in rep.ticks]
        fig, ax = plt.subplots(figsize=(10, 4.8))
        usage = [t.usage for t in rep.ticks]
        risk = [t.preemption_risk for t in rep.ticks]
        tte = [min(t.seconds_to_exhaustion, 600) / 600 for t in rep.ticks]
        ax.plot(ts, usage, lw=0.8, color="tab:blue", label="KV usage (vLLM)")
        ax.plot(ts, risk, lw=1.2, color="tab:red", label="preemption risk")
        tte_label = "time to exhaustion (÷10 min, capped)"
        ax.plot(ts, tte, lw=0.5, color="tab:green", alpha=0.45, label=tte_label)
        for k, (name, row) in enumerate(entry["rules"].items()):
            for a, b in row["episodes"]:
                ax.axvspan(a / 60, b / 60, ymin=1.0 + 0.04 * k, ymax=1.035 + 0.04 * k,
                           color=colors[name], clip_on=False)  # fmt: skip
            ax.plot([], [], color=colors[name], lw=4, label=f"fires: {name}")
        if rep.first_preemption_at is not None:
            first = rep.first_preemption_at / 60
            ax.axvline(first, color="black", ls="--", lw=1, label="first preemption")
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("minutes")
        title = f"{rep.scenario.name}, seed {rep.scenario.seed} ({rep.scenario.expect})"
        ax.set_title(title, loc="left", pad=26)
        ax.legend(loc="upper left", bbox_to_anchor=(0, -0.14), fontsize=7, ncol=4, frameon=False)
        fig.tight_layout()
        path = folder / f"{rep.scenario.name}-{rep.scenario.seed}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", action="append", default=[], help="a scenario YAML file")
    parser.add_argument("--output", choices=("table", "json"), default="table")
    parser.add_argument("--plot", type=Path, help="write one PNG per scenario into this folder")
    parser.add_argument("--interval", type=float, default=2.0, help="poll interval, seconds")
    parser.add_argument("--seeds", type=int, default=3, help="runs of each scenario (seeds)")
    parser.add_argument(
        "--no-library", action="store_true", help="only the --scenario files, not the library"
    )
    args = parser.parse_args(argv)
    configure("error", "json", sys.stderr)
    library = [] if args.no_library else [n for n in builtin_names() if n != "demo"]
    scenarios = [load_scenario(n) for n in library]
    scenarios += [load_scenario(f) for f in args.scenario]
    scenarios = [
        dataclasses.replace(s, seed=s.seed + 100 * k) for s in scenarios for k in range(args.seeds)
    ]
    replays = [replay(s, args.interval) for s in scenarios]
    result = evaluate(replays)
    if args.plot:
        for path in plot(replays, result, args.plot):
            print(f"wrote {path}", file=sys.stderr)
    if args.output == "json":
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"{len(scenarios)} runs ({args.seeds} seeds per scenario), polled every "
        f"{args.interval:g} s on the virtual clock; rules evaluated at every poll\n"
    )
    head = f"{'rule':<24} {'recall':>6} {'median lead':>12} {'worst lead':>11} {'false alarms':>13}"
    print(head)
    for name, row in result["rules"].items():  # type: ignore[attr-defined]
        med = "–" if row["median_lead_seconds"] is None else f"{row['median_lead_seconds']:+.0f} s"
        worst = "–" if row["worst_lead_seconds"] is None else f"{row['worst_lead_seconds']:+.0f} s"
        fa = row["false_alarm_minutes"]
        print(f"{name:<24} {row['recall']:>6.2f} {med:>12} {worst:>11} {fa:>9.1f} min")
    print()
    for s in result["scenarios"]:  # type: ignore[attr-defined]
        cells = []
        for name, row in s["rules"].items():
            if "lead_seconds" in row:
                v = row["lead_seconds"]
                cells.append(f"{name} {'missed' if v is None else f'{v:+.0f}s'}")
            else:
                cells.append(f"{name} {row['false_alarm_minutes']:.1f}min")
        first = s["first_preemption_seconds"]
        when = f"first preemption {first:.0f} s" if first is not None else "never preempts"
        print(f"  {s['name']:<20} {s['seed']:>4} {when:<24} " + " · ".join(cells))
    print()
    for label, ok in targets(result):
        print(f"  {'✓' if ok else '✗'} {label}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
