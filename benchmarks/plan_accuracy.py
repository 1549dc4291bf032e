"""How well ``plan`` predicts vLLM's KV memory *without* the printed figure.

For every real start-up in tests/fixtures/sizing/vllm_startup_points.csv, predict
"Available KV cache memory" from the GPU, the flags, the release and the model's config
(weights estimated from the config's parameter count; nothing vLLM printed is used) and
compare with what vLLM printed (the tightest worker's: with PP the printed figure of the one
PP row in the fixture is the tightest stage's, which its tokens confirm).

Four predictors run side by side, so the ratios are measured in the same run:

* ``shipped``  — the overhead model with the coefficients the package ships;
* ``held-out`` — the same model refitted without the predicted row's model (leave one
  model out), from the profiling figures the *other* models' logs print, starting from
  ``PRIOR`` (nothing learnt from any fixture row);
* ``lofo``     — refitted without the row's whole architecture family (config model_type,
  MoE and VL variants folded in: llama, qwen2, qwen3, gpt_oss, ...): how the model does
  on a family it has never seen, the honest out-of-sample error, also reported by family,
  GPU and release (median, p90 and max of each group);
* ``naive``    — the budget many calculators use: ceiling − weights, no overheads.

It also reports exactness: of the rows whose printed worker is the tightest one, the share
whose blocks, tokens and concurrency ``plan`` reproduces within 0.01 % given the printed
figure. The CPU-backend rows (captured here, KV memory = ``VLLM_CPU_KVCACHE_SPACE``, known
to the byte) enter only that check: their memory is set, not measured, so they would say
nothing about the predictors.

    python benchmarks/plan_accuracy.py [--output json]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.sizing_points import StartupPoint, load_points
from exporter.capacity.gpus import GIB
from exporter.capacity.memory import OverheadModel
from exporter.capacity.plan import Plan, PlanRequest, plan


def _note(point: StartupPoint, pattern: str) -> float | None:
    m = re.search(pattern + r"=([\d.]+) GiB", point_notes[point.row])
    return float(m.group(1)) * GIB if m else None


point_notes: dict[int, str] = {}


def load_notes() -> None:
    """Read each row's notes, where its log's profile figures are recorded."""
    import csv

    from benchmarks.sizing_points import POINTS

    with POINTS.open(newline="", encoding="utf-8") as f:
        for i, row in enumerate(csv.DictReader(f), start=2):
            point_notes[i] = row["notes"]


def _entries(p: Plan) -> float:
    """Dummy requests × vocabulary: what the sampler's profile peak scales with."""
    vocab = p.request.arch.vocab_size or 0
    return min(p.max_num_seqs, p.max_num_batched_tokens) * vocab


def fit(points: list[StartupPoint], fallback: OverheadModel) -> OverheadModel:
    """Refit what only a measurement can give; keep what vLLM's code counts.

    The profile run's forward pass, vision encoder and sampler are counted from vLLM's code
    (``memory.forward_bytes``, ``memory.sampler_bytes``) and are never refit. Two residuals
    are: non-torch memory per release era of ``OverheadModel.non_torch_*_by_era``, from the
    rows that print it (one GPU from TP1 rows, TP > 1 from TP rows, and TP rows that print
    weights and KV memory but no breakdown), and the 0.20+ cold torch.compile transient,
    one figure per worker, from the one-GPU 0.20+ rows that print their weights. The CUDA-graph
    estimate is not refit here: it is the median of the printed estimates (memory.py).
    Starts before 0.6.4 refit
    nothing: their V0 worker charged the memory free after the profile run, with no
    peak/non-torch split.
    """
    points = [pt for pt in points if pt.request.release.version >= _PROFILED_SINCE]

    def non_torch(rows: list[StartupPoint]) -> int | None:
        values = [v for pt in rows if (v := _printed_non_torch(pt)) is not None]
        return int(statistics.fmean(values)) if values else None

    eras = [since for since, _ in fallback.non_torch_single_by_era]

    def era_of(pt: StartupPoint) -> tuple[int, int, int]:
        return next(since for since in eras if pt.request.release.version >= since)

    single_table: list[tuple[tuple[int, int, int], int]] = []
    tp_table: list[tuple[tuple[int, int, int], int]] = []
    for (since, prior_single), (_, prior_tp) in zip(
        fallback.non_torch_single_by_era, fallback.non_torch_tp_by_era, strict=True
    ):
        rows = [pt for pt in points if era_of(pt) == since]
        single = non_torch([pt for pt in rows if pt.tp == 1 and pt.pp == 1])
        tp = non_torch([pt for pt in rows if pt.tp > 1])
        single_value = single if single is not None else prior_single
        # Without TP rows, TP keeps the fallback's extra over one GPU.
        tp_value = tp if tp is not None else single_value + (prior_tp - prior_single)
        single_table.append((since, single_value))
        tp_table.append((since, tp_value))
    base = replace(
        fallback,
        non_torch_single_by_era=tuple(single_table),
        non_torch_tp_by_era=tuple(tp_table),
    )

    def mean(values: list[float], default: float) -> float:
        return statistics.fmean(values) if values else default

    # The cold torch.compile peak of the profile run (memory.py) is no count a config gives:
    # each one-GPU 0.20+ start that prints its weights measures it as the transient that makes
    # the modelled KV memory equal the printed one (the forward pass plus it against the
    # sampler's peak, beside the graph estimate the release subtracts). One figure per
    # worker, the mean of those rows; a start whose sampler peak hides any transient
    # measures nothing, and neither does a start with a vision tower, as for the TP rows
    # below: its encoder profile (unvalidated, see memory.py) would be counted as the
    # transient (Qwen3.5-0.8B's two 0.28 starts, whose 2.46 GiB of consumed memory beyond
    # the weights no term explains, would have moved stop 49's per-layer × width figure from
    # 1.55 to 6.93 KiB).
    transients: list[float] = []
    for pt in points:
        if pt.tp > 1 or pt.pp > 1 or pt.printed_weights_bytes is None:
            continue
        if pt.request.arch.vision_profile_elems:
            continue
        request = replace(pt.request, weights_bytes=pt.printed_weights_bytes)
        if request.enforce_eager or not request.release.charges_compile_transient:
            continue
        measured_t = _transient(request, base, pt.printed_kv_bytes)
        if measured_t is not None:
            transients.append(measured_t)
    peaks = replace(base, compile_bytes=mean(transients, fallback.compile_bytes))
    # A TP row that prints its weights and KV memory but no breakdown measures its non-torch
    # memory as what those, the refitted activation peak and the graph estimate leave of
    # the ceiling (the TP counterpart of the one-GPU rows' peak above); it joins the
    # printed TP figures of its era. Not a start with a vision tower: its encoder profile
    # (unvalidated, see memory.py) would be counted as non-torch memory.
    measured: dict[tuple[int, int, int], list[float]] = {}
    for pt in points:
        if pt.tp == 1 or pt.pp > 1:
            continue
        printed = _printed_non_torch(pt)
        if printed is not None:
            measured.setdefault(era_of(pt), []).append(printed)
            continue
        if pt.printed_weights_bytes is None or pt.request.arch.vision_profile_elems:
            continue
        stage = plan(replace(pt.request, overhead=peaks)).stages[0]
        residual = (
            stage.requested
            - pt.printed_weights_bytes
            - pt.printed_kv_bytes
            - stage.activation
            - stage.cuda_graph
            - stage.sampler_state
        )
        measured.setdefault(era_of(pt), []).append(residual)
    tp_measured = tuple(
        (since, int(statistics.fmean(measured[since])) if since in measured else value)
        for since, value in peaks.non_torch_tp_by_era
    )
    return replace(peaks, non_torch_tp_by_era=tp_measured)


def _printed_non_torch(pt: StartupPoint) -> float | None:
    """The row's printed non-torch memory less what vLLM's code counts in it (Model Runner
    V2's sampling state, memory.sampler_state_bytes): the residual an era's figure is the
    mean of."""
    printed = _note(pt, r"non-torch(?: increase)?")
    if printed is None:
        return None
    return printed - plan(pt.request).stages[0].sampler_state


def _transient(request: PlanRequest, model: OverheadModel, printed_kv: int) -> float | None:
    """The compile transient (bytes) at which the modelled KV memory is the printed one, by
    bisection (the KV memory falls as the transient grows, once it shows past the sampler);
    None where no transient in [0, 8 GiB] gives it."""

    def available(t: float) -> int:
        over = replace(model, compile_bytes=t)
        return plan(replace(request, overhead=over)).stages[0].available

    lo, hi = 0.0, 8.0 * GIB
    if available(lo) < printed_kv or available(hi) > printed_kv:
        return None
    while hi - lo > 1 << 20:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if available(mid) > printed_kv else (lo, mid)
    return (lo + hi) / 2 if lo > 0 else None


# V0's memory_profiling (0.6.4) is the first to split the peak from non-torch memory.
_PROFILED_SINCE = (0, 6, 4)

# What the model assumes before any fixture row is seen, so that a refit without a row's model,
# family or era cannot inherit what the shipped residuals learnt from it, and what a residual
# no row measures keeps: as non-torch growth on one GPU (and per PP stage) only the
# cuBLAS/cuBLASLt workspace (32 MiB) the first matmuls of the profile run allocate outside
# PyTorch's pool (the allocation 0.33 moves into the start-up baseline); with TP > 1 on V0
# releases (before 0.8) the comm buffers vLLM PR 10511 measured under 0.6.x on top (a V0
# figure: V1's worker is not assumed to have them); no compile transient. The counted terms
# and the CUDA-graph estimate (the printed estimates' median, no start-up row's) are the
# shipped ones.
_CUBLAS = OverheadModel().cublas_baseline
_PR_10511_TP = int(1.79 * GIB)
# V0 up to 0.6.4 charged the process's CUDA context too (memory.py): about 300 MiB with
# CUDA's lazy module loading (PyTorch issue 107667, NVIDIA's ptrblck).
_CUDA_CONTEXT = 300 << 20
PRIOR = replace(
    OverheadModel(),
    compile_bytes=0.0,
    non_torch_single_by_era=(
        ((0, 27, 0), _CUBLAS),
        ((0, 8, 0), _CUBLAS),
        ((0, 6, 5), _CUBLAS),
        ((0, 0, 0), _CUBLAS + _CUDA_CONTEXT),
    ),
    non_torch_tp_by_era=(
        ((0, 27, 0), _CUBLAS),
        ((0, 8, 0), _CUBLAS),
        ((0, 6, 5), _CUBLAS + _PR_10511_TP),
        ((0, 0, 0), _CUBLAS + _CUDA_CONTEXT + _PR_10511_TP),
    ),
)


# Release eras, by what the memory model does differently (newest first): 0.27 charges
# total_consumed (vllm/utils/mem_utils.py::memory_profiling, first in the 0.27.0 wheel), and
# from 0.25 dense models profile on Model Runner V2; 0.20 subtracts the CUDA-graph estimate;
# V1 from 0.8; V0 before it (and 0.8-0.10 on Volta/Turing).
ERAS: tuple[tuple[str, tuple[int, int, int]], ...] = (
    ("0.27+", (0, 27, 0)),
    ("0.20-0.26", (0, 20, 0)),
    ("V1 0.8-0.19", (0, 8, 0)),
)
NEWEST_ERA = ERAS[0][0]


def release_era(point: StartupPoint) -> str:
    """The release era a start belongs to (``ERAS``; V0 starts are their own era)."""
    release = point.request.release
    if release.v0_engine_on(point.request.gpu.family):
        return "V0"
    return next(name for name, since in ERAS if release.version >= since)


def predicted_first_stage(point: StartupPoint, model: OverheadModel | None) -> int:
    if model is None:
        p = plan(point.request)
        return min(stage.requested - stage.weights for stage in p.stages)
    return min(plan(replace(point.request, overhead=model)).stage_available)


def reproduces(point: StartupPoint) -> bool:
    """Given the printed figure, ``plan`` gives vLLM's blocks, and its tokens and concurrency
    where the row has them, each within 0.01 % (concurrency also to its printed 2 decimals)."""
    cap = plan(replace(point.request, available_kv_bytes=point.printed_kv_bytes)).cap

    def close(value: float, printed: float, decimals_slack: float = 0.0) -> bool:
        return abs(value - printed) <= max(0.0001 * abs(printed), decimals_slack)

    return (
        point.blocks is not None
        and close(cap.num_blocks, point.blocks)
        and (point.tokens is None or close(cap.capacity_tokens, point.tokens))
        and (point.concurrency is None or close(cap.max_concurrency, point.concurrency, 0.005))
    )


def summarise(errors: list[float]) -> dict[str, float]:
    absolute = sorted(abs(e) for e in errors)
    p90 = absolute[min(len(absolute) - 1, round(0.9 * (len(absolute) - 1)))]
    return {
        "median_abs_error_pct": round(statistics.median(absolute), 3),
        "p90_abs_error_pct": round(p90, 3),
        "max_abs_error_pct": round(absolute[-1], 3),
    }


def lofo_breakdown(rows: list[dict[str, Any]], key: str) -> dict[str, dict[str, float]]:
    """The leave-one-family-out error of the rows grouped by ``key`` (family, gpu, release):
    each group's row count with its median, p90 and max absolute error."""
    return breakdown(rows, key, "lofo_err_pct")


def breakdown(rows: list[dict[str, Any]], key: str, column: str) -> dict[str, dict[str, float]]:
    """``column``'s error of the rows grouped by ``key``: each group's row count with its
    median, p90 and max absolute error."""
    groups: dict[str, list[float]] = {}
    for row in rows:
        groups.setdefault(str(row[key]), []).append(row[column])
    return {
        name: {"rows": len(errs), **summarise(errs)}
        for name, errs in sorted(groups.items(), key=lambda kv: _release_order(kv[0], key))
    }


def _release_order(name: str, key: str) -> tuple[int, ...] | tuple[str]:
    return tuple(int(x) for x in name.split(".")) if key == "release" else (name,)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", choices=("table", "json"), default="table")
    args = parser.parse_args(argv)

    load_notes()
    every = load_points()
    points = [pt for pt in every if not pt.kv_memory_set]  # GPU starts: memory was profiled
    shipped = OverheadModel()
    refit_all = fit(points, PRIOR)
    profiled = [
        pt
        for pt in points
        if _note(pt, "torch peak increase") is not None
        or (pt.printed_weights_bytes is not None and pt.tp == pt.pp == 1)
    ]
    errors: dict[str, list[float]] = {
        "shipped": [],
        "held-out": [],
        "lofo": [],
        "loeo": [],
        "naive": [],
    }
    rows: list[dict[str, Any]] = []
    for pt in points:
        others = [q for q in points if q.model != pt.model]
        unseen = [q for q in points if q.family != pt.family]
        other_eras = [q for q in points if release_era(q) != release_era(pt)]
        models = {
            "shipped": shipped,
            "held-out": fit(others, PRIOR),
            "lofo": fit(unseen, PRIOR),
            "loeo": fit(other_eras, PRIOR),
            "naive": None,
        }
        row: dict[str, Any] = {
            "row": pt.row,
            "label": pt.label,
            "printed_gib": pt.printed_kv_bytes / GIB,
            "family": pt.family,
            "gpu": pt.request.gpu.name,
            "release": pt.request.release.label,
            "era": release_era(pt),
        }
        for name, model in models.items():
            predicted = predicted_first_stage(pt, model)
            err = (predicted - pt.printed_kv_bytes) / pt.printed_kv_bytes * 100
            errors[name].append(err)
            row[f"{name}_gib"] = predicted / GIB
            row[f"{name}_err_pct"] = err
        rows.append(row)
    summary = {name: summarise(errs) for name, errs in errors.items()}
    newest = [r for r in rows if r["era"] == NEWEST_ERA]
    newest_era = {
        name: summarise([r[f"{name}_err_pct"] for r in newest]) for name in ("lofo", "loeo")
    }
    exact = [pt for pt in every if pt.exact and pt.blocks]
    reproduced = sum(1 for pt in exact if reproduces(pt))
    exactness = {"rows": len(exact), "within_0.01pct": reproduced}
    families = sorted({pt.family for pt in points})
    lofo_by = {key: lofo_breakdown(rows, key) for key in ("family", "gpu", "release")}
    loeo_by_era = breakdown(rows, "era", "loeo_err_pct")
    if args.output == "json":
        print(
            json.dumps(
                {
                    "summary": summary,
                    "exactness": exactness,
                    "families": families,
                    "lofo_by": lofo_by,
                    "loeo_by_era": loeo_by_era,
                    "newest_era": {"era": NEWEST_ERA, "rows": len(newest), **newest_era},
                    "rows": rows,
                },
                indent=2,
            )
        )
        return 0
    print(f"plan accuracy: {len(points)} real vLLM starts, families {', '.join(families)}")
    print(f"(+ {len(every) - len(points)} CPU-backend starts, set KV memory: exactness only)")
    print("KV memory predicted from GPU, flags, release and config only, vs vLLM's figure\n")
    head = f"{'row':>4} {'deployment':<64} {'printed':>8}"
    print(f"{head} {'shipped':>9} {'held-out':>9} {'lofo':>9} {'loeo':>9} {'naive':>9}")
    for r in rows:
        print(
            f"{r['row']:>4} {r['label']:<64} {r['printed_gib']:>7.2f}G "
            f"{r['shipped_err_pct']:>+8.2f}% {r['held-out_err_pct']:>+8.2f}% "
            f"{r['lofo_err_pct']:>+8.2f}% {r['loeo_err_pct']:>+8.2f}% {r['naive_err_pct']:>+8.2f}%"
        )
    print()
    for name, s in summary.items():
        print(
            f"{name:<9} median |error| {s['median_abs_error_pct']:6.2f} %   "
            f"p90 {s['p90_abs_error_pct']:6.2f} %   max {s['max_abs_error_pct']:6.2f} %"
        )
    for name in ("lofo", "loeo"):
        s_ = newest_era[name]
        print(
            f"{name:<5} newest era alone ({NEWEST_ERA}, {len(newest)} rows): median |error| "
            f"{s_['median_abs_error_pct']:6.2f} %   p90 {s_['p90_abs_error_pct']:6.2f} %   "
            f"max {s_['max_abs_error_pct']:6.2f} %"
        )
    print("\nleave-one-release-era-out by era:")
    for group, g in loeo_by_era.items():
        print(
            f"  {group:<24} {g['rows']:>3} rows   median {g['median_abs_error_pct']:6.2f} %   "
            f"p90 {g['p90_abs_error_pct']:6.2f} %   max {g['max_abs_error_pct']:6.2f} %"
        )
    for key, groups in lofo_by.items():
        print(f"\nleave-one-family-out by {key}:")
        for group, g in groups.items():
            print(
                f"  {group:<24} {g['rows']:>3} rows   median {g['median_abs_error_pct']:6.2f} %   "
                f"p90 {g['p90_abs_error_pct']:6.2f} %   max {g['max_abs_error_pct']:6.2f} %"
            )
    print(
        f"\nexactness given the printed figure: {reproduced}/{len(exact)} rows' blocks, tokens "
        "and concurrency within 0.01 %"
    )
    naive, held = summary["naive"], summary["held-out"]
    median_ratio = naive["median_abs_error_pct"] / max(held["median_abs_error_pct"], 1e-9)
    p90_ratio = naive["p90_abs_error_pct"] / max(held["p90_abs_error_pct"], 1e-9)
    print(f"\nheld-out vs naive: median error {median_ratio:.0f}× smaller, p90 {p90_ratio:.0f}×")
    refit, ship = refit_all, shipped
    print(f"rows whose printed profile or weights refit a coefficient: {len(profiled)}")
    print("coefficients refit on all rows (shipped in parentheses; they should agree):")
    print(
        f"  sampler {refit.sampler_fixed_bytes:.2f} ({ship.sampler_fixed_bytes}) FlashInfer, "
        f"{refit.sampler_kernel_bytes:.2f} ({ship.sampler_kernel_bytes}) 0.17 kernel, "
        f"{refit.sampler_sort_bytes:.2f} ({ship.sampler_sort_bytes}) sorting, "
        f"+ {refit.sampler_dtype_bytes:.2f}/dtype byte; "
        f"compile transient {refit.compile_bytes / GIB:.2f} GiB ({ship.compile_bytes / GIB:.2f}) "
        "per worker; "
        "forward and encoder counted from the code"
    )
    for (since, single), (_, tp) in zip(
        refit.non_torch_single_by_era, refit.non_torch_tp_by_era, strict=True
    ):
        shipped_single = next(b for s, b in ship.non_torch_single_by_era if s == since)
        shipped_tp = next(b for s, b in ship.non_torch_tp_by_era if s == since)
        print(
            f"  non-torch from {'.'.join(map(str, since))}: {single / GIB:.2f} GiB "
            f"({shipped_single / GIB:.2f}) on one GPU, {tp / GIB:.2f} GiB ({shipped_tp / GIB:.2f}) "
            "per GPU with TP > 1"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
