"""How well ``plan`` predicts vLLM's KV memory *without* the printed figure.

For every real start-up in tests/fixtures/sizing/vllm_startup_points.csv, predict
"Available KV cache memory" from the GPU, the flags, the release and the model's config
(weights estimated from the config's parameter count; nothing vLLM printed is used) and
compare with what vLLM printed (its first worker's figure, which is what it prints).

Four predictors run side by side, so the ratios are measured in the same run:

* ``shipped``  — the overhead model with the coefficients the package ships;
* ``held-out`` — the same model refitted without the predicted row's model (leave one
  model out), from the profiling figures the *other* models' logs print;
* ``lofo``     — refitted without the row's whole architecture family (config model_type,
  MoE and VL variants folded in: llama, qwen2, qwen3, gpt_oss, ...): how the model does
  on a family it has never seen, the honest out-of-sample error;
* ``naive``    — the budget many calculators use: ceiling − weights, no overheads.

It also reports exactness: of the rows whose printed worker is the tightest one, the share
whose blocks ``plan`` reproduces within 0.01 % given the printed figure.

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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.sizing_points import StartupPoint, load_points
from exporter.capacity.memory import GIB, OverheadModel
from exporter.capacity.plan import Plan, plan


def _note(point: StartupPoint, pattern: str) -> float | None:
    m = re.search(pattern + r"=([\d.]+) GiB", point_notes[point.row])
    return float(m.group(1)) * GIB if m else None


point_notes: dict[int, str] = {}


def _entries(p: Plan) -> float:
    """Dummy requests × vocabulary: what the sampler's profile peak scales with."""
    vocab = p.request.arch.vocab_size or 0
    return min(p.max_num_seqs, p.max_num_batched_tokens) * vocab


def fit(points: list[StartupPoint], fallback: OverheadModel) -> OverheadModel:
    """Refit the coefficients from the profiling figures these rows' logs print."""
    plans = [(pt, plan(pt.request)) for pt in points]
    single = [(pt, p) for pt, p in plans if pt.tp == 1 and pt.pp == 1]

    def per_entry(rows: list[tuple[StartupPoint, Plan]]) -> list[float]:
        out = []
        for pt, p in rows:
            peak = _note(pt, "torch peak increase")
            if peak is not None and _entries(p):
                out.append(peak / _entries(p))
        return out

    late = [(pt, p) for pt, p in single if p.request.release.version >= (0, 17, 0)]
    c16 = per_entry([(pt, p) for pt, p in late if p.request.arch.dtype != "float32"])
    c32 = per_entry([(pt, p) for pt, p in late if p.request.arch.dtype == "float32"])
    early = per_entry([(pt, p) for pt, p in single if p.request.release.version < (0, 17, 0)])
    if not c16:
        return fallback
    mean16 = statistics.fmean(c16)
    slope = (statistics.fmean(c32) - mean16) / 2 if c32 else 0.0
    early_factor = statistics.fmean(early) / mean16 if early else 1.0

    forward = []
    for pt, p in plans:
        if pt.pp > 1 and (peak := _note(pt, "torch peak increase")) is not None:
            width = p.request.arch.intermediate_size or 0
            dtype_bytes = 4 if p.request.arch.dtype == "float32" else 2
            forward.append(peak / (p.max_num_batched_tokens * width / pt.tp * dtype_bytes))

    def non_torch(rows: list[StartupPoint]) -> int | None:
        values = [v for pt in rows if (v := _note(pt, r"non-torch(?: increase)?")) is not None]
        return int(statistics.fmean(values)) if values else None

    tp_nt = non_torch([pt for pt in points if pt.tp > 1])
    pp_nt = non_torch([pt for pt in points if pt.pp > 1 and pt.tp == 1])
    new_nt = non_torch([pt for pt, _ in single if pt.version >= "0.18"])
    old_nt = non_torch([pt for pt, _ in single if pt.version < "0.18"])
    new_nt = new_nt if new_nt is not None else old_nt
    old_nt = old_nt if old_nt is not None else new_nt
    return replace(
        fallback,
        sampler_fixed_bytes=mean16 - 2 * slope,
        sampler_dtype_bytes=slope,
        sampler_early_factor=early_factor,
        # Without PP logs: the MLP's gate/up and activation outputs, 3 × width per token.
        forward_bytes=statistics.fmean(forward) if forward else 3.0,
        non_torch_tp=tp_nt if tp_nt is not None else fallback.non_torch_tp,
        non_torch_pp_stage=pp_nt if pp_nt is not None else (new_nt or 0),
        non_torch_single_by_era=(((0, 18, 0), new_nt or 0), ((0, 0, 0), old_nt or 0)),
    )


def predicted_first_stage(point: StartupPoint, model: OverheadModel | None) -> int:
    if model is None:
        p = plan(point.request)
        return p.stages[0].requested - p.stages[0].weights
    return plan(replace(point.request, overhead=model)).stages[0].available


def summarise(errors: list[float]) -> dict[str, float]:
    absolute = sorted(abs(e) for e in errors)
    p90 = absolute[min(len(absolute) - 1, round(0.9 * (len(absolute) - 1)))]
    return {
        "median_abs_error_pct": round(statistics.median(absolute), 3),
        "p90_abs_error_pct": round(p90, 3),
        "max_abs_error_pct": round(absolute[-1], 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", choices=("table", "json"), default="table")
    args = parser.parse_args(argv)

    import csv

    from benchmarks.sizing_points import POINTS

    with POINTS.open(newline="", encoding="utf-8") as f:
        for i, row in enumerate(csv.DictReader(f), start=2):
            point_notes[i] = row["notes"]
    points = load_points()
    shipped = OverheadModel()
    refit_all = fit(points, shipped)
    errors: dict[str, list[float]] = {"shipped": [], "held-out": [], "lofo": [], "naive": []}
    rows = []
    for pt in points:
        others = [q for q in points if q.model != pt.model]
        unseen = [q for q in points if q.family != pt.family]
        models = {
            "shipped": shipped,
            "held-out": fit(others, shipped),
            "lofo": fit(unseen, shipped),
            "naive": None,
        }
        row = {"row": pt.row, "label": pt.label, "printed_gib": pt.printed_kv_bytes / GIB}
        for name, model in models.items():
            predicted = predicted_first_stage(pt, model)
            err = (predicted - pt.printed_kv_bytes) / pt.printed_kv_bytes * 100
            errors[name].append(err)
            row[f"{name}_gib"] = predicted / GIB
            row[f"{name}_err_pct"] = err
        rows.append(row)
    summary = {name: summarise(errs) for name, errs in errors.items()}
    exact = [pt for pt in points if pt.exact and pt.blocks]
    reproduced = sum(
        1
        for pt in exact
        if pt.blocks
        and abs(
            plan(replace(pt.request, available_kv_bytes=pt.printed_kv_bytes)).cap.num_blocks
            - pt.blocks
        )
        <= 0.0001 * pt.blocks
    )
    exactness = {"rows": len(exact), "within_0.01pct": reproduced}
    families = sorted({pt.family for pt in points})
    if args.output == "json":
        print(
            json.dumps(
                {"summary": summary, "exactness": exactness, "families": families, "rows": rows},
                indent=2,
            )
        )
        return 0
    print(f"plan accuracy: {len(points)} real vLLM starts, families {', '.join(families)}")
    print("KV memory predicted from GPU, flags, release and config only, vs vLLM's figure\n")
    head = f"{'row':>4} {'deployment':<64} {'printed':>8}"
    print(f"{head} {'shipped':>9} {'held-out':>9} {'lofo':>9} {'naive':>9}")
    for r in rows:
        print(
            f"{r['row']:>4} {r['label']:<64} {r['printed_gib']:>7.2f}G "
            f"{r['shipped_err_pct']:>+8.2f}% {r['held-out_err_pct']:>+8.2f}% "
            f"{r['lofo_err_pct']:>+8.2f}% {r['naive_err_pct']:>+8.2f}%"
        )
    print()
    for name, s in summary.items():
        print(
            f"{name:<9} median |error| {s['median_abs_error_pct']:6.2f} %   "
            f"p90 {s['p90_abs_error_pct']:6.2f} %   max {s['max_abs_error_pct']:6.2f} %"
        )
    print(
        f"exactness given the printed figure: {reproduced}/{len(exact)} rows' blocks within 0.01 %"
    )
    naive, held = summary["naive"], summary["held-out"]
    median_ratio = naive["median_abs_error_pct"] / max(held["median_abs_error_pct"], 1e-9)
    p90_ratio = naive["p90_abs_error_pct"] / max(held["p90_abs_error_pct"], 1e-9)
    print(f"\nheld-out vs naive: median error {median_ratio:.0f}× smaller, p90 {p90_ratio:.0f}×")
    r, s = refit_all, shipped
    print("coefficients refit on all rows (shipped in parentheses; they should agree):")
    print(
        f"  sampler {r.sampler_fixed_bytes:.2f} + {r.sampler_dtype_bytes:.2f}/dtype byte "
        f"({s.sampler_fixed_bytes} + {s.sampler_dtype_bytes}), "
        f"before 0.17 ×{r.sampler_early_factor:.2f} ({s.sampler_early_factor}), "
        f"forward {r.forward_bytes:.2f} ({s.forward_bytes}), "
        f"TP non-torch {r.non_torch_tp / GIB:.2f} GiB ({s.non_torch_tp / GIB:.2f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
