"""Panel builders shared by the dashboards: a query (``Q``), time series, stat, table and
heatmap panels with the house defaults (the datasource variable, units, thresholds)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dashboard_b
from grafana_foundation_sdk.builders import heatmap as heatmap_b
from grafana_foundation_sdk.builders import prometheus as prometheus_b
from grafana_foundation_sdk.builders import stat as stat_b
from grafana_foundation_sdk.builders import table as table_b
from grafana_foundation_sdk.builders import timeseries as timeseries_b
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.models import common as common_m
from grafana_foundation_sdk.models import dashboard as dashboard_m
from grafana_foundation_sdk.models import heatmap as heatmap_m
from grafana_foundation_sdk.models import prometheus as prometheus_m

from dashboards.lib.queries import VLLM, Q, rate

DATASOURCE = dashboard_m.DataSourceRef(type_val="prometheus", uid="${datasource}")


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
