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
import json
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.alert_scoring import NEAR_MISS_USAGE, evaluate, share_text, targets
from benchmarks.fuzz import main_fuzz
from benchmarks.library import builtin_names, load_scenario
from exporter.log import configure
from exporter.replay import Replay, replay
from exporter.risk.model import (
    HORIZON,
)
from exporter.simulator.scenario import Scenario

FAST_SECONDS = 600.0
DEFAULT_PLOTS = Path(__file__).resolve().parent.parent / "docs" / "traffic"


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
            f"  waited on {share_text(b['waited_share'])}"
            + (f" (two at once {joint:.2f})" if joint >= 0.005 else "")
            + f"; gauge {share_text(b['named_share'])}"
            if b["waited_share"]
            else ""
        )
        out.append(
            f"  {s['name']:<34} {s['seed']:>4} {when:<24} "
            + " · ".join(cells)
            + f"  [{share_text(b['truth_share'])}]"
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
