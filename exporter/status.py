"""The status page at ``/``, for a human with ``kubectl port-forward``.

It leads with what on-call needs (the preemption risk, time to exhaustion, headroom in
sequences, what limits the engine, the last preemption), then a chart of the sidecar's own
recent history drawn here as inline SVG (no JavaScript, nothing fetched; a terminal
browser, which draws no SVG, gets the same history as text), then the capacity chain and
the details. Where two figures on the page differ, a note says why. Every value that came
from outside is HTML-escaped.
"""

from __future__ import annotations

import base64
import itertools
import math
from collections.abc import Callable, Sequence
from html import escape

from exporter import __version__
from exporter.capacity.memory import DEVICE_CAP_ROW
from exporter.config import Config
from exporter.risk.model import (
    ALERT_FOR_SECONDS,
    ALERT_THRESHOLD,
    ALERT_USAGE,
    ALERT_USAGE_WINDOW_SECONDS,
    EDGE_FOR_SECONDS,
    EDGE_THRESHOLD,
    HORIZON,
    WARNING_CERTAIN,
    WARNING_FOR_SECONDS,
    WARNING_THRESHOLD,
    WARNING_USAGE,
    WARNING_USAGE_WINDOW_SECONDS,
    page_holds,
    warning_holds,
)
from exporter.snapshot import EngineView, GpuView, Snapshot, SourceState
from exporter.sources.vllm import redact
from exporter.trail import Trail, TrailPoint

GIB = 1 << 30
HIGH_RISK = WARNING_THRESHOLD  # the score at which the shipped warning starts its `for:`


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def _n(value: float | None, digits: int = 0, unit: str = "") -> str:
    if value is None:
        return "–"
    text = f"{value:,.{digits}f}"
    return f"{text} {unit}".strip()


def _gib(value: float | None) -> str:
    return "–" if value is None else f"{value / GIB:,.2f} GiB"


def _ago(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def _rows(rows: Sequence[tuple[str, str, str]]) -> str:
    return "".join(f"<tr><th>{_e(a)}</th><td>{_e(b)}</td><td>{_e(c)}</td></tr>" for a, b, c in rows)


# -- the headline -----------------------------------------------------------------------------


def _bottleneck(v: EngineView) -> tuple[str | None, str]:
    """Read with getattr: the fields arrive with the bottleneck model, and this page must
    work with snapshots from before it as well as after."""
    return getattr(v, "bottleneck", None), str(getattr(v, "bottleneck_evidence", "") or "")


def alerts_row(
    risk: float, peak: float | None, recent: float | None = None
) -> tuple[str, str, str]:
    """Which of the shipped alerts' conditions hold now, from the same constants the rules
    are written from, so on-call can tell a page coming from a warning that is only early.
    ``peak`` is the usage's peak over the page's window, ``recent`` over the warning's."""
    window = f"{ALERT_USAGE_WINDOW_SECONDS / 60:g} min"
    peak_text = "–" if peak is None else f"{peak:.2f}"
    recent_text = "–" if recent is None else f"{recent:.2f}"
    if page_holds(risk, peak):
        value = (
            "page armed: VllmKvCachePreemptionImminent fires once this holds "
            f"{ALERT_FOR_SECONDS:g} s"
        )
    elif warning_holds(risk, recent):
        value = (
            f"warning armed: VllmKvCachePreemptionLikely (never pages) fires once this holds "
            f"{WARNING_FOR_SECONDS:g} s"
        )
    elif risk > WARNING_THRESHOLD:
        value = (
            f"quiet: the score is above {WARNING_THRESHOLD:g}, but the warning waits for the "
            f"cache to pass {WARNING_USAGE:g} (a burst that may still drain)"
        )
    else:
        value = "quiet: neither alert's condition holds"
    why = (
        f"the page: risk > {ALERT_THRESHOLD:g} (now {risk:.3f}) and the cache's peak over "
        f"{window} > {ALERT_USAGE:g} (now {peak_text}), the quieter and later one; "
        f"the warning: risk > {WARNING_THRESHOLD:g} and the cache's peak over "
        f"{WARNING_USAGE_WINDOW_SECONDS:g} s > {WARNING_USAGE:g} (now {recent_text}), or "
        f"risk > {WARNING_CERTAIN:g}, earlier and noisier "
        "(docs/risk-model.md#the-page-and-the-warning)"
    )
    return ("alerts", value, why)


def _headline(v: EngineView, snap: Snapshot, trail: Trail | None) -> str:
    r = v.risk
    if v.stale:
        level, risk_text = "stale", "vLLM is not answering"
        risk_why = "the figures below are the last vLLM gave"
    elif r is None:
        level, risk_text = "none", "no opinion yet"
        risk_why = "the risk model needs a few polls of history"
    else:
        score = r.preemption_risk
        level = "high" if score >= HIGH_RISK else "watch" if score >= HIGH_RISK / 2 else "ok"
        risk_text = f"{score:.2f}"
        risk_why = (
            f"a ranking score 0–1, not a probability; the warning alert starts at {HIGH_RISK:g} "
            f"once the cache has passed {WARNING_USAGE:g}, or at {WARNING_CERTAIN:g}"
        )
        if v.preemption_probability is not None:
            risk_why += (
                f"; on this engine, scores in its band were followed by a preemption within "
                f"{HORIZON / 60:g} min {v.preemption_probability:.1%} of the time"
            )
    exhaustion = forecast = "–"
    exhaustion_why = forecast_why = ""
    if r is not None and not v.stale:
        # The time comes from the forecast the score rests on, so the two never disagree;
        # +Inf is that forecast never reaching the top, said in words.
        if math.isinf(r.seconds_to_exhaustion):
            exhaustion = "not on this trend"
            exhaustion_why = "the forecast the risk rests on never reaches the cache's size"
        else:
            exhaustion = f"in {r.seconds_to_exhaustion:,.0f} s"
            exhaustion_why = (
                "when the forecast the risk rests on crosses the cache's size, then vLLM preempts"
            )
        forecast = f"{r.forecast_usage:.2f} of the cache"
        forecast_why = (
            f"the KV level the risk forecasts {HORIZON / 60:g} minutes ahead ÷ the cache; above "
            f"{EDGE_THRESHOLD:g} for {EDGE_FOR_SECONDS / 60:g} min the running-at-the-edge "
            "ticket opens"
        )
    p50, p95 = v.contexts.get("p50"), v.contexts.get("p95")
    free50, free95 = v.free_sequences.get("p50"), v.free_sequences.get("p95")
    headroom = f"{_n(free50)} at p50 · {_n(free95)} at p95"
    headroom_why = (
        f"more sequences of the recent p50 ({_n(p50)} tokens) or p95 ({_n(p95)} tokens) "
        "context that fit in the free cache now"
    )
    what, evidence = _bottleneck(v)
    limit = what or "–"
    limit_why = evidence or ("not assessed by this build" if what is None else "")
    if trail is not None and trail.last_preemption is not None:
        last = _ago(max(0.0, snap.time - trail.last_preemption))
    elif v.preemptions_total > 0:
        last = "before this page's history began"
    else:
        last = "none"
    last_why = f"{v.preemptions_total:,.0f} since the sidecar started"
    overcommit = "–" if r is None else f"{r.overcommit_ratio:.2f}×"
    ratio, resource = v.load_headroom_ratio, v.load_headroom_resource
    if v.stale:
        held, held_why = "–", "vLLM is not answering"
    elif ratio is None:
        held = "–"
        held_why = (
            "no opinion yet" if r is None else "no traffic to scale: nothing running or waiting"
        )
    else:
        held = f"{ratio:.2f}× today's traffic · {resource or '–'} gives out first"
        held_why = (
            "how many times the current arrival rate (same request mix) this engine holds "
            "before the risk reaches its alert line or the batch fills max_num_seqs; "
            "below 1: add replicas"
        )
    rows = [
        ("preemption risk", risk_text, risk_why),
        *(
            [alerts_row(r.preemption_risk, v.kv_usage_peak_page, v.kv_usage_peak_warning)]
            if r and not v.stale
            else []
        ),
        ("forecast", forecast, forecast_why),
        ("load headroom", held, held_why),
        ("time to exhaustion", exhaustion, exhaustion_why),
        ("headroom", headroom, headroom_why),
        ("limited by", limit, limit_why),
        ("last preemption", last, last_why),
        ("overcommit", overcommit, "running sequences' expected growth ÷ free cache"),
    ]
    return (
        f'<table class="now {level}"><tr><th class=big>{_e(rows[0][0])}</th>'
        f"<td class=big>{_e(rows[0][1])}</td><td>{_e(rows[0][2])}</td></tr>"
        f"{_rows(rows[1:])}</table>"
    )


# -- the history chart ------------------------------------------------------------------------

CHART_W, PANEL_H, LEFT, RIGHT, GAP = 760, 70, 150, 10, 18
SPARKS = "▁▂▃▄▅▆▇█"


def _span(points: Sequence[TrailPoint], now: float) -> float:
    """15 minutes until the history is longer, then 30."""
    return 900.0 if not points or now - points[0].time <= 900 else 1800.0


def _path(
    points: Sequence[TrailPoint],
    value: Callable[[TrailPoint], float | None],
    x: Callable[[float], float],
    y: Callable[[float], float],
) -> str:
    """An SVG path through the points, broken where a value is missing."""
    out, pen = [], "M"
    for p in points:
        v = value(p)
        if v is None:
            pen = "M"
            continue
        out.append(f"{pen}{x(p.time):.1f},{y(v):.1f}")
        pen = "L"
    return " ".join(out)


def history_svg(points: Sequence[TrailPoint], now: float) -> str:
    """Three panels over the last 15–30 minutes: KV tokens used against the cache's size,
    the preemption risk, running and waiting sequences; a mark where vLLM preempted."""
    span = _span(points, now)
    inner = CHART_W - LEFT - RIGHT

    def x(t: float) -> float:
        return LEFT + max(0.0, min(1.0, 1 - (now - t) / span)) * inner

    cap = max((p.capacity_tokens or 0 for p in points), default=0) or 1
    seqs = max((max(p.running or 0, p.waiting or 0) for p in points), default=0) or 1
    last = points[-1] if points else None
    used_now = _n(last.used_tokens if last else None)
    cap_now = _n(last.capacity_tokens if last else None)
    panels: list[
        tuple[str, str, float, list[tuple[Callable[[TrailPoint], float | None], str, str]]]
    ]
    panels = [
        (
            "KV cache tokens",
            f"{used_now} of {cap_now}",
            cap * 1.05,
            [
                (lambda p: p.capacity_tokens, "#888", "4 3"),
                (lambda p: p.used_tokens, "#1f6fd1", ""),
            ],
        ),
        (
            "preemption risk",
            _n(last.risk, 2) if last else "–",
            1.0,
            [(lambda p: p.risk, "#c62828", "")],
        ),
        (
            "running / waiting",
            f"{_n(last.running if last else None)} / {_n(last.waiting if last else None)}",
            seqs * 1.1,
            [(lambda p: p.running, "#2e7d32", ""), (lambda p: p.waiting, "#ef6c00", "")],
        ),
    ]
    height = len(panels) * (PANEL_H + GAP) + 20
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{CHART_W}" height="{height}" '
        f'viewBox="0 0 {CHART_W} {height}" role="img" font-family="sans-serif" font-size="12">',
        "<title>the sidecar's history: KV tokens used, preemption risk, running and waiting "
        "sequences</title>",
    ]
    for i, (title, current, top, series) in enumerate(panels):
        y0 = i * (PANEL_H + GAP) + 4

        def y(v: float, y0: float = y0, top: float = top) -> float:
            return y0 + PANEL_H - max(0.0, min(1.0, v / top)) * PANEL_H

        parts.append(
            f'<rect x="{LEFT}" y="{y0}" width="{inner}" height="{PANEL_H}" fill="#fafafa" '
            'stroke="#ddd"/>'
        )
        parts.append(f'<text x="4" y="{y0 + 14}" fill="#333">{_e(title)}</text>')
        parts.append(f'<text x="4" y="{y0 + 32}" fill="#000" font-size="15">{_e(current)}</text>')
        if title == "preemption risk":
            yt = y(HIGH_RISK)
            parts.append(
                f'<line x1="{LEFT}" x2="{LEFT + inner}" y1="{yt:.1f}" y2="{yt:.1f}" '
                'stroke="#c62828" stroke-opacity="0.4" stroke-dasharray="2 3"/>'
            )
            parts.append(
                f'<text x="{LEFT - 4}" y="{yt + 4:.1f}" text-anchor="end" fill="#999">'
                f"{HIGH_RISK:g}</text>"
            )
        for value, colour, dash in series:
            d = _path(points, value, x, y)
            if d:
                dashed = f' stroke-dasharray="{dash}"' if dash else ""
                parts.append(
                    f'<path d="{d}" fill="none" stroke="{colour}" stroke-width="1.6"{dashed}/>'
                )
    bottom = len(panels) * (PANEL_H + GAP) - GAP + 4
    for a, b in itertools.pairwise(points):
        if b.preemptions_total > a.preemptions_total:
            xb = x(b.time)
            parts.append(
                f'<line x1="{xb:.1f}" x2="{xb:.1f}" y1="4" y2="{bottom}" stroke="#7b1fa2" '
                'stroke-opacity="0.35"/>'
            )
    for minutes in range(0, int(span // 60) + 1, 5):
        xt = x(now - minutes * 60)
        label = "now" if minutes == 0 else f"−{minutes} min"
        parts.append(
            f'<text x="{xt:.1f}" y="{bottom + 14}" text-anchor="middle" fill="#666">{label}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _spark(values: Sequence[float | None], top: float) -> str:
    return "".join(
        " "
        if v is None
        else SPARKS[min(len(SPARKS) - 1, int(max(0.0, v) / (top or 1) * len(SPARKS)))]
        for v in values
    )


def history_text(points: Sequence[TrailPoint], now: float, width: int = 60) -> str:
    """The same history as sparklines, for a browser that draws no SVG."""
    span = _span(points, now)
    buckets: list[TrailPoint | None] = [None] * width
    for p in points:
        i = int((1 - (now - p.time) / span) * (width - 1) + 0.5)
        if 0 <= i < width:
            buckets[i] = p
    cap = max((p.capacity_tokens or 0 for p in points), default=0) or 1
    seqs = max((max(p.running or 0, p.waiting or 0) for p in points), default=0) or 1

    def line(name: str, get: Callable[[TrailPoint], float | None], top: float, now_: str) -> str:
        values = [get(b) if b is not None else None for b in buckets]
        return f"{name:<11} {_spark(values, top)}  {now_}"

    last = points[-1] if points else None
    minutes = f"the last {span / 60:.0f} min, oldest left"
    return "\n".join(
        [
            f"{'':<11} {minutes}",
            line("KV tokens", lambda p: p.used_tokens, cap, _n(last.used_tokens if last else None)),
            line("risk", lambda p: p.risk, 1.0, _n(last.risk, 2) if last else "–"),
            line("running", lambda p: p.running, seqs, _n(last.running if last else None)),
            line("waiting", lambda p: p.waiting, seqs, _n(last.waiting if last else None)),
        ]
    )


# -- the capacity chain and the details -------------------------------------------------------


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
                *(
                    [(DEVICE_CAP_ROW[0], _gib(cap), DEVICE_CAP_ROW[1])]
                    if (cap := t.binding_cap) is not None
                    else []
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


def differences(snap: Snapshot) -> list[str]:
    """Why two figures on this page that look like the same thing are not equal."""
    out: list[str] = []
    plan = snap.expected
    v = snap.engines[0] if snap.engines else None
    for g in snap.gpus:
        if (
            plan is not None
            and plan.tightest.requested
            and g.total_bytes != plan.request.gpu.total_bytes
        ):
            diff = g.total_bytes - plan.request.gpu.total_bytes
            out.append(
                f"GPU {g.index}'s total reads {_gib(g.total_bytes)} in the GPU table and "
                f"{_gib(plan.request.gpu.total_bytes)} in the capacity chain: the table shows "
                f"NVML's total, which {'includes' if diff > 0 else 'differs by'} "
                f"{_gib(abs(diff))} the driver keeps for itself; vLLM sizes its cache from "
                "CUDA's total, as the chain does."
            )
        if g.foreign_bytes:
            out.append(
                f"GPU {g.index}'s foreign memory ({_gib(g.foreign_bytes)}) is what it uses "
                "beyond this vLLM's expected footprint (its ceiling plus the CUDA context), "
                "not a sum of other processes: in a container NVML's process IDs are the "
                "host's and cannot be matched to vLLM."
            )
    if v is None:
        return out
    if plan is not None and v.num_blocks is not None and v.num_blocks != plan.cap.num_blocks:
        drift = v.num_blocks / plan.cap.num_blocks if plan.cap.num_blocks else math.nan
        out.append(
            f"vLLM made {v.num_blocks:,} blocks where {plan.cap.num_blocks:,} were expected "
            f"({drift:.3f}×): the expected figure is this sidecar's model of vLLM's start-up "
            "profile; the observed one is what vLLM reports. Alerts use the observed."
        )
    if plan is not None and v.budget_bytes is not None and v.budget_bytes != plan.kv_budget_bytes:
        out.append(
            f"The KV budget reads {_gib(plan.kv_budget_bytes)} expected and "
            f"{_gib(v.budget_bytes)} observed: the expected one is the memory left for the "
            "cache; the observed one is what vLLM says its cache holds, or its blocks × "
            "bytes per block, which leaves out the remainder too small for a whole block."
        )
    if v.occupancy is not None and v.capacity_tokens is not None:
        usable = v.occupancy.usable_blocks * v.occupancy.block_size
        if usable != v.capacity_tokens:
            out.append(
                f"KV cache size ({v.capacity_tokens:,} tokens, as vLLM prints it) differs from "
                f"used + free tokens ({usable:,}): vLLM keeps one block in reserve and "
                "reports usage over the rest, and its printed size follows its own formula "
                "for this release."
            )
    return out


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


def _source_row(s: SourceState) -> tuple[str, str, str]:
    if not s.up:
        return s.name, "down", s.error or ""
    if s.missing:
        return s.name, "up, partial", f"missing: {', '.join(s.missing)}"
    return s.name, "up", ""


def _gpu_row(g: GpuView) -> tuple[str, str, str]:
    return (
        f"GPU {g.index} {g.name}",
        f"{_gib(g.used_bytes)} used of {_gib(g.total_bytes)} (NVML)",
        f"foreign {_gib(g.foreign_bytes)}",
    )


STYLE = """body{font:14px system-ui,sans-serif;margin:2em;max-width:62em;color:#222}
table{border-collapse:collapse;margin-bottom:1em}
th,td{padding:3px 10px;text-align:left;border-bottom:1px solid #e4e4e4;vertical-align:top}
th{font-weight:500}td:nth-child(3){color:#666}
.now{border-left:6px solid #bbb}.now th{white-space:nowrap}
.now.ok{border-color:#2e7d32}.now.watch{border-color:#f9a825}
.now.high{border-color:#c62828}.now .big{font-size:22px;font-weight:600}
.note{color:#a60}.why li{color:#555;margin-bottom:.3em}
pre.text-chart{display:none}"""


def status_page(snap: Snapshot, config: Config, trail: Trail | None = None) -> str:
    sources = _rows([_source_row(s) for s in snap.sources])
    lacking = [
        f"{s.name} answers without {', '.join(s.missing)}: what needs it is not shown"
        for s in snap.sources
        if s.up and s.missing
    ]
    flags = _rows(
        [(k, str(v), snap.deployment.origin.get(k, "")) for k, v in sorted(snap.deployment.items())]
    )
    gpus = _rows([_gpu_row(g) for g in snap.gpus])
    engines = "".join(_engine(v) for v in snap.engines)
    notes = "".join(f"<p class=note>{_e(n)}</p>" for n in (*snap.notes, *lacking))
    if snap.engines:
        headline = _headline(snap.engines[0], snap, trail)
    else:
        headline = "<p class=note>waiting for vLLM to answer /metrics</p>"
    points = trail.points() if trail is not None else ()
    if points:
        # The SVG is the background of a box, not markup in the page: a terminal browser
        # applies no style, so it neither draws it nor spills the SVG's labels into the text
        # as one run-on line; it shows the text copy below instead, which a browser that
        # draws the picture hides by style.
        svg = history_svg(points, snap.time)
        svg64 = base64.b64encode(svg.encode()).decode()
        height = svg.split('height="', 1)[1].split('"', 1)[0]
        chart = (
            f"<h2>the last {_span(points, snap.time) / 60:.0f} minutes</h2>"
            f'<figure><div class=chart role=img aria-label="the history below, drawn" '
            f'style="width:{CHART_W}px;height:{height}px;'
            f'background:url(data:image/svg+xml;base64,{svg64}) no-repeat"></div>'
            f"<pre class=text-chart>{_e(history_text(points, snap.time))}</pre>"
            "<figcaption>blue: KV tokens held, dashed grey: the cache's usable size; red: "
            "preemption risk; green: running, orange: waiting; purple marks: preemptions"
            "</figcaption></figure>"
        )
    else:
        chart = ""
    why = "".join(f"<li>{_e(d)}</li>" for d in differences(snap))
    why_html = f"<h2>why these numbers differ</h2><ul class=why>{why}</ul>" if why else ""
    refresh = max(1, round(config.poll_interval_seconds))
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><meta http-equiv="refresh" content="{refresh}">
<title>kv-headroom · {_e(snap.model_name or "vLLM")}</title>
<style>{STYLE}</style></head><body>
<h1>kv-headroom · {_e(snap.model_name or "model unknown")}</h1>
<p>vLLM {_e(redact(config.vllm_url))} · poll every {config.poll_interval_seconds:g}s · last poll
{snap.poll_duration_seconds * 1000:.1f} ms · <a href="/metrics">/metrics</a></p>
{notes}
{headline}
{chart}
<h2>capacity chain</h2><table>{_rows(_chain(snap))}</table>
<h2>GPUs</h2><table>{gpus or "<tr><td>no GPU data</td></tr>"}</table>
{why_html}
{engines}
<h2>sources</h2><table>{sources}</table>
<h2>deployment flags</h2><table>{flags}</table>
<p>kv-headroom {_e(__version__)}</p>
</body></html>
"""
