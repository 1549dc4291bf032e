"""The shipped preemption alert is the one the risk model was calibrated for."""

from __future__ import annotations

import re

from exporter.risk.model import ALERT_FOR_SECONDS, ALERT_THRESHOLD
from tests.rules.rulefiles import Rule, alerts, seconds

ALERT = "VllmKvCachePreemptionImminent"


def _rule() -> Rule:
    (rule,) = [a for a in alerts() if a.name == ALERT]
    return rule


def test_preemption_alert_threshold_is_alert_threshold() -> None:
    m = re.fullmatch(r"\s*kv_headroom_preemption_risk\s*>\s*([0-9.eE+-]+)\s*", _rule().expr)
    assert m, f"unexpected expression: {_rule().expr!r}"
    assert float(m.group(1)) == ALERT_THRESHOLD


def test_preemption_alert_for_is_alert_for_seconds() -> None:
    assert seconds(_rule().body["for"]) == ALERT_FOR_SECONDS


def test_durations_are_read_as_prometheus_writes_them() -> None:
    assert seconds("15s") == 15
    assert seconds("1m30s") == 90
    assert seconds("1d") == 86400
