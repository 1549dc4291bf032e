"""``kv-headroom plan``'s answers to "what would work": a deployment that would not start,
what would, and which deployments hold N sequences of L tokens (``--fit``), as text and
JSON. The arithmetic is ``exporter.capacity.plan``'s; this module only lays it out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from exporter.capacity.plan import Fit, Plan, Suggestion, gpu_count, why_not
from exporter.errors import InputError
from exporter.plan.recommend import MAX_GPUS, Recommendation, Recommendations, describe
from exporter.plan.traffic import QUEUE_WAIT_QUANTILE

# How each dial reads in the table, in the order the search tries them.
_DIAL_NAMES = {
    "tensor_parallel": "TP on this GPU",
    "parallel": "fewest GPUs (TP × PP)",
    "gpu": "smallest GPU",
    "gpu_tp": "smallest GPU, more TP",
    "kv_cache_dtype": "KV cache dtype",
    "max_model_len": "longest context",
    "utilization": "utilization",
}


def parse_fit(text: str) -> tuple[int, int]:
    """``64:8192`` or ``64:8k`` → (sequences, tokens per sequence)."""
    count, sep, length = text.partition(":")
    count, length = count.strip(), length.strip().lower()
    scale = 1024 if length.endswith("k") else 1
    digits = length[:-1] if scale > 1 else length
    if not sep or not count.isdecimal() or not digits.isdecimal():
        raise InputError("--fit", "", text, "write SEQUENCES:TOKENS, e.g. 64:8192 or 64:8k")
    n, tokens = int(count), int(digits) * scale
    if n < 1 or tokens < 1:
        raise InputError("--fit", "", text, "both must be greater than 0")
    return n, tokens


def failure_lines(p: Plan) -> list[str]:
    """vLLM's refusal, and where its message does not say why (its "No available memory"
    advises a higher utilization whatever the cause), the reason in its own terms."""
    failure = p.startup_failure
    if failure is None:
        return []
    lines = ["", f"vLLM would refuse to start: {failure.message}"]
    if failure.cause == "no_kv_memory":
        lines.append(f"  that is: {why_not(p)}")
    return lines


def _figures(q: Plan, context: str) -> str:
    seqs = {c.label: n for c, n in q.sequences}[context]
    return (
        f"{gpu_count(q):>3} GPU{'s' if gpu_count(q) > 1 else ' '} {q.cap.num_blocks:>10,} blocks "
        f"{q.cap.capacity_tokens:>12,} tokens  {seqs:>7,} seqs @ {context}"
    )


def suggestion_lines(p: Plan, suggestions: Sequence[Suggestion]) -> list[str]:
    if not suggestions:
        return []
    context = p.sequences[0][0].label
    names = {s.dial: _dial_name(p, s.dial) for s in suggestions}
    w0 = max(len(n) for n in names.values())
    w1 = max([len(s.change) for s in suggestions if s.plan is not None] + [0])
    lines = ["", "What would start (the smallest change on each dial, every other flag kept)"]
    for s in suggestions:
        if s.plan is None:
            lines.append(f"  {names[s.dial]:<{w0}}  none: {s.why_not}")
        else:
            lines.append(f"  {names[s.dial]:<{w0}}  {s.change:<{w1}}  {_figures(s.plan, context)}")
    return lines


def _dial_name(p: Plan, dial: str) -> str:
    if dial == "gpu":
        return f"smallest GPU at TP{p.request.tensor_parallel_size}"
    return _DIAL_NAMES[dial]


def _summary(p: Plan) -> dict[str, Any]:
    return {
        "gpus": gpu_count(p),
        "tensor_parallel_size": p.request.tensor_parallel_size,
        "pipeline_parallel_size": p.request.pipeline_parallel_size,
        "gpu": p.request.gpu.name,
        "kv_cache_dtype": p.request.kv_cache_dtype,
        "max_model_len": p.max_model_len,
        "max_num_seqs": p.max_num_seqs,
        "kv_budget_bytes": p.kv_budget_bytes,
        "num_blocks": p.cap.num_blocks,
        "kv_capacity_tokens": p.cap.capacity_tokens,
        "max_sequences": {c.label: n for c, n in p.sequences},
    }


def suggestions_json(suggestions: Sequence[Suggestion]) -> list[dict[str, Any]]:
    return [
        {"dial": s.dial, "change": s.change, "starts": True, **_summary(s.plan)}
        if s.plan is not None
        else {"dial": s.dial, "change": None, "starts": False, "why_not": s.why_not}
        for s in suggestions
    ]


def fit_json(base: Plan, sequences: int, tokens: int, fits: Sequence[Fit]) -> dict[str, Any]:
    req = base.request
    return {
        "model": req.model_name,
        "vllm_version": req.release.label,
        "fit": {
            "sequences": sequences,
            "tokens": tokens,
            "max_model_len": req.max_model_len or tokens,
        },
        "deployments": [{"change": f.change, "held": f.held, **_summary(f.plan)} for f in fits],
    }


def render_fit(base: Plan, sequences: int, tokens: int, fits: Sequence[Fit]) -> str:
    req = base.request
    max_len = req.max_model_len or tokens
    lines = [
        f"{req.model_name} · vLLM {req.release.label} · deployments that hold {sequences:,} "
        f"sequences of {tokens:,} tokens at once (--max-model-len {max_len}), fewest GPUs first",
        "",
    ]
    if not fits:
        lines.append(
            "  none of the table's GPUs at TP 1, 2, 4 or 8 with either KV dtype holds them"
            + (f" at PP{req.pipeline_parallel_size}" if req.pipeline_parallel_size > 1 else "")
        )
        return "\n".join(lines)
    w = max(len(f.change) for f in fits)
    lines.append(
        f"  {'GPUs':>4}  {'flags':<{w}}  {'blocks':>10}  {'held':>6}  {'KV budget/GPU':>13}"
    )
    for f in fits:
        lines.append(
            f"  {f.gpus:>4}  {f.change:<{w}}  {f.plan.cap.num_blocks:>10,}  {f.held:>6,}  "
            f"{f.plan.kv_budget_bytes / 2**30:>9,.2f} GiB"
        )
    return "\n".join(lines)


def _held(r: Recommendation) -> str:
    lim = r.limit
    if lim.failed is None:
        return f"≥ ×{lim.held:.3g}" if lim.held is not None else "?"
    return f"×{lim.held:.3g}" if lim.held is not None else f"< ×{lim.failed:.3g}"


def recommendation_lines(r: Recommendations, max_queue_wait: float) -> list[str]:
    """``plan --traffic``'s recommendation: the fewest GPUs that hold the traffic."""
    rule = f"no preemption, p{QUEUE_WAIT_QUANTILE * 100:.0f} queue wait ≤ {max_queue_wait:g} s"
    searched = (
        f"{r.replayed} of {r.planned} deployments replayed ({r.ruled_out} ruled out by "
        f"their prefill queue, {r.dominated} no better than one that failed), "
        f"{r.wall_seconds:.1f} s"
    )
    if not r.found:
        why = (
            f"stopped after {r.replayed} replays, at {r.largest} GPUs (raise --recommend-replays)"
            if r.capped
            else f"none of up to {MAX_GPUS} GPUs does"
        )
        return ["", f"Recommended: no deployment found that holds this traffic ({rule}); {why}"]
    lines = [
        "",
        f"Recommended: the fewest GPUs that hold this traffic ({rule}): {r.gpus}",
    ]
    descs = [describe(x.candidate) for x in r.found]
    w = max(len(d) for d in descs)
    lines.append(f"  {'GPUs':>4}  {'deployment':<{w}}  {'blocks':>9}  {'holds':>8}  binding")
    for x, d in zip(r.found, descs, strict=True):
        lines.append(
            f"  {x.candidate.gpus:>4}  {d:<{w}}  {x.candidate.plan.cap.num_blocks:>9,}  "
            f"{_held(x):>8}  {x.limit.binding}"
        )
    lines.append(f"  ({searched})")
    return lines


def recommendations_json(r: Recommendations) -> list[dict[str, Any]]:
    out = []
    for x in r.found:
        lim = x.limit
        out.append(
            {
                "change": x.candidate.change,
                "replicas": x.candidate.replicas,
                **_summary(x.candidate.plan),
                "gpus": x.candidate.gpus,
                "gpus_per_replica": gpu_count(x.candidate.plan),
                "max_multiplier": None if lim.held is None else round(lim.held, 4),
                "failed_multiplier": None if lim.failed is None else round(lim.failed, 4),
                "binding_resource": lim.binding,
                "queue_wait_seconds": {
                    k: round(v, 3) for k, v in x.at_one.queue_wait_seconds.items()
                },
                "peak_kv_usage": round(x.at_one.peak_kv_usage, 4),
            }
        )
    return out


def recommendation_search_json(r: Recommendations) -> dict[str, Any]:
    return {
        "fewest_gpus": r.gpus,
        "planned": r.planned,
        "ruled_out": r.ruled_out,
        "dominated": r.dominated,
        "replayed": r.replayed,
        "capped": r.capped,
        "largest_gpu_count": r.largest,
        "wall_seconds": round(r.wall_seconds, 3),
    }
