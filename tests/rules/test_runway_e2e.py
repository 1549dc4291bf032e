"""The capacity runway end to end, as a site gets it from its own history: six weeks of
sidecar series backfilled into a real Prometheus TSDB (promtool tsdb create-blocks-from
openmetrics), the recording rules computed over them (create-blocks-from rules, layer by
layer), Prometheus started on the result and the runway read over its HTTP API, as the
capacity dashboard reads it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from dashboards.capacity import FORECAST, RUNWAY_PANELS
from dashboards.generate import panel_queries, runnable
from tests.processes import Prometheus
from tests.rules.rulefiles import HISTORY_GROUP, RULE_FILES, records
from tests.rules.runway_backfill import HistoricalPrometheus, backfill
from tests.rules.runway_truths import Truth, linear_growth, step

TRUTHS = (
    linear_growth("growth-10d", 4, 10.0, seed=12),
    linear_growth("growth-20d", 8, 20.0, seed=15),
    Truth("step-10d-ago", 4, step(1.8, 3.0, -10), None, seed=23),
)
RECORDS = (
    "model:kv_headroom_runway_days",
    "model:kv_headroom_replicas_needed_in_30d:ceil",
    "model:kv_headroom_load:max1w",
    "model:kv_headroom_pods:capacity",
    "model:kv_headroom_replicas_needed:ceil",  # beside the one in 30 days on the dashboard
)
# Two hours back from the last whole hour: the blocks lie wholly in the past.
END = (int(time.time()) // 3600 - 2) * 3600


@pytest.fixture(scope="module", name="prom")
def _prom() -> Iterator[Prometheus]:
    assert Prometheus.available(), "prometheus is missing: install Debian's prometheus package"
    with HistoricalPrometheus() as prom:
        backfill(prom, TRUTHS, RULE_FILES, RECORDS, END)
        yield prom


def _at_end(prom: Prometheus, expr: str) -> dict[str, float]:
    result = prom.api("query", query=expr, time=str(END))["result"]
    return {r["metric"]["model"]: float(r["value"][1]) for r in result}


def test_the_runway_read_over_http_is_within_a_quarter_of_the_truth(prom: Prometheus) -> None:
    runway = _at_end(prom, "model:kv_headroom_runway_days")
    errors = {t.name: runway[t.name] / t.runway_days - 1 for t in TRUTHS if t.runway_days}
    assert all(abs(e) < 0.25 for e in errors.values()), errors


def test_a_stepped_load_has_no_runway_under_60_days(prom: Prometheus) -> None:
    assert _at_end(prom, "model:kv_headroom_runway_days <= 60").get("step-10d-ago") is None


def test_replicas_needed_in_30_days_hold_the_peak_then(prom: Prometheus) -> None:
    # 1.5 × the peak 30 days out, at least: for growth-10d, whose peak then is over its 4 pods.
    needed = _at_end(prom, "model:kv_headroom_replicas_needed_in_30d:ceil")
    assert needed["growth-10d"] >= 1.5 * 4


def test_the_dashboard_range_query_draws_weeks_of_daily_peaks(prom: Prometheus) -> None:
    # The capacity dashboard's weekly-peak line: a value every day of the last four weeks.
    data = prom.api(
        "query_range", query='model:kv_headroom_load:max1w{model="growth-10d"}',
        start=str(END - 28 * 86400), end=str(END), step="86400",
    )  # fmt: skip
    (series,) = data["result"]
    values = [float(v) for _, v in series["values"]]
    assert len(values) == 29
    assert values[-1] > values[0]


def test_every_query_of_the_dashboards_runway_row_answers_for_every_model(
    prom: Prometheus,
) -> None:
    queries = [(panel, expr) for _, panel, expr in panel_queries() if panel in RUNWAY_PANELS]
    assert len(queries) == 7
    answered = {
        (panel, expr): sorted({r["metric"].get("model") for r in prom.api(
            "query", query=runnable(expr), time=str(END))["result"]})
        for panel, expr in queries
    }  # fmt: skip
    growing = sorted(t.name for t in TRUTHS if t.runway_days)
    assert all(set(growing) <= set(models) for models in answered.values()), answered


def test_the_forecast_line_continues_past_the_end_of_the_data(prom: Prometheus) -> None:
    # A range reaching 10 days past the last sample, as the dashboard's now-8w to now+30d:
    # the line goes on, rising at the growth, toward the capacity.
    data = prom.api(
        "query_range", query=runnable(FORECAST, {"model": "growth-10d"}),
        start=str(END - 7 * 86400), end=str(END + 10 * 86400), step="86400",
    )  # fmt: skip
    (series,) = data["result"]
    days = {(int(t) - END) // 86400: float(v) for t, v in series["values"]}
    assert sorted(days) == list(range(-7, 11))
    assert days[10] > days[0] > days[-7]
    runway = _at_end(prom, "model:kv_headroom_runway_days")["growth-10d"]
    # It reaches the 4 pods where the runway says, to within its half-day steps.
    assert abs(days[0] + (4 - days[0]) / runway * 10 - days[10]) < 0.01


def test_every_record_of_the_history_group_answers_after_the_weeks_it_needs(
    prom: Prometheus,
) -> None:
    # The live-stack tests leave this group out (it needs weeks): here it has them. The
    # ceiling records nothing unless one is declared (test_runway.py declares one).
    names = [r.name for r in records() if r.group == HISTORY_GROUP]
    assert "model:kv_headroom_runway_days" in names
    empty = [
        n for n in names
        if n != "model:kv_headroom_pods:ceiling" and "growth-10d" not in _at_end(prom, n)
    ]  # fmt: skip
    assert not empty, f"records without data at the end of the backfilled weeks: {empty}"
