"""The status page at ``/``: the whole chain with live numbers, for a human with
``kubectl port-forward``. Every value that came from outside is HTML-escaped."""

from __future__ import annotations

from html import escape

from exporter import __version__
from exporter.config import Config
from exporter.snapshot import EngineView, Snapshot
from exporter.sources.vllm import redact

GIB = 1 << 30


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def _n(value: float | None, digits: int = 0, unit: str = "") -> str:
    if value is None:
        return "–"
    text = f"{value:,.{digits}f}"
    return f"{text} {unit}".strip()


def _gib(value: float | None) -> str:
    return "–" if value is None else f"{value / GIB:,.2f} GiB"


def _rows(rows: list[tuple[str, str, str]]) -> str:
    return "".join(f"<tr><th>{_e(a)}</th><td>{_e(b)}</td><td>{_e(c)}</td></tr>" for a, b, c in rows)


def _chain(snap: Snapshot) -> list[tuple[str, str, str]]:
    rows: list[tuple[str, str, str]] = []
    plan = snap.expected
    if plan is not None:
        t = plan.tightest
        src = plan.sources
        if t.requested:
            rows += [
                (
                    "GPU memory (CUDA total)",
                    _gib(plan.request.gpu.total_bytes),
                    plan.request.gpu.source,
                ),
                (
                    f"× utilization {plan.utilization:g}",
                    _gib(t.requested),
                    src.get("utilization", ""),
                ),
                ("− weights", _gib(t.weights), src.get("weights", "")),
                ("− activation, non-torch, graphs", _gib(t.overhead), "model"),
            ]
        rows.append(
            ("= KV budget (expected)", _gib(plan.kv_budget_bytes), src.get("kv_budget", ""))
        )
        rows.append(("KV bytes per token", _n(plan.kv_bytes_per_token, unit="B"), "config"))
        rows.append(("blocks (expected)", _n(plan.cap.num_blocks), src.get("num_blocks", "")))
        rows.append(("KV cache size (expected)", _n(plan.cap.capacity_tokens, unit="tokens"), ""))
    else:
        rows.append(("expected capacity", "unavailable", snap.expected_note))
        if snap.kv_bytes_per_token is not None:
            rows.append(
                (
                    "KV bytes per token",
                    _n(snap.kv_bytes_per_token, unit="B"),
                    snap.kv_bytes_per_token_source or "",
                )
            )
    return rows


def _engine(v: EngineView) -> str:
    rows = [
        ("blocks (observed)", _n(v.num_blocks), f"block size {v.block_size}"),
        ("KV cache size (observed)", _n(v.capacity_tokens, unit="tokens"), "as vLLM counts"),
        ("KV budget (observed)", _gib(v.budget_bytes), ""),
    ]
    if v.stale:
        rows.append(("load", "vLLM is not answering", "figures below are the last known"))
    else:
        rows += [
            ("KV usage", _n((v.kv_usage or 0) * 100, 1, "%"), "blocks held by live requests"),
            ("running / waiting", f"{_n(v.running)} / {_n(v.waiting)}", ""),
        ]
        if v.occupancy is not None:
            rows += [
                (
                    "used / free tokens",
                    f"{_n(v.occupancy.used_tokens)} / {_n(v.occupancy.free_tokens)}",
                    "",
                ),
                ("tokens per running sequence", _n(v.occupancy.tokens_per_running_sequence), ""),
            ]
    rows.append(("preemptions since sidecar start", _n(v.preemptions_total), ""))
    for label, tokens in v.contexts.items():
        fits = v.max_sequences.get(label)
        free = v.free_sequences.get(label)
        rows.append(
            (f"context {label}", _n(tokens, unit="tokens"), f"{_n(fits)} fit, {_n(free)} free")
        )
    rows += [
        ("sequences per request", _n(v.sequences_per_request, 2), ""),
        ("max_num_seqs ÷ fits at p95", _n(v.config_overcommit_ratio, 2), ""),
        ("recommended max_num_seqs", _n(v.recommended_max_num_seqs), "fits at p95"),
        ("prefix cache hit ratio", _n((v.prefix_cache_hit_ratio or 0) * 100, 1, "%"), ""),
    ]
    title = f"engine {v.engine}" + (f" · {v.model_name}" if v.model_name else "")
    return f"<h2>{_e(title)}</h2><table>{_rows(rows)}</table>"


def status_page(snap: Snapshot, config: Config) -> str:
    sources = _rows([(s.name, "up" if s.up else "down", s.error or "") for s in snap.sources])
    flags = _rows(
        [
            (k, str(v), snap.deployment.origin.get(k, ""))
            for k, v in sorted(snap.deployment.values.items())
        ]
    )
    gpus = _rows(
        [
            (
                f"GPU {g.index} {g.name}",
                f"{_gib(g.used_bytes)} of {_gib(g.total_bytes)}",
                f"foreign {_gib(g.foreign_bytes)}",
            )
            for g in snap.gpus
        ]
    )
    engines = "".join(_engine(v) for v in snap.engines)
    notes = "".join(f"<p class=note>{_e(n)}</p>" for n in snap.notes)
    refresh = max(1, round(config.poll_interval_seconds))
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><meta http-equiv="refresh" content="{refresh}">
<title>kv-headroom · {_e(snap.model_name or "vLLM")}</title>
<style>body{{font:14px system-ui,sans-serif;margin:2em;max-width:70em}}
table{{border-collapse:collapse;margin-bottom:1em}}
th,td{{padding:2px 10px;text-align:left;border-bottom:1px solid #ddd}}
th{{font-weight:500}}.note{{color:#a60}}</style></head><body>
<h1>kv-headroom · {_e(snap.model_name or "model unknown")}</h1>
<p>vLLM {_e(redact(config.vllm_url))} · poll every {config.poll_interval_seconds:g}s · last poll
{snap.poll_duration_seconds * 1000:.1f} ms · <a href="/metrics">/metrics</a></p>
{notes}
<h2>sources</h2><table>{sources}</table>
<h2>capacity chain</h2><table>{_rows(_chain(snap))}</table>
{engines}
<h2>GPUs</h2><table>{gpus or "<tr><td>no GPU data</td></tr>"}</table>
<h2>deployment flags</h2><table>{flags}</table>
<p>kv-headroom {_e(__version__)}</p>
</body></html>
"""
