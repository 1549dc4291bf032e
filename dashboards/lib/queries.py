"""PromQL builders shared by the dashboards: selectors, aggregations, the join that gives
the sidecar's series their ``model`` label, and rates.

Every selector carries ``namespace=~"$namespace", pod=~"$pod"``; the sidecar's series are
joined with ``kv_headroom_info{model=~"$model"}`` on ``(job, instance)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from grafana_foundation_sdk.models import prometheus as prometheus_m


@dataclass(frozen=True)
class Q:
    """One query of a panel."""

    expr: str
    legend: str = "{{target}}"
    instant: bool = False
    fmt: prometheus_m.PromQueryFormat = prometheus_m.PromQueryFormat.TIME_SERIES


POD = 'namespace=~"$namespace", pod=~"$pod"'
INFO = f'kv_headroom_info{{{POD}, model=~"$model"}}'
# vLLM's model_name is the served name, by default the path vLLM was given, while the
# sidecar's model is the model directory's (or hub repo's) name: allow a leading path.
VLLM = f'{POD}, model_name=~"(.*/)?$model"'
# Per-model records (model:kv_headroom_*) carry model and nothing of the target: only the
# model variable applies.
RUNWAY_MODEL = 'model=~"$model"'
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
