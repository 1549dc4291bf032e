"""The fleet overview: the dashboard on-call opens first. Per model: its pods, their highest
preemption risk, the load headroom (how many times today's traffic they hold), what limits
them, and the replicas the current traffic needs; then the pods most at risk now.

Built with the helpers of ``dashboards/lib`` (registered in ``generate.py`` as
``fleet-overview.json``).
The fleet figures are computed from the sidecars' own series, scoped by the dashboard's
variables like every other panel, with the same arithmetic as the ``kv-headroom.traffic``
recording rules (rules/kv-headroom.rules.yml): a pod's load is the mean over its engines of
1 ÷ load_headroom_ratio, a model's the sum over its pods, and the replicas it needs
``ceil(TARGET_HEADROOM × load)``, at least one.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import table as table_b
from grafana_foundation_sdk.models import common as common_m
from grafana_foundation_sdk.models import dashboard as dashboard_m
from grafana_foundation_sdk.models import prometheus as prometheus_m

from dashboards.lib.frame import frame
from dashboards.lib.panels import DATASOURCE, _targets, stat, timeseries
from dashboards.lib.queries import INFO, Q, agg, named, sel, with_model
from exporter.risk.model import (
    ALERT_THRESHOLD,
    ALERT_USAGE,
    WARNING_CERTAIN,
    WARNING_THRESHOLD,
    WARNING_USAGE,
    WARNING_USAGE_WINDOW_SECONDS,
)

TARGET_HEADROOM = 1.5  # the recording rule model:kv_headroom_replicas_needed:ceil uses 1.5

RATIO = "kv_headroom_load_headroom_ratio"
RISK = "kv_headroom_preemption_risk"


def by_model(op: str, expr: str, *by: str) -> str:
    return f"{op} by ({', '.join(('model', *by))}) ({with_model(expr)})"


def pod_load() -> str:
    """Per target: the share of one pod's room its traffic uses (1 ÷ ratio, engines averaged)."""
    return agg("avg", f"1 / {sel(RATIO)}")


def model_load() -> str:
    return by_model("sum", pod_load())


def replicas_needed() -> str:
    return f"clamp_min(ceil({TARGET_HEADROOM:g} * {model_load()}), 1)"


def pods() -> str:
    return f"count by (model) ({INFO})"


def merged_table(
    title: str, description: str, queries: list[Q], names: dict[str, str], *, sort_by: str
) -> table_b.Panel:
    """An instant table, one row per label set, one column per query (merged)."""
    return (
        table_b.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit("short")
        .decimals(2)
        .targets(_targets(queries))
        .span(24)
        .height(7)
        .with_transformation(dashboard_m.DataTransformerConfig(id_val="merge", options={}))
        .with_transformation(
            dashboard_m.DataTransformerConfig(
                id_val="organize",
                options={"excludeByName": {"Time": True}, "renameByName": names},
            )
        )
        .with_transformation(
            dashboard_m.DataTransformerConfig(
                id_val="sortBy", options={"sort": [{"field": sort_by, "desc": True}]}
            )
        )
    )


def _instant(expr: str) -> Q:
    return Q(expr, "", instant=True, fmt=prometheus_m.PromQueryFormat.TABLE)


def fleet_overview() -> dashboard_m.Dashboard:
    resource = sel("kv_headroom_load_headroom_resource")
    return (
        frame(
            "Fleet overview",
            "kv-headroom-fleet",
            "Per model: pods, their highest preemption risk, how many times today's traffic "
            "they hold, what limits them, and the replicas the traffic needs; then the pods "
            "most at risk now. Open this first.",
        )
        .with_panel(
            merged_table(
                "Models",
                "One row per model, now. Pods: sidecars reporting. Highest risk: the worst "
                "pod's preemption risk (the warning's line is 0.5 once the cache has passed "
                f"{WARNING_USAGE:.0%}). Lowest headroom: the pod with the "
                "least room, in multiples of its traffic (below 1: it already gets more than "
                f"it holds). Load: pods' worth of traffic. Replicas needed: at a "
                f"{TARGET_HEADROOM:g} target headroom, as the autoscaling examples use it.",
                [
                    _instant(pods()),
                    _instant(by_model("max", agg("max", sel(RISK)))),
                    _instant(by_model("min", agg("min", sel(RATIO)))),
                    _instant(model_load()),
                    _instant(replicas_needed()),
                ],
                {
                    "Value #A": "pods",
                    "Value #B": "highest risk",
                    "Value #C": "lowest headroom (×traffic)",
                    "Value #D": "load (pods)",
                    "Value #E": "replicas needed",
                },
                sort_by="highest risk",
            )
        )
        .with_panel(
            timeseries(
                "Replicas needed vs pods",
                f"Per model: the replicas its current traffic needs at a "
                f"{TARGET_HEADROOM:g} target headroom, and the pods serving it. Needed above "
                "pods: scale out (or let the autoscaler); needed well below for an hour: "
                "scale in.",
                "short",
                [
                    Q(replicas_needed(), "{{model}} needed"),
                    Q(pods(), "{{model}} pods"),
                ],
                span=12,
            )
        )
        .with_panel(
            timeseries(
                "Load headroom per pod",
                "How many times its current traffic each pod holds before the KV cache would "
                "be expected to preempt or the batch fills max_num_seqs. Below 1 (the red "
                "line): the pod gets more than it holds — scale out, or fix what limits it "
                "(next panel).",
                "x",
                [Q(named(with_model(agg("min", sel(RATIO)))))],
                span=12,
                min_val=None,
                thresholds=((None, "red"), (1, "green")),
                threshold_style=common_m.GraphThresholdsStyleMode.LINE,
            )
        )
        .with_panel(
            timeseries(
                "What limits them",
                "Per model: engines whose headroom ends at the KV cache (more KV: fp8 KV "
                "cache, more memory, TP, or more pods) and at max_num_seqs (raise it if the "
                "cache holds that many sequences, else more pods).",
                "short",
                [Q(by_model("sum", resource, "resource"), "{{model}} {{resource}}")],
                span=12,
            )
        )
        .with_panel(
            timeseries(
                "Highest preemption risk per model",
                "The worst pod's preemption risk (0-1); VllmKvCachePreemptionLikely warns "
                f"above the orange line while the cache was over {WARNING_USAGE:.0%} full "
                f"within {WARNING_USAGE_WINDOW_SECONDS:g} s (or above {WARNING_CERTAIN}), "
                "VllmKvCachePreemptionImminent pages above the red one while the cache was "
                f"over {ALERT_USAGE:.0%} full within the last minute.",
                "percentunit",
                [Q(by_model("max", agg("max", sel(RISK))), "{{model}}")],
                span=12,
                max_val=1,
                thresholds=(
                    (None, "green"),
                    (WARNING_THRESHOLD, "orange"),
                    (ALERT_THRESHOLD, "red"),
                ),
                threshold_style=common_m.GraphThresholdsStyleMode.LINE,
            )
        )
        .with_panel(
            merged_table(
                "Pods most at risk now",
                "The ten pods with the highest preemption risk, with their load headroom. "
                "Open KV cache pressure for one of them to see why.",
                [
                    _instant(f"topk(10, {named(with_model(agg('max', sel(RISK))))})"),
                    _instant(named(with_model(agg("min", sel(RATIO))))),
                ],
                {"Value #A": "preemption risk", "Value #B": "load headroom (×traffic)"},
                sort_by="preemption risk",
            )
        )
        .with_panel(
            stat(
                "Fleet load headroom",
                "The lowest load headroom of any selected pod: how many times its traffic "
                "the tightest pod holds.",
                "x",
                [Q(f"min({with_model(agg('min', sel(RATIO)))})", "tightest pod")],
                span=24,
                height=4,
                thresholds=((None, "red"), (1, "orange"), (TARGET_HEADROOM, "green")),
                decimals=2,
            )
        )
        .build()
    )
