"""The alert benchmark's fuzz tier: hours drawn from ``exporter/simulator/family.py``, each
placed by ``plan --traffic``'s search, replayed with the sidecar's own poll pipeline.

    python benchmarks/alert_quality.py --fuzz N --seed S [--jobs J] [--output json]

runs family seeds S … S+N−1. The tier is ``--fuzz 300 --seed 0`` (docs/risk-model.md); the
held-out seeds start at 100000 and are run once, after a change, never to tune it. A
placement depends only on the draw and the simulated engine, not on the risk model, so
it is kept in ``.cache/fuzz/`` (keyed by the family's version, the engine's configuration
and a hash of the engine's and the family's code) and reused by the next run. So is each
replayed hour, with every input the sidecar handed the risk model (keyed by the sidecar's
poll pipeline): a run is always scored by today's ``assess`` on those inputs, so a change
to the risk model alone re-scores the whole tier in seconds. ``--no-cache`` recomputes
both.

Scored per kind (``safe-near-edge``, ``safe-light``, ``ramp-overload``, ``abrupt-overload``),
each run judged by what happened (a run that preempted is an overload run whatever its
kind): recall, median lead, warned before the first preemption, false-alarm minutes per
safe hour and those near a miss, the bottleneck gauge's main reason, and the ticket
signal: on safe hours, minutes it is on per hour, and how many near-edge hours it caught.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import itertools
import json
import math
import pickle
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.alert_scoring import evaluate
from exporter import snapshot
from exporter.log import configure
from exporter.replay import Replay, Tick, replay
from exporter.risk.calibration import Calibration
from exporter.risk.model import (
    EDGE_FOR_SECONDS,
    EDGE_THRESHOLD,
    HORIZON,
    Z_HALF,
    Inputs,
    Risk,
    assess,
)
from exporter.simulator import family

ROOT = Path(__file__).resolve().parent.parent

CACHE = ROOT / ".cache" / "fuzz"
HELD_OUT_FROM = 100_000
# After the first preemption a run has been judged: what follows it is not simulated.
AFTER_PREEMPTION = 60.0
# Risk bands of the reliability table (issue 27): how often a preemption followed.
BANDS = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0001)
# A safe hour counts as "at the edge" when its KV usage spent this long at or above
# EDGE_USAGE: the ticket signal should have said so (a reporting split, read by nothing
# in the model).
EDGE_USAGE = 0.9
EDGE_MINUTES = 5.0


def _placement_key(d: family.Draw) -> str:
    """What a placement depends on: the family's version, the engine the draw sizes (its
    configuration as ``plan`` sized it), the engine's and the search's code, and the
    arrivals. Nothing of the risk model or the sidecar."""
    h = hashlib.sha256()
    h.update(repr(family.engine_for(d)).encode())
    for name in ("exporter/simulator/engine.py", "exporter/simulator/family.py"):
        h.update((ROOT / name).read_bytes())
    h.update(repr((family.PRECISION, family.MAX_REQUESTS, len(d.arrivals))).encode())
    h.update(repr(d.arrivals[:50]).encode())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class Recorded:
    """One replayed hour: what the simulator knew, and every ``Inputs`` the sidecar handed
    the risk model, so that a changed model is scored in seconds without replaying."""

    replay: Replay
    inputs: tuple[Inputs, ...]


@dataclass(frozen=True)
class FuzzRun:
    seed: int
    kind: str
    description: str
    held: float | None
    multiple: float | None
    replay: Replay | None  # None: dropped (no bracket within the simulator's budget)
    wall_seconds: float
    recorded: Recorded | None = None  # as replayed, with the model of the time


def _placement(seed: int, use_cache: bool) -> tuple[family.Draw, dict[str, Any]]:
    d = family.draw(seed)
    path = CACHE / f"v{family.FAMILY_VERSION}" / f"{seed}-{_placement_key(d)}.json"
    if use_cache and path.is_file():
        return d, json.loads(path.read_text())
    placed = family.place(d)
    record = {
        "seed": seed,
        "held": placed.limit.held,
        "failed": placed.limit.failed,
        "multiple": placed.multiple,
        "probes": len(placed.limit.probes),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return d, record


def _sidecar_key() -> str:
    """What a recorded run depends on besides its placement: the sidecar's poll pipeline up
    to the risk model's inputs (not the risk model: runs are re-scored with today's)."""
    h = hashlib.sha256()
    names = [
        "exporter/snapshot.py",
        "exporter/observe.py",
        "exporter/poller.py",
        "exporter/risk/bottleneck.py",
        "exporter/sources/vllm_page.py",
        "exporter/replay.py",
        "exporter/simulator/page.py",
        "exporter/simulator/simulation.py",
        "exporter/simulator/scenario.py",
    ]
    for name in names:
        h.update((ROOT / name).read_bytes())
    return h.hexdigest()[:12]


def record_run(scenario: Any, interval: float, after: float | None = AFTER_PREEMPTION) -> Recorded:
    """Replay ``scenario`` with the sidecar's poll pipeline and keep every input it handed
    the risk model (until ``after`` seconds past the first preemption; None: to the end)."""
    seen: list[Inputs] = []
    real = assess

    def spy(inputs: Inputs) -> Risk:
        seen.append(inputs)
        return real(inputs)

    setattr(snapshot, "assess", spy)  # noqa: B010 - the module's name for it, at run time
    try:
        rep = replay(scenario, interval, after_preemption=after)
    finally:
        setattr(snapshot, "assess", real)  # noqa: B010
    # The scenario's arrivals are the bulk of it and are re-drawn from the seed.
    rep = dataclasses.replace(rep, scenario=dataclasses.replace(rep.scenario, requests=()))
    return Recorded(rep, tuple(seen))


def rescored(rec: Recorded) -> Replay:
    """The recorded hour with today's risk model: each poll's risk, time to exhaustion and
    forecast usage recomputed from the inputs the sidecar gave the model at that poll, the
    engine's judged past (risk/calibration.py) fed along as the poll loop feeds it."""
    by_time = {i.points[-1].t: i for i in rec.inputs if i.points}
    judged = Calibration(HORIZON, Z_HALF)  # a simulated vLLM has one engine
    ticks = []
    for tick in rec.replay.ticks:
        inputs = by_time.get(tick.t)
        if inputs is None:
            ticks.append(tick)
            continue
        last = inputs.points[-1]
        inputs = dataclasses.replace(inputs, excursion=judged.worst(last.t))
        risk = assess(inputs)
        capacity = inputs.capacity_tokens
        judged.observe(
            last.t,
            last.usage * capacity,
            risk.level_tokens,
            risk.spread_tokens,
            (last.epoch, capacity),
        )
        ticks.append(
            dataclasses.replace(
                tick,
                preemption_risk=risk.preemption_risk,
                seconds_to_exhaustion=risk.seconds_to_exhaustion,
                overcommit_ratio=risk.overcommit_ratio,
                edge=risk.forecast_usage,
            )
        )
    return dataclasses.replace(rec.replay, ticks=ticks)


def _quiet_worker() -> None:
    """A worker process logs errors only (configured once where it starts, not per run, so
    a test that runs hours in-process keeps its own logging)."""
    configure("error", "json", sys.stderr)


def run_one(args: tuple[int, float, bool]) -> FuzzRun:
    seed, interval, use_cache = args
    started = time.perf_counter()
    d, record = _placement(seed, use_cache)
    rep = rec = None
    if record["multiple"] is not None:
        path = CACHE / "runs" / f"{seed}-{_placement_key(d)}-{_sidecar_key()}-{interval:g}.pkl.gz"
        if use_cache and path.is_file():
            with gzip.open(path, "rb") as f:
                rec = pickle.load(f)
        else:
            placed = family.Placed(d, _limit(record), record["multiple"])
            rec = record_run(placed.scenario(), interval)
            path.parent.mkdir(parents=True, exist_ok=True)
            with gzip.open(path, "wb", compresslevel=3) as f:
                pickle.dump(rec, f)
        rep = rescored(rec)
    return FuzzRun(
        seed, d.kind, d.describe(), record["held"], record["multiple"], rep,
        time.perf_counter() - started, rec,
    )  # fmt: skip


def _limit(record: dict[str, Any]) -> Any:
    from exporter.plan.traffic import Limit

    return Limit(record["held"], record["failed"], ())


def run_fuzz(seeds: Sequence[int], interval: float, jobs: int, use_cache: bool) -> list[FuzzRun]:
    work = [(s, interval, use_cache) for s in seeds]
    if jobs <= 1 or len(work) <= 1:
        return [run_one(w) for w in work]
    with ProcessPoolExecutor(max_workers=jobs, initializer=_quiet_worker) as pool:
        return list(pool.map(run_one, work))


# -- scoring ------------------------------------------------------------------------------


def edge_episodes(ticks: Sequence[Tick]) -> list[tuple[float, float]]:
    """When the ticket signal fires: ``edge`` above its threshold for its ``for``."""
    out: list[tuple[float, float]] = []
    pending: float | None = None
    firing: float | None = None
    for tick in ticks:
        if tick.edge > EDGE_THRESHOLD:
            pending = tick.t if pending is None else pending
            if firing is None and tick.t - pending >= EDGE_FOR_SECONDS:
                firing = tick.t
        else:
            if firing is not None:
                out.append((firing, tick.t))
            pending = firing = None
    if firing is not None and ticks:
        out.append((firing, ticks[-1].t))
    return out


def at_edge(ticks: Sequence[Tick]) -> bool:
    """Whether a run spent ``EDGE_MINUTES`` at or above ``EDGE_USAGE``."""
    seconds = sum(b.t - a.t for a, b in itertools.pairwise(ticks) if b.usage >= EDGE_USAGE)
    return seconds >= EDGE_MINUTES * 60


def reliability(runs: Sequence[FuzzRun]) -> list[dict[str, Any]]:
    """For each band of the risk, the polls in it and how many were followed by a
    preemption within ``HORIZON`` (polls after the first preemption left out: the
    question is whether one is coming)."""
    counts = [[0, 0] for _ in BANDS[:-1]]
    for run in runs:
        if run.replay is None:
            continue
        first = run.replay.first_preemption_at
        for tick in run.replay.ticks:
            if first is not None and tick.t >= first:
                break
            band = next(i for i in range(len(BANDS) - 1) if tick.preemption_risk < BANDS[i + 1])
            counts[band][0] += 1
            if first is not None and first - tick.t <= HORIZON:
                counts[band][1] += 1
    return [
        {
            "band": f"{BANDS[i]:.1f}–{min(1.0, BANDS[i + 1]):.1f}",
            "polls": n,
            "followed_by_preemption": k,
            "share": round(k / n, 3) if n else None,
        }
        for i, (n, k) in enumerate(counts)
    ]


def score(runs: Sequence[FuzzRun]) -> dict[str, Any]:
    kept = [r for r in runs if r.replay is not None]
    result = evaluate([r.replay for r in kept if r.replay is not None])
    by_kind: dict[str, dict[str, Any]] = {}
    for kind in family.KINDS:
        mine = [(r, s) for r, s in zip(kept, result["scenarios"], strict=True) if r.kind == kind]
        overload = [s for _r, s in mine if s["first_preemption_seconds"] is not None]
        safe = [(r, s) for r, s in mine if s["first_preemption_seconds"] is None]
        leads = [s["rules"]["kv_headroom"].get("lead_seconds") for s in overload]
        found = sorted(v for v in leads if v is not None)
        hours = sum(s["duration_seconds"] for _r, s in safe) / 3600
        fa = sum(s["rules"]["kv_headroom"]["false_alarm_minutes"] for _r, s in safe)
        near = sum(s["rules"]["kv_headroom"]["near_miss_minutes"] for _r, s in safe)
        edge_minutes = 0.0
        edge_hours = caught = 0
        for r, _s in safe:
            assert r.replay is not None
            eps = edge_episodes(r.replay.ticks)
            edge_minutes += sum(b - a for a, b in eps) / 60
            if at_edge(r.replay.ticks):
                edge_hours += 1
                caught += bool(eps)
        ticketed_first = 0
        for r, s in mine:
            first = s["first_preemption_seconds"]
            if first is not None and r.replay is not None:
                ticketed_first += any(a <= first for a, _b in edge_episodes(r.replay.ticks))
        named = [s["bottleneck"]["names_main_reason"] for _r, s in mine]
        judged = [v for v in named if v is not None]
        by_kind[kind] = {
            "runs": len(mine),
            "overload_runs": len(overload),
            "safe_runs": len(safe),
            "recall": round(len(found) / len(overload), 3) if overload else None,
            "median_lead_seconds": statistics.median(found) if found else None,
            "worst_lead_seconds": found[0] if found else None,
            "warned_before_first_preemption": (
                round(sum(v > 0 for v in found) / len(overload), 3) if overload else None
            ),
            "false_alarm_minutes_per_safe_hour": round(fa / hours, 2) if hours else None,
            "near_miss_minutes_per_safe_hour": round(near / hours, 2) if hours else None,
            "ticket_minutes_per_safe_hour": round(edge_minutes / hours, 2) if hours else None,
            "safe_hours_at_the_edge": edge_hours,
            "of_them_ticketed": caught,
            "bottleneck_main_reason": [sum(judged), len(judged)],
            # The ticket's own lead: overload runs it was raised in before the first
            # preemption (it is no page; a server that ran near full for ten minutes).
            "ticket_before_first_preemption": (
                round(ticketed_first / len(overload), 3) if overload else None
            ),
        }
    return {
        "kinds": by_kind,
        "dropped": [r.seed for r in runs if r.replay is None],
        "reliability": reliability(kept),
        "runs": [
            {
                "seed": r.seed,
                "kind": r.kind,
                "held": r.held,
                "multiple": r.multiple,
                "description": r.description,
                "wall_seconds": round(r.wall_seconds, 1),
                **({"result": s} if s is not None else {}),
            }
            for r, s in zip(kept, result["scenarios"], strict=True)
        ],
        "rules": result["rules"],
    }


def targets(result: dict[str, Any]) -> list[tuple[str, bool | None]]:
    """Issue 27's bar for the fuzz tier, per kind."""
    k = result["kinds"]
    checks: list[tuple[str, bool | None]] = []
    for kind, row in k.items():
        if row["recall"] is not None:
            checks.append((f"{kind}: recall ≥ 0.95", row["recall"] >= 0.95))
        fa = row["false_alarm_minutes_per_safe_hour"]
        if fa is not None:
            checks.append((f"{kind}: ≤ 1 false-alarm minute per safe hour", fa <= 1.0))
    ramp = k["ramp-overload"]["median_lead_seconds"]
    checks.append(("ramp-overload: median lead ≥ 90 s", None if ramp is None else ramp >= 90))
    warned = k["abrupt-overload"]["warned_before_first_preemption"]
    checks.append(
        ("abrupt-overload: warned before the first preemption in ≥ 90 %",
         None if warned is None else warned >= 0.9)
    )  # fmt: skip
    named = sum(row["bottleneck_main_reason"][0] for row in k.values())
    runs = sum(row["bottleneck_main_reason"][1] for row in k.values())
    checks.append(
        ("bottleneck gauge names the main reason in ≥ 95 % of runs that queue",
         None if not runs else named / runs >= 0.95)
    )  # fmt: skip
    return checks


def _fmt(v: float | None, fmt: str) -> str:
    return "n/a" if v is None else format(v, fmt)


def render(result: dict[str, Any], seeds: Sequence[int], wall: float, jobs: int) -> str:
    out = [
        f"fuzz tier: {len(seeds)} drawn hours (family v{family.FAMILY_VERSION}, seeds "
        f"{seeds[0]}–{seeds[-1]}), {len(result['dropped'])} dropped (no bracket within the "
        "simulator's budget)",
        "",
        f"{'kind':<16} {'runs o/s':>9} {'recall':>6} {'med lead':>8} {'worst':>6} "
        f"{'warned':>6} {'FA/h':>5} {'near/h':>6} {'ticket/h':>8} {'edge hrs':>8} "
        f"{'ticket<1st':>10} {'bottleneck':>10}",
    ]
    for kind, r in result["kinds"].items():
        named, judged = r["bottleneck_main_reason"]
        out.append(
            f"{kind:<16} {r['overload_runs']:>4}/{r['safe_runs']:<4} "
            f"{_fmt(r['recall'], '.2f'):>6} {_fmt(r['median_lead_seconds'], '+.0f'):>8} "
            f"{_fmt(r['worst_lead_seconds'], '+.0f'):>6} "
            f"{_fmt(r['warned_before_first_preemption'], '.2f'):>6} "
            f"{_fmt(r['false_alarm_minutes_per_safe_hour'], '.1f'):>5} "
            f"{_fmt(r['near_miss_minutes_per_safe_hour'], '.1f'):>6} "
            f"{_fmt(r['ticket_minutes_per_safe_hour'], '.1f'):>8} "
            f"{r['of_them_ticketed']:>3}/{r['safe_hours_at_the_edge']:<4} "
            f"{_fmt(r['ticket_before_first_preemption'], '.2f'):>10} {named:>5}/{judged:<4}"
        )
    out += ["", "reliability: risk band → polls, share followed by a preemption within "
            f"{HORIZON:.0f} s"]  # fmt: skip
    for row in result["reliability"]:
        out.append(f"  {row['band']:<9} {row['polls']:>8}  {_fmt(row['share'], '.3f')}")
    out.append("")
    for run in result["runs"]:
        s = run.get("result")
        if s is None:
            continue
        first = s["first_preemption_seconds"]
        ours = s["rules"]["kv_headroom"]
        if first is not None:
            v = ours.get("lead_seconds")
            verdict = f"preempted at {first:.0f} s, lead {'missed' if v is None else f'{v:+.0f} s'}"
        else:
            verdict = f"safe, {ours['false_alarm_minutes']:.1f} FA min"
        out.append(f"  {run['seed']:>6} ×{run['multiple']:.3g} {verdict:<36} {run['description']}")
    out.append("")
    for label, ok in targets(result):
        mark = "·" if ok is None else "✓" if ok else "✗"
        out.append(f"  {mark} {label}" + (" (n/a)" if ok is None else ""))
    out.append(f"\n{len(seeds)} hours took {wall:.0f} s with {jobs} processes")
    return "\n".join(out)


def main_fuzz(
    count: int, seed: int, interval: float, jobs: int, use_cache: bool, output: str
) -> int:
    started = time.monotonic()
    seeds = list(range(seed, seed + count))
    runs = run_fuzz(seeds, interval, jobs, use_cache)
    result = score(runs)
    wall = time.monotonic() - started
    if output == "json":
        print(json.dumps({**result, "wall_seconds": round(wall, 1)}, indent=2, default=_json))
    else:
        print(render(result, seeds, wall, jobs))
    return 0


def _json(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    raise TypeError(type(value).__name__)
