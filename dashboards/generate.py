"""Generate the Grafana dashboards in this folder from code.

    python dashboards/generate.py           # rewrite dashboards/*.json
    python dashboards/generate.py --check   # exit 1 when a committed file is out of date

The JSON is written with sorted keys, fixed uids and fixed panel ids, so a regeneration
without a change in this file is byte-identical.

Every panel selects with ``namespace=~"$namespace", pod=~"$pod"``. The three variables are
multi-select with "All" = ``.*``, and ``.*`` also matches a series that lacks the label, so
the same dashboards work under Kubernetes service discovery and against a plain Prometheus
with static targets. The sidecar's metrics carry no model label: they are joined with
``kv_headroom_info{model=~"$model"}`` on ``(job, instance)`` — the one series every sidecar
target exports — which also adds ``model`` to each result. vLLM's own series come from
another target (vLLM's port), so they are filtered on their ``model_name`` label instead.

``panel_queries()`` lists every query, and ``runnable(expr)`` substitutes the dashboard
variables so that a test can run each of them against a real Prometheus.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dashboard_b
from grafana_foundation_sdk.builders import heatmap as heatmap_b
from grafana_foundation_sdk.builders import prometheus as prometheus_b
from grafana_foundation_sdk.builders import stat as stat_b
from grafana_foundation_sdk.builders import table as table_b
from grafana_foundation_sdk.builders import timeseries as timeseries_b
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as common_m
from grafana_foundation_sdk.models import dashboard as dashboard_m
from grafana_foundation_sdk.models import heatmap as heatmap_m
from grafana_foundation_sdk.models import prometheus as prometheus_m

from exporter.risk.model import ALERT_FOR_SECONDS, ALERT_THRESHOLD

HERE = Path(__file__).resolve().parent
TAG = "kv-headroom"
# One hour: far enough ahead to act on, and a finite stand-in for the sidecar's +Inf.
EXHAUSTION_CLAMP_SECONDS = 3600

DATASOURCE = dashboard_m.DataSourceRef(type_val="prometheus", uid="${datasource}")

# --- PromQL building blocks ---------------------------------------------------------------

POD = 'namespace=~"$namespace", pod=~"$pod"'
INFO = f'kv_headroom_info{{{POD}, model=~"$model"}}'
# vLLM's model_name is the served name, by default the path vLLM was given, while the
# sidecar's model is the model directory's (or hub repo's) name: allow a leading path.
VLLM = f'{POD}, model_name=~"(.*/)?$model"'
# What identifies one sidecar (or one vLLM) target, in both service-discovery worlds.
TARGET = ("job", "instance", "namespace", "pod")


def sel(metric: str, *matchers: str, base: str = POD) -> str:
    """A vector selector scoped by the dashboard's variables."""
    return f"{metric}{{{', '.join((base, *matchers))}}}"


def agg(op: str, expr: str, *by: str) -> str:
    """``op by (target labels, *by) (expr)``: folds vLLM's data-parallel engines into one
    series per target, the way each metric adds up (tokens sum, ratios take the worst)."""
    return f"{op} by ({', '.join((*TARGET, *by))}) ({expr})"


def with_model(expr: str) -> str:
    """Keeps the targets whose sidecar serves a selected model, and labels them with it."""
    return f"({expr}) * on (job, instance) group_left (model) {INFO}"


def named(expr: str) -> str:
    """Adds a ``target`` label for legends: the pod under Kubernetes, else the instance."""
    by_instance = f'label_replace({expr}, "target", "$1", "instance", "(.*)")'
    return f'label_replace({by_instance}, "target", "$1", "pod", "(.+)")'


def ours(op: str, metric: str, *matchers: str, by: Sequence[str] = ()) -> str:
    """One of the sidecar's gauges, per target, for the selected models."""
    return named(with_model(agg(op, sel(metric, *matchers), *by)))


def expected_and_observed(op: str, metric: str, legend: str = "") -> list[Q]:
    """A gauge the sidecar exports twice, from the flags and from vLLM, as two lines."""
    return [
        Q(ours(op, metric, f'source="{source}"'), f"{{{{target}}}} {legend}{source}")
        for source in ("expected", "observed")
    ]


def rate(metric: str, base: str = POD) -> str:
    return f"rate({sel(metric, base=base)}[$__rate_interval])"


def vllm_rate(metric: str) -> str:
    """A vLLM counter's per-second rate, per target, for the selected models."""
    return named(agg("sum", rate(metric, base=VLLM)))


# --- panels -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Q:
    """One query of a panel."""

    expr: str
    legend: str = "{{target}}"
    instant: bool = False
    fmt: prometheus_m.PromQueryFormat = prometheus_m.PromQueryFormat.TIME_SERIES


def _targets(queries: Sequence[Q]) -> list[Builder[Any]]:
    out: list[Builder[Any]] = []
    for i, q in enumerate(queries):
        b = (
            prometheus_b.Dataquery()
            .expr(q.expr)
            .legend_format(q.legend)
            .ref_id(chr(ord("A") + i))
            .format(q.fmt)
        )
        out.append(b.instant() if q.instant else b.range())
    return out


def _thresholds(steps: Sequence[tuple[float | None, str]]) -> dashboard_b.ThresholdsConfig:
    return (
        dashboard_b.ThresholdsConfig()
        .mode(dashboard_m.ThresholdsMode.ABSOLUTE)
        .steps([dashboard_m.Threshold(value=v, color=c) for v, c in steps])
    )


NEUTRAL: tuple[tuple[float | None, str], ...] = ((None, "green"),)


def timeseries(
    title: str,
    description: str,
    unit: str,
    queries: Sequence[Q],
    *,
    span: int = 12,
    height: int = 8,
    min_val: float | None = 0,
    max_val: float | None = None,
    thresholds: Sequence[tuple[float | None, str]] = NEUTRAL,
    threshold_style: common_m.GraphThresholdsStyleMode = common_m.GraphThresholdsStyleMode.OFF,
    right_axis: Sequence[tuple[str, str]] = (),
) -> timeseries_b.Panel:
    """A time series; ``right_axis`` puts the queries with those refIds on a second axis
    with its own unit (a rate against a count)."""
    p = (
        timeseries_b.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .targets(_targets(queries))
        .span(span)
        .height(height)
        .line_width(1)
        .fill_opacity(10)
        .show_points(common_m.VisibilityMode.NEVER)
        .thresholds(_thresholds(thresholds))
        .thresholds_style(common_b.GraphThresholdsStyleConfig().mode(threshold_style))
        .legend(
            common_b.VizLegendOptions()
            .display_mode(common_m.LegendDisplayMode.TABLE)
            .placement(common_m.LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["lastNotNull", "max"])
        )
        .tooltip(
            common_b.VizTooltipOptions()
            .mode(common_m.TooltipDisplayMode.MULTI)
            .sort(common_m.SortOrder.DESCENDING)
        )
    )
    if min_val is not None:
        p = p.min(min_val)
    if max_val is not None:
        p = p.max(max_val)
    for ref, axis_unit in right_axis:
        p = p.override_by_query(
            ref,
            [
                dashboard_m.DynamicConfigValue(id_val="unit", value=axis_unit),
                dashboard_m.DynamicConfigValue(id_val="custom.axisPlacement", value="right"),
            ],
        )
    return p


def stat(
    title: str,
    description: str,
    unit: str,
    queries: Sequence[Q],
    *,
    span: int = 6,
    height: int = 5,
    thresholds: Sequence[tuple[float | None, str]] = NEUTRAL,
    mappings: Sequence[dashboard_m.ValueMapping] = (),
    decimals: float | None = None,
) -> stat_b.Panel:
    p = (
        stat_b.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .targets(_targets(queries))
        .span(span)
        .height(height)
        .thresholds(_thresholds(thresholds))
        .color_mode(common_m.BigValueColorMode.VALUE)
        .graph_mode(common_m.BigValueGraphMode.AREA)
        .reduce_options(common_b.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    if mappings:
        p = p.mappings(list(mappings))
    if decimals is not None:
        p = p.decimals(decimals)
    return p


def table(
    title: str, description: str, unit: str, queries: Sequence[Q], *, span: int = 24
) -> table_b.Panel:
    """An instant table of label sets (info metrics): one row per series, no value column."""
    return (
        table_b.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .targets(_targets(queries))
        .span(span)
        .height(6)
        .with_transformation(
            dashboard_m.DataTransformerConfig(
                id_val="organize",
                options={"excludeByName": {"Time": True, "Value": True, "__name__": True}},
            )
        )
    )


def heatmap(title: str, description: str, bucket_metric: str) -> heatmap_b.Panel:
    """A vLLM histogram as a heatmap: requests per second in each length bucket."""
    expr = f"sum by (le) ({rate(bucket_metric, base=VLLM)})"
    return (
        heatmap_b.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit("reqps")
        .targets(_targets([Q(expr, "{{le}}", fmt=prometheus_m.PromQueryFormat.HEATMAP)]))
        .span(12)
        .height(9)
        .calculate(False)
        .color(
            heatmap_b.HeatmapColorOptions()
            .mode(heatmap_m.HeatmapColorMode.SCHEME)
            .scheme("Oranges")
            .scale(heatmap_m.HeatmapColorScale.EXPONENTIAL)
            .exponent(0.5)
            .steps(64)
        )
        .y_axis(heatmap_b.YAxisConfig().unit("short").axis_label("tokens"))
        .cell_values(heatmap_b.CellValues().unit("reqps"))
        .rows_frame(heatmap_b.RowsHeatmapOptions().layout(common_m.HeatmapCellLayout.LE))
        .mode(common_m.TooltipDisplayMode.SINGLE)
        .show_color_scale(True)
    )


# --- variables and the dashboard frame ----------------------------------------------------


def _all() -> dashboard_m.VariableOption:
    return dashboard_m.VariableOption(selected=True, text=["All"], value=["$__all"])


def _label_variable(name: str, label: str, query: str, description: str) -> Builder[Any]:
    return (
        dashboard_b.QueryVariable(name)
        .label(label)
        .description(description)
        .datasource(DATASOURCE)
        .query({"query": query, "refId": f"{name}-values", "qryType": 1})
        .refresh(dashboard_m.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dashboard_m.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(_all())
    )


def variables() -> list[Builder[Any]]:
    return [
        dashboard_b.DatasourceVariable("datasource")
        .label("Data source")
        .description("The Prometheus that scrapes the kv-headroom sidecars and vLLM.")
        .type("prometheus"),
        _label_variable(
            "namespace",
            "Namespace",
            "label_values(kv_headroom_info, namespace)",
            "Kubernetes namespace; empty without Kubernetes service discovery, where All "
            "matches every series.",
        ),
        _label_variable(
            "model",
            "Model",
            'label_values(kv_headroom_info{namespace=~"$namespace"}, model)',
            "The model each sidecar reports (kv_headroom_info).",
        ),
        _label_variable(
            "pod",
            "Pod",
            'label_values(kv_headroom_info{namespace=~"$namespace", model=~"$model"}, pod)',
            "The vLLM pod (sidecar and vLLM share it); empty without Kubernetes service "
            "discovery, where All matches every series.",
        ),
    ]


def frame(title: str, uid: str, description: str) -> dashboard_b.Dashboard:
    return (
        dashboard_b.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags([TAG, "vllm"])
        .editable()
        .timezone("browser")
        .time("now-3h", "now")
        .refresh("30s")
        .tooltip(dashboard_m.DashboardCursorSync.CROSSHAIR)
        .variables(variables())
        .link(
            dashboard_b.DashboardLink("KV headroom")
            .type(dashboard_m.DashboardLinkType.DASHBOARDS)
            .tags([TAG])
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
        )
    )


# --- the four dashboards ------------------------------------------------------------------


def capacity() -> dashboard_m.Dashboard:
    per_model = (
        "sum by (model) ("
        + with_model(agg("sum", sel("kv_headroom_max_users", 'context="p95"')))
        + ")"
    )
    return (
        frame(
            "KV cache capacity",
            "kv-headroom-capacity",
            "How much KV cache each vLLM has and what it holds: GPU memory → ceiling → "
            "weights → overhead → KV budget → tokens → sequences → users, expected from the "
            "model and flags against what vLLM allocated.",
        )
        .with_row(dashboard_b.Row("Deployments"))
        .with_panel(
            table(
                "Deployments",
                "One row per sidecar: the model, attention kind, KV cache dtype, block size, "
                "tensor and pipeline parallel sizes and vLLM version it sees. A blank model "
                "or version means the sidecar could not read it: check its model.path and "
                "kv_headroom_source_up.",
                "short",
                [Q(INFO, "", instant=True, fmt=prometheus_m.PromQueryFormat.TABLE)],
                span=16,
            )
        )
        .with_panel(
            stat(
                "Concurrent users that fit per model (p95 context)",
                "Requests of today's p95 context that fit at once in the KV caches of all "
                "selected replicas of each model. When demand outgrows it, add replicas or "
                "memory (a larger GPU, more tensor parallelism, an fp8 KV cache).",
                "short",
                [Q(per_model, "{{model}}")],
                span=8,
                height=6,
            )
        )
        .with_row(dashboard_b.Row("Memory chain (per GPU)"))
        .with_panel(
            timeseries(
                "Memory chain per GPU",
                "Per GPU: the ceiling vLLM may use (total × gpu_memory_utilization), the "
                "weights, the activation/non-torch/CUDA-graph overhead, and the KV budget "
                "left for the cache, expected from the flags and observed from what vLLM "
                "allocated. Ceiling − weights − overhead ≈ KV budget. To grow the budget, "
                "raise gpu_memory_utilization, quantise weights or spread them wider (TP).",
                "bytes",
                [
                    Q(ours("max", "kv_headroom_memory_ceiling_bytes"), "{{target}} ceiling"),
                    Q(ours("max", "kv_headroom_weights_bytes"), "{{target}} weights"),
                    Q(ours("max", "kv_headroom_overhead_bytes"), "{{target}} overhead"),
                    *expected_and_observed("max", "kv_headroom_kv_budget_bytes", "KV budget "),
                ],
                span=16,
                height=9,
            )
        )
        .with_panel(
            timeseries(
                "KV bytes per token",
                "KV cache bytes one token of context costs on one GPU, all layers. It is set "
                "by the architecture (layers × KV heads × head size), the KV dtype and the "
                "tensor-parallel split; an fp8 KV cache halves it.",
                "bytes",
                [Q(ours("max", "kv_headroom_kv_bytes_per_token"))],
                span=8,
                height=9,
            )
        )
        .with_row(dashboard_b.Row("Capacity: expected vs observed"))
        .with_panel(
            timeseries(
                "KV capacity in tokens",
                "KV cache size in tokens as vLLM counts it (its 'KV cache size' line), "
                "summed over data-parallel engines: expected from model and flags, observed "
                "from vLLM. A gap means vLLM sized its cache differently than predicted; see "
                "budget drift.",
                "short",
                expected_and_observed("sum", "kv_headroom_kv_capacity_tokens"),
                span=8,
            )
        )
        .with_panel(
            timeseries(
                "KV capacity in blocks",
                "KV cache blocks (vLLM's num_gpu_blocks, one reserved), summed over "
                "data-parallel engines, expected vs observed.",
                "short",
                expected_and_observed("sum", "kv_headroom_kv_capacity_blocks"),
                span=8,
            )
        )
        .with_panel(
            timeseries(
                "Budget drift",
                "Observed ÷ expected KV blocks: 100 % means vLLM sized its cache as "
                "predicted. A step after a restart means a flag changed or the overhead "
                "grew (a new vLLM release, another process on the GPU): check the GPU "
                "memory dashboard and the deployed flags.",
                "percentunit",
                [Q(ours("max", "kv_headroom_budget_drift_ratio"))],
                span=8,
                min_val=None,
                thresholds=((None, "red"), (0.9, "green"), (1.1, "yellow")),
                threshold_style=common_m.GraphThresholdsStyleMode.DASHED,
            )
        )
        .with_row(dashboard_b.Row("What fits"))
        .with_panel(
            timeseries(
                "Sequences that fit, by context length",
                "Whole sequences the KV cache holds at once when each has the p50, p95 or "
                "p99 context of the requests that finished over the last window, or "
                "max_model_len (the worst case vLLM's own max concurrency reports).",
                "short",
                [
                    Q(
                        ours(
                            "sum",
                            "kv_headroom_max_sequences",
                            'context=~"p50|p95|p99|max_model_len"',
                            by=("context",),
                        ),
                        "{{target}} {{context}}",
                    )
                ],
                span=8,
            )
        )
        .with_panel(
            timeseries(
                "Concurrent users that fit",
                "Requests that fit at once at the p50, p95 and p99 context: sequences ÷ "
                "sequences per request (the n parameter). Compare with the concurrency your "
                "clients send; below it, requests queue or get preempted.",
                "short",
                [
                    Q(
                        ours(
                            "sum",
                            "kv_headroom_max_users",
                            'context=~"p50|p95|p99"',
                            by=("context",),
                        ),
                        "{{target}} {{context}}",
                    )
                ],
                span=8,
            )
        )
        .with_panel(
            timeseries(
                "max_num_seqs overcommit",
                "max_num_seqs ÷ the sequences that fit at the p95 context. Above 1 (the "
                "line) vLLM admits more sequences than its cache holds once they grow, and "
                "will preempt under full load: lower --max-num-seqs towards the "
                "recommendation, or add KV memory.",
                "short",
                [Q(ours("max", "kv_headroom_config_overcommit_ratio"))],
                span=8,
                thresholds=((None, "green"), (1, "red")),
                threshold_style=common_m.GraphThresholdsStyleMode.LINE,
            )
        )
        .with_panel(
            stat(
                "Recommended max_num_seqs",
                "The most sequences that fit at today's p95 context: set --max-num-seqs to "
                "this (per engine) to stop preemptions at the price of queueing, or keep "
                "a higher value and watch the preemption risk.",
                "short",
                [Q(ours("max", "kv_headroom_recommended_max_num_seqs"))],
                span=24,
                height=5,
                decimals=0,
            )
        )
        .build()
    )


def pressure() -> dashboard_m.Dashboard:
    exhaustion = (
        f"clamp_max({ours('min', 'kv_headroom_seconds_to_exhaustion')}, {EXHAUSTION_CLAMP_SECONDS})"
    )
    worst_exhaustion = (
        f"min(clamp_max(min by (job, instance) "
        f"({sel('kv_headroom_seconds_to_exhaustion')}), {EXHAUSTION_CLAMP_SECONDS}) "
        f"* on (job, instance) group_left () {INFO})"
    )
    worst_risk = (
        f"max(max by (job, instance) ({sel('kv_headroom_preemption_risk')}) "
        f"* on (job, instance) group_left () {INFO})"
    )
    not_growing = dashboard_m.RangeMap(
        options=dashboard_m.DashboardRangeMapOptions(
            from_val=EXHAUSTION_CLAMP_SECONDS,
            to=EXHAUSTION_CLAMP_SECONDS,
            result=dashboard_m.ValueMappingResult(text="> 1 h / not growing", color="green"),
        )
    )
    risk_steps = ((None, "green"), (ALERT_THRESHOLD, "red"))
    exhaustion_steps = ((None, "red"), (60, "orange"), (180, "green"))
    running = named(agg("sum", sel("vllm:num_requests_running", base=VLLM)))
    return (
        frame(
            "KV cache pressure",
            "kv-headroom-pressure",
            "Is a vLLM about to run out of KV cache and preempt? Usage against capacity, "
            "free room, the queue, the preemption-risk score and its alert threshold, and "
            "throughput against the running batch.",
        )
        .with_row(dashboard_b.Row("Risk"))
        .with_panel(
            stat(
                "Highest preemption risk",
                f"The highest preemption-risk score among the selected pods. Above "
                f"{ALERT_THRESHOLD} for {ALERT_FOR_SECONDS:g} s the shipped alert fires: the "
                f"risk panel shows which pod.",
                "short",
                [Q(worst_risk, "worst")],
                thresholds=risk_steps,
                decimals=2,
            )
        )
        .with_panel(
            stat(
                "Shortest time to exhaustion",
                "The soonest any selected pod runs out of free KV tokens at its last "
                "minute's growth. Shown as '> 1 h / not growing' when usage is flat or "
                "falling (the sidecar exports +Inf, clamped here to one hour).",
                "s",
                [Q(worst_exhaustion, "soonest")],
                thresholds=exhaustion_steps,
                mappings=(not_growing,),
            )
        )
        .with_panel(
            stat(
                "Preemptions in the range",
                "Preemptions across the selected pods over the dashboard's time range. "
                "Each one throws away a sequence's KV cache and recomputes it: wasted GPU "
                "time and a latency spike for that request.",
                "short",
                [
                    Q(
                        "sum("
                        + with_model(
                            agg(
                                "sum", f"increase({sel('kv_headroom_preemptions_total')}[$__range])"
                            )
                        )
                        + ")",
                        "preemptions",
                        instant=True,
                    )
                ],
                thresholds=((None, "green"), (1, "red")),
                decimals=0,
            )
        )
        .with_panel(
            stat(
                "Requests waiting",
                "Requests in vLLM's queue across the selected pods. A queue that persists "
                "while KV usage is high means the cache, not compute, limits throughput.",
                "short",
                [Q(f"sum({ours('sum', 'kv_headroom_requests_waiting')})", "waiting")],
                thresholds=((None, "green"), (1, "orange")),
                decimals=0,
            )
        )
        .with_panel(
            timeseries(
                "Preemption risk",
                f"Score 0–1 that vLLM preempts within about three minutes: forecast KV "
                f"level (trend and waiting prompts) against capacity, capped by what "
                f"max_num_seqs allows, and the running batch's overcommit. The line is the "
                f"alert threshold ({ALERT_THRESHOLD}). Above it: shed or reroute load, lower "
                f"--max-num-seqs, or add KV memory.",
                "short",
                [Q(ours("max", "kv_headroom_preemption_risk"))],
                max_val=1,
                thresholds=risk_steps,
                threshold_style=common_m.GraphThresholdsStyleMode.LINE,
            )
        )
        .with_panel(
            timeseries(
                "Time to KV exhaustion",
                "Free KV tokens ÷ the growth of used tokens over the last minute. The "
                "sidecar exports +Inf while usage is not growing; here that is clamped to "
                "one hour, so the top of the axis means 'not in sight'. Minutes or less "
                "means the cache fills before the running requests finish.",
                "s",
                [Q(exhaustion)],
                max_val=EXHAUSTION_CLAMP_SECONDS,
                thresholds=exhaustion_steps,
                threshold_style=common_m.GraphThresholdsStyleMode.DASHED,
            )
        )
        .with_panel(
            timeseries(
                "Running batch overcommit",
                "The tokens the running sequences are still expected to add ÷ the free KV "
                "tokens. Above 1 (the line) the batch in hand does not fit as it grows: vLLM "
                "will preempt unless requests finish early.",
                "short",
                [Q(ours("max", "kv_headroom_overcommit_ratio"))],
                thresholds=((None, "green"), (1, "red")),
                threshold_style=common_m.GraphThresholdsStyleMode.LINE,
            )
        )
        .with_panel(
            timeseries(
                "Preemptions per minute",
                "Preemptions vLLM reported, per minute (the sidecar's counter survives vLLM "
                "restarts). vLLM counts a preemption when the request runs again, so this "
                "lags the moment the cache ran out.",
                "short",
                [Q(named(with_model("60 * " + agg("sum", rate("kv_headroom_preemptions_total")))))],
            )
        )
        .with_row(dashboard_b.Row("KV cache"))
        .with_panel(
            timeseries(
                "KV cache usage",
                "Share of KV blocks held by live requests (vLLM's kv_cache_usage_perc; the "
                "worst data-parallel engine). vLLM is built to run its cache full, so a high "
                "value alone is fine: the danger is running out of room to grow — see the "
                "risk and overcommit panels.",
                "percentunit",
                [Q(ours("max", "kv_headroom_kv_usage_ratio"))],
                span=8,
                max_val=1,
            )
        )
        .with_panel(
            timeseries(
                "KV tokens: used, committed, capacity",
                "KV tokens held now, held plus what the running sequences are still expected "
                "to add, and the capacity. When 'used + committed' crosses the capacity, the "
                "running batch will not fit as it grows.",
                "short",
                [
                    Q(ours("sum", "kv_headroom_kv_used_tokens"), "{{target}} used"),
                    Q(
                        named(
                            with_model(
                                agg("sum", sel("kv_headroom_kv_used_tokens"))
                                + " + "
                                + agg("sum", sel("kv_headroom_committed_tokens"))
                            )
                        ),
                        "{{target}} used + committed",
                    ),
                    Q(
                        ours("sum", "kv_headroom_kv_capacity_tokens", 'source="observed"'),
                        "{{target}} capacity",
                    ),
                ],
                span=8,
            )
        )
        .with_panel(
            timeseries(
                "Free KV room",
                "KV tokens free now, and how many more sequences of today's p95 context "
                "still fit in them. Zero sequences at p95 means the next long request waits "
                "or displaces a running one.",
                "short",
                [
                    Q(ours("sum", "kv_headroom_kv_free_tokens"), "{{target}} free tokens"),
                    Q(
                        ours("sum", "kv_headroom_free_sequences", 'context="p95"'),
                        "{{target}} p95 sequences",
                    ),
                ],
                span=8,
                right_axis=(("B", "short"),),
            )
        )
        .with_row(dashboard_b.Row("Requests"))
        .with_panel(
            timeseries(
                "Requests running and waiting",
                "The running batch, the queue, and the part of the queue waiting for "
                "scheduling capacity (vLLM 0.20+). A growing queue with a full cache: add "
                "replicas or KV memory.",
                "short",
                [
                    Q(ours("sum", "kv_headroom_requests_running"), "{{target}} running"),
                    Q(ours("sum", "kv_headroom_requests_waiting"), "{{target}} waiting"),
                    Q(
                        ours("sum", "kv_headroom_requests_waiting_for_capacity"),
                        "{{target}} waiting for capacity",
                    ),
                ],
            )
        )
        .with_panel(
            timeseries(
                "Running requests vs what fits",
                "The running batch against the sequences that fit at the p50 and p95 "
                "context. Running above the p95 line is where preemptions start when long "
                "requests arrive together.",
                "short",
                [
                    Q(ours("sum", "kv_headroom_requests_running"), "{{target}} running"),
                    Q(
                        ours(
                            "sum",
                            "kv_headroom_max_sequences",
                            'context=~"p50|p95"',
                            by=("context",),
                        ),
                        "{{target}} fit at {{context}}",
                    ),
                ],
            )
        )
        .with_row(dashboard_b.Row("Throughput"))
        .with_panel(
            timeseries(
                "Requests per second vs running",
                "Requests vLLM finished per second (left axis) against its running batch "
                "(right axis). Flat throughput while the batch grows means each request "
                "takes longer: the server is saturated.",
                "reqps",
                [
                    Q(vllm_rate("vllm:request_success_total"), "{{target}} finished/s"),
                    Q(running, "{{target}} running"),
                ],
                right_axis=(("B", "short"),),
            )
        )
        .with_panel(
            timeseries(
                "Tokens per second vs running",
                "Prompt tokens prefilled and tokens generated per second (left axis) against "
                "the running batch (right axis). Generation per running request falling "
                "as the batch grows is the latency cost of a bigger batch.",
                "short",
                [
                    Q(vllm_rate("vllm:prompt_tokens_total"), "{{target}} prompt tokens/s"),
                    Q(
                        vllm_rate("vllm:generation_tokens_total"),
                        "{{target}} generated tokens/s",
                    ),
                    Q(running, "{{target}} running"),
                ],
                right_axis=(("C", "short"),),
            )
        )
        .build()
    )


def context_lengths() -> dashboard_m.Dashboard:
    return (
        frame(
            "Context lengths",
            "kv-headroom-context",
            "How long requests are — prompt, generation and both — since every capacity "
            "figure depends on it, and how much prefix caching and n > 1 change it.",
        )
        .with_row(dashboard_b.Row("Distributions"))
        .with_panel(
            heatmap(
                "Prompt length distribution",
                "Finished requests per second in each prompt-length bucket, from vLLM's "
                "request_prompt_tokens histogram. A band moving up means longer prompts: "
                "fewer sequences fit.",
                "vllm:request_prompt_tokens_bucket",
            )
        )
        .with_panel(
            heatmap(
                "Generation length distribution",
                "Finished requests per second in each generated-length bucket, from vLLM's "
                "request_generation_tokens histogram. Long generations grow the KV cache "
                "after admission, which is what preempts.",
                "vllm:request_generation_tokens_bucket",
            )
        )
        .with_row(dashboard_b.Row("Percentiles over the window"))
        .with_panel(
            timeseries(
                "Context length (prompt + generation) percentiles",
                "p50, p95 and p99 of prompt + generation tokens of the requests that "
                "finished over the sidecar's window (10 min by default). The capacity "
                "figures use these; a rising p95 shrinks what fits.",
                "short",
                [
                    Q(
                        ours(
                            "max",
                            "kv_headroom_context_tokens",
                            'percentile=~"p50|p95|p99"',
                            by=("percentile",),
                        ),
                        "{{target}} {{percentile}}",
                    ),
                    Q(ours("max", "kv_headroom_context_mean_tokens"), "{{target}} mean"),
                ],
                span=12,
            )
        )
        .with_panel(
            timeseries(
                "Prompt and generation p95",
                "p95 of prompt tokens and of generated tokens over the window. Which of the "
                "two moved tells whether inputs (RAG, chat history) or outputs (max_tokens) "
                "changed.",
                "short",
                [
                    Q(
                        ours("max", "kv_headroom_prompt_tokens", 'percentile="p95"'),
                        "{{target}} prompt p95",
                    ),
                    Q(
                        ours("max", "kv_headroom_generation_tokens", 'percentile="p95"'),
                        "{{target}} generation p95",
                    ),
                ],
                span=12,
            )
        )
        .with_row(dashboard_b.Row("What changes the footprint"))
        .with_panel(
            timeseries(
                "Sequences per request",
                "Mean n (parallel samples) per request over the window: each sequence holds "
                "its own KV cache, so users that fit = sequences that fit ÷ this.",
                "short",
                [Q(ours("max", "kv_headroom_sequences_per_request"))],
                span=6,
            )
        )
        .with_panel(
            timeseries(
                "Prefix cache hit ratio",
                "Share of prompt tokens served from vLLM's prefix cache over the window. "
                "Hits skip prefill; shared prefixes also share KV blocks between running "
                "requests. Zero with prompts that share a prefix: check "
                "--enable-prefix-caching and whether the shared part spans a whole block.",
                "percentunit",
                [Q(ours("avg", "kv_headroom_prefix_cache_hit_ratio"))],
                span=6,
                max_val=1,
            )
        )
        .with_panel(
            timeseries(
                "Extra sequences from prefix sharing",
                "How many more p95 sequences fit when the cached share of each prompt is "
                "shared rather than stored per request.",
                "short",
                [Q(ours("sum", "kv_headroom_prefix_cache_extra_sequences"))],
                span=6,
            )
        )
        .with_panel(
            timeseries(
                "Requests in the window",
                "Finished requests the percentiles are computed from. With only a handful, "
                "the percentiles (and every capacity figure at p95) are rough.",
                "short",
                [Q(ours("max", "kv_headroom_context_requests"))],
                span=6,
            )
        )
        .build()
    )


def gpu_memory() -> dashboard_m.Dashboard:
    def per_gpu(metric: str) -> str:
        return ours("max", metric, by=("gpu",))

    used_share = named(
        with_model(
            agg("max", sel("kv_headroom_gpu_memory_used_bytes"), "gpu")
            + " / "
            + agg("max", sel("kv_headroom_gpu_memory_total_bytes"), "gpu")
        )
    )
    return (
        frame(
            "GPU memory",
            "kv-headroom-gpu",
            "Memory on the GPUs each vLLM uses (NVML): total, used, and used by anything "
            "that is not this vLLM.",
        )
        .with_panel(
            timeseries(
                "GPU memory used vs total",
                "Per GPU: memory used by every process and the total, with vLLM's ceiling "
                "(total × gpu_memory_utilization). Used well above the ceiling means "
                "something else shares the GPU.",
                "bytes",
                [
                    Q(per_gpu("kv_headroom_gpu_memory_used_bytes"), "{{target}} GPU {{gpu}} used"),
                    Q(
                        per_gpu("kv_headroom_gpu_memory_total_bytes"),
                        "{{target}} GPU {{gpu}} total",
                    ),
                    Q(ours("max", "kv_headroom_memory_ceiling_bytes"), "{{target}} ceiling"),
                ],
                span=12,
                height=9,
            )
        )
        .with_panel(
            timeseries(
                "Foreign GPU memory",
                "Memory used beyond this vLLM's expected footprint (its ceiling plus CUDA "
                "context): another process, a leak, or a second model. vLLM's startup "
                "profile takes it from the KV cache, so a restart with it present shrinks "
                "the cache: find and move it, or lower gpu_memory_utilization to leave it "
                "room.",
                "bytes",
                [Q(per_gpu("kv_headroom_gpu_memory_foreign_bytes"), "{{target}} GPU {{gpu}}")],
                span=12,
                height=9,
                thresholds=((None, "green"), (1024**3, "orange")),
                threshold_style=common_m.GraphThresholdsStyleMode.DASHED,
            )
        )
        .with_panel(
            timeseries(
                "GPU memory used share",
                "Used ÷ total per GPU. vLLM pre-allocates its cache, so this sits near "
                "gpu_memory_utilization whatever the load; a rise above it is foreign "
                "memory, a fall means vLLM is down.",
                "percentunit",
                [Q(used_share, "{{target}} GPU {{gpu}}")],
                span=12,
                max_val=1,
            )
        )
        .with_panel(
            stat(
                "NVML source up",
                "1 when the sidecar read NVML at its last poll. At 0 the GPU panels are "
                "empty: the sidecar lacks the NVIDIA library, a GPU or permission (see its "
                "source_down log event). No data at all: NVML is disabled (nvml.enabled).",
                "short",
                [Q(ours("min", "kv_headroom_source_up", 'source="nvml"'))],
                span=12,
                height=8,
                thresholds=((None, "red"), (1, "green")),
                decimals=0,
            )
        )
        .with_panel(
            table(
                "GPUs",
                "The GPUs each vLLM uses: index, UUID and name as NVML reports them, with "
                "the model served. Use the UUID to find the GPU in the node's nvidia-smi.",
                "short",
                [
                    Q(
                        with_model(sel("kv_headroom_gpu_info")),
                        "",
                        instant=True,
                        fmt=prometheus_m.PromQueryFormat.TABLE,
                    )
                ],
            )
        )
        .build()
    )


def fleet_overview() -> dashboard_m.Dashboard:
    # Its own module (dashboards/fleet.py), built on the helpers above: imported late,
    # since it imports them from here (and reachable when this file runs as a script).
    if str(HERE.parent) not in sys.path:
        sys.path.insert(0, str(HERE.parent))
    from dashboards.fleet import fleet_overview as build

    return build()


DASHBOARDS = {
    "kv-cache-capacity.json": capacity,
    "kv-cache-pressure.json": pressure,
    "context-lengths.json": context_lengths,
    "gpu-memory.json": gpu_memory,
    "fleet-overview.json": fleet_overview,
}


# --- rendering ----------------------------------------------------------------------------


def _number_panels(board: dict[str, Any]) -> None:
    """Fixed ids in layout order: Grafana would otherwise assign them on every import."""
    for i, panel in enumerate(board.get("panels", []), start=1):
        panel["id"] = i


def render(build: Callable[[], dashboard_m.Dashboard]) -> str:
    board: dict[str, Any] = json.loads(json.dumps(build(), cls=JSONEncoder))
    _number_panels(board)
    return json.dumps(board, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def rendered() -> dict[str, str]:
    """Each dashboard file's name and its JSON text."""
    return {name: render(build) for name, build in DASHBOARDS.items()}


def _walk_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in panels:
        yield p
        yield from _walk_panels(p.get("panels", []))


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel of a dashboard (rows and what collapsed rows hold included)."""
    yield from _walk_panels(board.get("panels", []))


def panel_queries(folder: Path | None = None) -> list[tuple[str, str, str]]:
    """(dashboard title, panel title, expr) for every query of every panel.

    From the committed JSON in ``folder`` when given, else freshly generated."""
    if folder is None:
        boards = [json.loads(text) for text in rendered().values()]
    else:
        boards = [json.loads((folder / name).read_text()) for name in DASHBOARDS]
    return [
        (board["title"], p["title"], t["expr"])
        for board in boards
        for p in panels(board)
        for t in p.get("targets", [])
        if t.get("expr")
    ]


# What a Prometheus integration test puts in place of the dashboard's variables: every
# namespace, model and pod; the range and step Grafana would send on a short range.
SUBSTITUTIONS = {
    "namespace": ".*",
    "model": ".*",
    "pod": ".*",
    "datasource": "prometheus",
    "__rate_interval": "1m",
    "__interval": "15s",
    "__range": "1h",
}
_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")


def runnable(expr: str, substitutions: dict[str, str] | None = None) -> str:
    """``expr`` with the dashboard variables replaced, ready for Prometheus's API.

    Other ``$`` references (label_replace's ``$1``) are left as they are."""
    values = SUBSTITUTIONS | (substitutions or {})

    def replace(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        return values.get(name, m.group(0))

    return _VARIABLE.sub(replace, expr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if a committed file differs; write nothing"
    )
    parser.add_argument("--out", type=Path, default=HERE, help="folder of the JSON files")
    args = parser.parse_args(argv)
    stale = []
    for name, text in rendered().items():
        path: Path = args.out / name
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        stale.append(name)
        if not args.check:
            path.write_text(text)
    if args.check and stale:
        print(
            f"out of date: {', '.join(stale)}; run python dashboards/generate.py",
            file=sys.stderr,
        )
        return 1
    for name in stale:
        print(f"wrote {args.out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
