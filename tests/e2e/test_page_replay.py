"""The stack's page, read from the sidecar's own series as Prometheus reads the rule: its
usage gate is the sidecar's peak over the last minute of its polls (``usage_peak``, exported
as ``kv_headroom_kv_usage_max_1m_ratio``), so a batch finishing between samples does not
reset it.

The series is the sidecar's last 40 readings of stop 40's CI run on a real vLLM 0.32
(llama-gqa, risk at 0.9997-1.0, usage dipping from 0.87 to 0.43 whenever a batch finished),
in which the gate read sample by sample never held for 15 s and the page never fired."""

from __future__ import annotations

from collections.abc import Sequence

from exporter.risk.model import (
    ALERT_USAGE_WINDOW_SECONDS,
    WARNING_USAGE_WINDOW_SECONDS,
    Point,
    usage_peak,
)
from tests.e2e.stack import Gates, alert_fired_at


def gates(readings: Sequence[tuple[float, float, float]]) -> list[Gates]:
    """(time, risk, usage) polls as the sidecar exports them: each gate's usage peak."""
    polls: list[Point] = []
    out: list[Gates] = []
    for t, risk, usage in readings:
        polls.append(Point(t, usage, 1.0, 0.0, 0.0, 0.0, 0))
        page = usage_peak(polls, ALERT_USAGE_WINDOW_SECONDS)
        out.append((t, risk, page, usage_peak(polls, WARNING_USAGE_WINDOW_SECONDS)))
    return out


# (seconds, preemption_risk, kv_usage_ratio), one a second, from the CI log
USAGE = [
    0.723, 0.723, 0.787, 0.787, 0.809, 0.809, 0.426, 0.426, 0.660, 0.660, 0.681, 0.681, 0.681,
    0.723, 0.723, 0.681, 0.809, 0.809, 0.809, 0.809, 0.872, 0.872, 0.574, 0.574, 0.660, 0.660,
    0.574, 0.574, 0.702, 0.702, 0.702, 0.745, 0.723, 0.723, 0.957, 0.957, 0.851, 0.851, 0.681,
    0.681,
]  # fmt: skip
REAL = [(float(i), 0.9997, u) for i, u in enumerate(USAGE)]


def test_the_page_fires_through_the_dips_of_a_real_vllms_batches() -> None:
    # first above 0.8 at 4 s, held through the dips
    assert alert_fired_at(gates(REAL)) == 4.0 + 15.0


def test_the_page_waits_while_the_last_minute_never_filled_past_its_gate() -> None:
    low = [(t, risk, min(u, 0.79)) for t, risk, u in REAL]
    assert alert_fired_at(gates(low)) is None


def test_the_page_waits_while_the_score_is_below_its_threshold() -> None:
    assert alert_fired_at(gates([(t, 0.98, u) for t, _, u in REAL])) is None


def test_the_gate_forgets_a_peak_older_than_its_window() -> None:
    # Full once, then a minute and more at half: the gate closes 60 s after the peak.
    series = [(0.0, 1.0, 0.9)] + [(float(t), 1.0, 0.5) for t in range(1, 120)]
    assert alert_fired_at(gates(series)) == 15.0
    late = [(0.0, 0.0, 0.9)] + [(float(t), 1.0 if t >= 50 else 0.0, 0.5) for t in range(1, 120)]
    assert alert_fired_at(gates(late)) is None
