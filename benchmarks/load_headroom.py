"""Does ``kv_headroom_load_headroom_ratio`` mean something? The live ratio against the
true multiple, found by replay, on the simulator's scenario library.

Every scenario of the library (and any ``--scenario FILE``) runs on the virtual clock
with the sidecar's own poll pipeline watching it every 2 s (``--seeds N`` runs each).
Its traffic is cut into ``--window`` pieces; each piece, looped twice so the engine
reaches the steady state of that traffic, is searched like ``plan --traffic`` does
(no preemption, p95 queue wait ≤ ``--max-queue-wait``) for the largest multiple the
deployment holds: the truth for that window. The live ratio for the window is its
median over the window's last minute. Reported:

* the relative error ``|live − true| / true`` over windows whose true multiple is above
  1.2 (the target: median ≤ 25 %), and its distribution by binding resource;
* on the runs that preempt: whether the live ratio fell below 1 (for ``--for`` seconds)
  before the first preemption (target: ≥ 90 % of them), and how long before;
* on the runs that never preempt: minutes with the ratio below 1.

With ``--brute-force`` it also checks ``plan --traffic``'s search on a real request log
(the Mooncake conversation slice in ``tests/fixtures/traces/``): every multiple on a 2 %
grid around the answer is replayed, and the largest grid multiple below the first
failure is compared with the search's answer (target: within 10 %).

With ``--misjudge-steps 2,1`` the sidecar takes a prompt token to cost twice what the
simulated GPU spends on it (and a token of context ``1``×): how far the ratio moves when
the datasheet step times are wrong for a GPU. ``--truths-from`` reuses the true multiples
of an earlier JSON run, which do not depend on the sidecar.

    python benchmarks/load_headroom.py [--seeds N] [--window 5m] [--plot docs/img]
        [--brute-force] [--output json] [--truths-from RUN.json] [--misjudge-steps P,K]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.library import builtin_names, load_scenario
from exporter.capacity.arch import parse_config
from exporter.capacity.gpus import Gpu, lookup_gpu
from exporter.capacity.plan import Plan, PlanRequest, plan
from exporter.capacity.releases import release
from exporter.capacity.steptime import StepTimes, step_times
from exporter.log import configure
from exporter.plan.traffic import (
    DEFAULT_MAX_QUEUE_WAIT,
    Outcome,
    Traffic,
    engine_at,
    load_traffic,
    search,
    traffic_of,
)
from exporter.plan.traffic import (
    replay as replay_traffic,
)
from exporter.replay import Replay, replay
from exporter.simulator.engine import EngineConfig
from exporter.simulator.scenario import Arrival, Scenario, parse_duration
from exporter.simulator.simulation import size
from exporter.sources.model_dir import load_model

TRACE = (
    Path(__file__).resolve().parent.parent / "tests/fixtures/traces/mooncake-conversation-10m.jsonl"
)


def window_traffic(traffic: Traffic, start: float, length: float, laps: int = 2) -> Traffic:
    """The arrivals of ``[start, start + length)``, from 0, repeated ``laps`` times."""
    piece = [a for a in traffic.base if start <= a.time < start + length]
    out: list[Arrival] = []
    for lap in range(laps):
        out += [dataclasses.replace(a, time=a.time - start + lap * length) for a in piece]
    return Traffic.of(f"{traffic.name}@{start:.0f}", out, traffic.seed)


def true_multiple(
    traffic: Traffic, config: EngineConfig, precision: float, bound: float
) -> tuple[float | None, str]:
    def run(m: float) -> Outcome:
        return replay_traffic(traffic, config, m, max_queue_wait=bound)

    limit = search(run, precision=precision)
    if limit.held is None:
        return None, limit.binding
    if limit.failed is None:
        return None, "none"
    return (limit.held * limit.failed) ** 0.5, limit.binding


def live_at(rep: Replay, start: float, end: float) -> tuple[float | None, str | None]:
    ticks = [t for t in rep.ticks if start <= t.t <= end and t.load_headroom_ratio is not None]
    if not ticks:
        return None, None
    values = [t.load_headroom_ratio for t in ticks if t.load_headroom_ratio is not None]
    resources = [t.load_headroom_resource for t in ticks]
    return statistics.median(values), max(set(resources), key=resources.count)


def _below(ratio: float | None) -> bool:
    return ratio is not None and ratio < 1


def below_one_since(rep: Replay, hold: float) -> float | None:
    """When the ratio first went below 1 and stayed there ``hold`` seconds."""
    since = None
    for t in rep.ticks:
        if t.load_headroom_ratio is not None and t.load_headroom_ratio < 1:
            since = t.t if since is None else since
            if t.t - since >= hold:
                return since
        else:
            since = None
    return None


def misjudge_steps(prefill: float, kv: float) -> None:
    """Make the sidecar in this process take a prompt token ``prefill`` times and a token
    of context ``kv`` times as long as the simulated GPU does: how the live ratio fares
    when the datasheet step times (``exporter.capacity.steptime``) are wrong for a GPU."""
    import exporter.snapshot

    def misjudged(sized: Plan, gpu: Gpu | None = None) -> StepTimes:
        st = step_times(sized, gpu)
        return dataclasses.replace(
            st,
            per_prefill_token_s=st.per_prefill_token_s * prefill,
            per_kv_token_s=st.per_kv_token_s * kv,
        )

    setattr(exporter.snapshot, "step_times", misjudged)  # noqa: B010 - the patch is the point


Truths = Mapping[tuple[str, int, float], tuple[float | None, str]]


def truths_from(path: Path) -> Truths:
    """The true multiples of an earlier ``--output json`` run, by scenario, seed and window
    start: they depend on the traffic and the deployment only, not on the sidecar."""
    runs = json.loads(path.read_text())["runs"]
    return {
        (r["name"], r["seed"], w["start_seconds"]): (w["true"], w["true_binding"])
        for r in runs
        for w in r["windows"]
    }


def evaluate_scenario(
    scenario: Scenario,
    window: float,
    precision: float,
    bound: float,
    hold: float,
    truths: Truths | None = None,
) -> dict[str, Any]:
    started = time.perf_counter()
    rep = replay(scenario)
    traffic = traffic_of(scenario)
    config = engine_at(size(scenario).plan, scenario)
    windows = []
    start = 0.0
    while start + window <= scenario.duration + 1e-6:
        live, live_resource = live_at(rep, start + window - 60.0, start + window)
        known = truths.get((scenario.name, scenario.seed, start)) if truths else None
        truth, binding = known or true_multiple(
            window_traffic(traffic, start, window), config, precision, bound
        )
        windows.append(
            {
                "start_seconds": start,
                "live": None if live is None else round(live, 4),
                "live_resource": live_resource,
                "true": None if truth is None else round(truth, 4),
                "true_binding": binding,
            }
        )
        start += window
    below = below_one_since(rep, hold)
    first = rep.first_preemption_at
    return {
        "name": scenario.name,
        "seed": scenario.seed,
        "real_traffic": "real-traffic" in scenario.tags,
        "first_preemption_seconds": first,
        "below_one_since_seconds": below,
        "lead_seconds": None if first is None or below is None else round(first - below, 1),
        "below_one_minutes": round(
            sum(2.0 for t in rep.ticks if _below(t.load_headroom_ratio)) / 60, 2
        ),
        "windows": windows,
        "wall_seconds": round(time.perf_counter() - started, 1),
        "_ticks": [(t.t, t.load_headroom_ratio) for t in rep.ticks],
    }


def summarise(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    pairs = [
        (w["live"], w["true"], w["true_binding"], bool(r.get("real_traffic")))
        for r in runs
        for w in r["windows"]
        if w["live"] is not None and w["true"] is not None
    ]
    above = [(lv, tr, b, real) for lv, tr, b, real in pairs if tr > 1.2]
    errors = sorted(abs(lv - tr) / tr for lv, tr, _, _ in above)
    live_above = [(lv, tr) for lv, tr, _, _ in pairs if lv > 1.2]
    live_errors = sorted(abs(lv - tr) / tr for lv, tr in live_above)
    by_binding: dict[str, list[float]] = {}
    # Real-traffic and synthetic scenarios apart: their errors have opposite signs.
    by_traffic: dict[str, list[float]] = {}
    for lv, tr, b, real in above:
        by_binding.setdefault(b, []).append(abs(lv - tr) / tr)
        by_traffic.setdefault("real_traffic" if real else "synthetic", []).append((lv - tr) / tr)
    overload = [r for r in runs if r["first_preemption_seconds"] is not None]
    warned = [r for r in overload if r["lead_seconds"] is not None and r["lead_seconds"] > 0]
    safe = [r for r in runs if r["first_preemption_seconds"] is None]

    def q(values: Sequence[float], p: float) -> float | None:
        if not values:
            return None
        return round(sorted(values)[min(len(values) - 1, int(p * len(values)))], 3)

    return {
        "windows_compared": len(pairs),
        "windows_true_above_1_2": len(above),
        "relative_error": {"median": q(errors, 0.5), "p75": q(errors, 0.75), "p90": q(errors, 0.9)},
        # The "while it is above 1.2" read as the live ratio: what an autoscaler sees.
        "windows_live_above_1_2": len(live_above),
        "relative_error_live_above_1_2": {
            "median": q(live_errors, 0.5),
            "p75": q(live_errors, 0.75),
            "p90": q(live_errors, 0.9),
        },
        "signed_error_median": q(sorted((lv - tr) / tr for lv, tr, _, _ in above), 0.5),
        "relative_error_by_true_binding": {
            b: {"windows": len(v), "median": q(sorted(v), 0.5)} for b, v in by_binding.items()
        },
        "relative_error_by_traffic": {
            kind: {
                "windows": len(v),
                "median": q(sorted(abs(e) for e in v), 0.5),
                "signed_median": q(sorted(v), 0.5),
                "share_below_truth": round(sum(e < 0 for e in v) / len(v), 3),
            }
            for kind, v in sorted(by_traffic.items())
        },
        "overload_runs": len(overload),
        "below_one_before_first_preemption": len(warned),
        "share_warned": round(len(warned) / len(overload), 3) if overload else None,
        "median_lead_seconds": statistics.median([r["lead_seconds"] for r in warned])
        if warned
        else None,
        "safe_runs": len(safe),
        "safe_minutes_below_one": round(sum(r["below_one_minutes"] for r in safe), 2),
    }


def brute_force(precision: float, bound: float, step: float = 0.02) -> dict[str, Any]:
    """The search against a scan of multiples on a real log (first 3 minutes)."""
    traffic, _ = load_traffic(str(TRACE), columns={"hashes": "hash_ids"}, time_unit="ms")
    piece = Traffic.of("mooncake-3m", [a for a in traffic.base if a.time < 180.0])
    source = load_model("meta-llama/Llama-3.1-8B-Instruct")
    arch = parse_config(source.config, source.config_path, name=source.name)
    sized = plan(
        PlanRequest(
            arch=arch, model_name=source.name, gpu=lookup_gpu("H100-80GB"),
            release=release("0.32.0"), max_model_len=32768,
            weights_bytes=source.weights_bytes, weights_source="catalogue",
        )
    )  # fmt: skip
    config = engine_at(sized)

    def run(m: float) -> Outcome:
        return replay_traffic(piece, config, m, max_queue_wait=bound)

    started = time.perf_counter()
    limit = search(run, precision=precision)
    search_seconds = time.perf_counter() - started
    assert limit.held is not None
    grid = []
    m = limit.held * 0.5
    first_fail = None
    started = time.perf_counter()
    while m <= limit.held * 1.5:
        held = run(m).held
        grid.append((round(m, 4), held))
        if not held and first_fail is None:
            first_fail = m
        m *= 1 + step
    scan_seconds = time.perf_counter() - started
    brute = max((g for g, h in grid if first_fail is None or g < first_fail), default=None)
    return {
        "trace": TRACE.name + " (first 3 minutes)",
        "deployment": "Llama-3.1-8B-Instruct, H100-80GB, max_model_len 32768",
        "search_held": round(limit.held, 4),
        "search_failed": None if limit.failed is None else round(limit.failed, 4),
        "search_probes": len(limit.probes),
        "search_seconds": round(search_seconds, 1),
        "brute_force_held": brute,
        "brute_force_probes": len(grid),
        "brute_force_seconds": round(scan_seconds, 1),
        "relative_difference": None if brute is None else round(abs(limit.held - brute) / brute, 4),
        "non_monotone_grid_points": sum(
            1 for g, h in grid if first_fail is not None and g > first_fail and h
        ),
    }


def plot(runs: Sequence[dict[str, Any]], folder: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 5))
    colors = {"kv_cache": "tab:red", "max_num_seqs": "tab:blue", "compute": "tab:green"}
    for r in runs:
        for w in r["windows"]:
            if w["live"] is None or w["true"] is None:
                continue
            ax.scatter(w["true"], w["live"], s=14, color=colors.get(w["true_binding"], "gray"))
    lim = (0.1, 20)
    ax.plot(lim, lim, color="black", lw=0.8)
    ax.fill_between(lim, [v * 0.75 for v in lim], [v * 1.25 for v in lim], color="gray", alpha=0.15)
    ax.axvline(1.2, color="gray", ls=":", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(*lim)
    ax.set_ylim(*lim)
    ax.set_xlabel("true multiple (replay search)")
    ax.set_ylabel("live load_headroom_ratio (median, window's last minute)")
    for name, color in colors.items():
        ax.scatter([], [], color=color, label=f"truth binds on {name}")
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title("live ratio vs true multiple, per window (band: ±25 %)", fontsize=10)
    for r in runs:
        ticks = r["_ticks"]
        ts = [t / 60 for t, v in ticks if v is not None]
        vs = [min(v, 20) for _, v in ticks if v is not None]
        (line,) = bx.plot(ts, vs, lw=0.8, label=f"{r['name']}")
        if r["first_preemption_seconds"] is not None:
            bx.axvline(r["first_preemption_seconds"] / 60, color=line.get_color(), ls="--", lw=0.7)
    bx.axhline(1.0, color="black", lw=0.8)
    bx.set_yscale("log")
    bx.set_xlabel("minutes (dashed: first preemption)")
    bx.set_ylabel("live load_headroom_ratio")
    bx.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path = folder / "load-headroom-accuracy.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _cell(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", action="append", default=[], help="a scenario YAML file")
    parser.add_argument("--no-library", action="store_true")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--window", default="5m", help="traffic window per truth (duration)")
    parser.add_argument("--precision", type=float, default=0.05)
    parser.add_argument("--max-queue-wait", type=float, default=DEFAULT_MAX_QUEUE_WAIT)
    parser.add_argument("--for", dest="hold", type=float, default=15.0,
                        help="seconds below 1 that count as a warning")  # fmt: skip
    parser.add_argument("--brute-force", action="store_true")
    parser.add_argument("--plot", type=Path, help="write load-headroom-accuracy.png here")
    parser.add_argument("--output", choices=("table", "json"), default="table")
    reuse = "reuse the true multiples of an earlier --output json run"
    parser.add_argument("--truths-from", type=Path, help=reuse)
    misjudge = "the sidecar's prompt-token and context-token times × these"
    parser.add_argument("--misjudge-steps", metavar="PREFILL,KV", help=misjudge)
    args = parser.parse_args(argv)
    configure("error", "json", sys.stderr)
    truths = truths_from(args.truths_from) if args.truths_from else None
    if args.misjudge_steps:
        prefill, kv = (float(x) for x in args.misjudge_steps.split(","))
        misjudge_steps(prefill, kv)
    window = parse_duration(args.window, "--window", "")
    library = [] if args.no_library else [n for n in builtin_names() if n != "demo"]
    scenarios = [load_scenario(n) for n in library] + [load_scenario(f) for f in args.scenario]
    scenarios = [
        dataclasses.replace(s, seed=s.seed + 100 * k) for s in scenarios for k in range(args.seeds)
    ]
    runs = []
    for s in scenarios:
        runs.append(
            evaluate_scenario(s, window, args.precision, args.max_queue_wait, args.hold, truths)
        )
        print(f"{s.name} seed {s.seed}: {runs[-1]['wall_seconds']} s", file=sys.stderr)
    result: dict[str, Any] = {"summary": summarise(runs)}
    if args.brute_force:
        result["brute_force"] = brute_force(0.02, args.max_queue_wait)
    if args.plot:
        print(f"wrote {plot(runs, args.plot)}", file=sys.stderr)
    result["runs"] = [{k: v for k, v in r.items() if not k.startswith("_")} for r in runs]
    if args.output == "json":
        print(json.dumps(result, indent=2))
        return 0
    summary = result["summary"]
    print(json.dumps(summary, indent=2))
    if "brute_force" in result:
        print(json.dumps(result["brute_force"], indent=2))
    for r in result["runs"]:
        cells = " ".join(f"{_cell(w['live'])}/{_cell(w['true'])}" for w in r["windows"])
        print(f"  {r['name']:<20} {r['seed']:>4} lead {r['lead_seconds']} · live/true {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
