"""The shipped page and warning are the operating points the frontier chose (the model's
constants, which the benchmarks score), and the running-at-the-edge ticket reads the
model's own edge constants."""

from __future__ import annotations

import re

from exporter.metrics import USAGE_PEAK_PAGE, USAGE_PEAK_WARNING
from exporter.risk.model import (
    ALERT_FOR_SECONDS,
    ALERT_THRESHOLD,
    ALERT_USAGE,
    ALERT_USAGE_WINDOW_SECONDS,
    EDGE_FOR_SECONDS,
    EDGE_THRESHOLD,
    WARNING_CERTAIN,
    WARNING_FOR_SECONDS,
    WARNING_THRESHOLD,
    WARNING_USAGE,
    WARNING_USAGE_WINDOW_SECONDS,
    page_holds,
    warning_holds,
)
from tests.rules.rulefiles import Rule, alerts, seconds

ALERT = "VllmKvCachePreemptionImminent"
WARNING = "VllmKvCachePreemptionLikely"
NUMBER = r"([0-9.eE+-]+)"
# A usage gate: the sidecar's peak gauge, or Prometheus's own peak of the usage (a sidecar
# older than the gauge), each above the same line.
GATE = (
    rf"\(kv_headroom_(\w+)\s*>\s*{NUMBER}\s+or\s+"
    rf"max_over_time\(kv_headroom_kv_usage_ratio\[(\w+)\]\)\s*>\s*{NUMBER}\)"
)
EDGE = "VllmKvCacheRunningAtEdge"


def _rule(name: str = ALERT) -> Rule:
    (rule,) = [a for a in alerts() if a.name == name]
    return rule


def test_the_page_is_the_score_above_alert_threshold_and_the_windows_usage_above_alert_usage() -> (
    None
):
    m = re.fullmatch(
        rf"\s*kv_headroom_preemption_risk\s*>\s*{NUMBER}\s+and\s+{GATE}\s*", _rule().expr
    )
    assert m, f"unexpected expression: {_rule().expr!r}"
    assert float(m.group(1)) == ALERT_THRESHOLD
    assert m.group(2) == USAGE_PEAK_PAGE
    assert float(m.group(3)) == float(m.group(5)) == ALERT_USAGE
    assert seconds(m.group(4)) == ALERT_USAGE_WINDOW_SECONDS


def test_preemption_alert_for_is_alert_for_seconds() -> None:
    assert seconds(_rule().body["for"]) == ALERT_FOR_SECONDS


def test_the_warning_is_the_gated_score_or_a_near_certain_one_for_its_seconds() -> None:
    rule = _rule(WARNING)
    m = re.fullmatch(
        rf"\s*kv_headroom_preemption_risk\s*>\s*{NUMBER}\s+and\s+{GATE}\s+or\s+"
        rf"kv_headroom_preemption_risk\s*>\s*{NUMBER}\s*",
        rule.expr,
    )
    assert m, f"unexpected expression: {rule.expr!r}"
    assert float(m.group(1)) == WARNING_THRESHOLD
    assert m.group(2) == USAGE_PEAK_WARNING
    assert float(m.group(3)) == float(m.group(5)) == WARNING_USAGE
    assert seconds(m.group(4)) == WARNING_USAGE_WINDOW_SECONDS
    assert float(m.group(6)) == WARNING_CERTAIN
    assert seconds(rule.body["for"]) == WARNING_FOR_SECONDS


def test_the_warning_never_pages() -> None:
    assert _rule(WARNING).body["labels"]["severity"] == "warning"


def test_edge_ticket_threshold_is_edge_threshold() -> None:
    expr = _rule(EDGE).expr
    m = re.fullmatch(r"\s*kv_headroom_forecast_usage_ratio\s*>\s*([0-9.eE+-]+)\s*", expr)
    assert m, f"unexpected expression: {expr!r}"
    assert float(m.group(1)) == EDGE_THRESHOLD


def test_edge_ticket_for_is_edge_for_seconds() -> None:
    assert seconds(_rule(EDGE).body["for"]) == EDGE_FOR_SECONDS


def test_edge_ticket_is_a_ticket_not_a_page() -> None:
    # A server near full for hours without a forecast overflow is a working day's fix;
    # the page stays for the overflow.
    assert _rule(EDGE).body["labels"]["severity"] == "warning"


def test_durations_are_read_as_prometheus_writes_them() -> None:
    assert seconds("15s") == 15
    assert seconds("1m30s") == 90
    assert seconds("1d") == 86400


def test_the_page_holds_only_with_both_the_score_and_the_usage_peak_above_their_lines() -> None:
    assert page_holds(ALERT_THRESHOLD + 0.001, ALERT_USAGE + 0.01)
    assert not page_holds(ALERT_THRESHOLD + 0.001, ALERT_USAGE - 0.01)
    assert not page_holds(ALERT_THRESHOLD - 0.001, 1.0)
    assert not page_holds(1.0, None)


def test_the_warning_holds_on_the_gated_score_or_a_near_certain_one_alone() -> None:
    assert warning_holds(WARNING_THRESHOLD + 0.01, WARNING_USAGE + 0.01)
    assert not warning_holds(WARNING_THRESHOLD + 0.01, WARNING_USAGE - 0.01)
    assert warning_holds(WARNING_CERTAIN + 0.0001, None)
    assert not warning_holds(WARNING_THRESHOLD - 0.01, 1.0)
