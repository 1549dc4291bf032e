"""The frame every dashboard shares: the namespace, model and pod variables, the tag, the
time range and the links between the dashboards."""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.builders import dashboard as dashboard_b
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.models import dashboard as dashboard_m

from dashboards.lib.panels import DATASOURCE

TAG = "kv-headroom"


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
