"""The plain PromQL rules the frontier scores are evaluated as Prometheus evaluates them:
``predict_linear`` against promtool's own evaluation of the same samples, and every rule's
expression is one Prometheus loads."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from benchmarks import frontier_rules, fuzz_frontier
from benchmarks.alert_scoring import max_over_time, score_and_usage_peak
from exporter.replay import Tick
from exporter.risk.model import page_holds
from tests.rules.test_promtool import promtool

# A cache filling with noise, then levelling off: 36 samples 2 s apart.
USAGE = [
    0.1, 0.12, 0.15, 0.13, 0.2, 0.22, 0.3, 0.28, 0.35, 0.4, 0.38, 0.45, 0.5, 0.55, 0.53, 0.6,
    0.62, 0.7, 0.66, 0.72, 0.8, 0.78, 0.85, 0.83, 0.9, 0.88, 0.91, 0.95, 0.93, 0.97, 0.99,
    0.98, 1.0, 0.97, 0.96, 0.94,
]  # fmt: skip


def _ticks(values: list[float], step: float = 2.0) -> list[Tick]:
    return [
        Tick(
            t=step * i, usage=v, preemptions_counted=0.0, preempted=0, running=0.0,
            waiting=0.0, preemption_risk=0.0, seconds_to_exhaustion=0.0, overcommit_ratio=0.0,
        )
        for i, v in enumerate(values)
    ]  # fmt: skip


def promtool_values(
    tmp_path: Path, values: list[float], cases: list[dict[str, Any]]
) -> list[float]:
    """What promtool evaluates for each case on the series ``u`` (2 s apart): every case
    expects -1, which none reads, so promtool fails it and prints the value it got."""
    (tmp_path / "none.yml").write_text("groups: []\n")
    (tmp_path / "t.yml").write_text(
        yaml.safe_dump(
            {
                "rule_files": ["none.yml"],
                "evaluation_interval": "2s",
                "tests": [
                    {
                        "interval": "2s",
                        "input_series": [
                            {"series": "u", "values": " ".join(repr(v) for v in values)}
                        ],
                        "promql_expr_test": cases,
                    }
                ],
            }
        )
    )
    result = promtool("test", "rules", tmp_path / "t.yml")
    return [float(v) for v in re.findall(r"got: \{\} (\S+)", result.stdout + result.stderr)]


def _case(expr: str, at: float) -> dict[str, Any]:
    """A promtool case at ``at`` seconds that expects -1, which no series here reads, so
    promtool prints the value it got (compared by the caller)."""
    return {"expr": expr, "eval_time": f"{at:g}s", "exp_samples": [{"labels": "{}", "value": -1}]}


def test_predict_linear_gives_what_prometheus_evaluates(tmp_path: Path) -> None:
    ticks = _ticks(USAGE)
    cases, expected = [], []
    # Windows whose left edge never lands on a sample: Prometheus 3 leaves a sample exactly
    # a window old out (the benchmark does, as today's Prometheus), the 2.x promtool of CI's
    # Debian keeps it in; off the edge the two agree.
    for window, horizon in ((59.0, 60.0), (59.0, 180.0), (119.0, 120.0), (21.0, 30.0)):
        line = frontier_rules.predict_linear(ticks, window, horizon)
        # Early (less history than the window), a window's edge on a sample, the last poll.
        for i in (3, 10, 25, 30, 35):
            # promtool compares exactly and prints what it got: each case expects -1 (no
            # line reads that here) and the values it prints are compared to 1e-9.
            cases.append(_case(f"predict_linear(u[{window:g}s], {horizon:g})", ticks[i].t))
            expected.append(line[i])
    got = promtool_values(tmp_path, USAGE, cases)
    assert len(got) == len(expected), got
    assert got == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_max_over_time_gives_what_prometheus_evaluates(tmp_path: Path) -> None:
    # The usage falling back between batches, as a real vLLM's does: the peak is held.
    values = [0.7, 0.4, 0.8, 0.5, 0.45, 0.42, 0.41, 0.9, 0.3, 0.2, 0.25, 0.1, 0.15, 0.12]
    ticks = _ticks(values)
    cases, expected = [], []
    for window in (5.0, 9.0, 13.0):  # off the samples' 2 s grid, as above
        peak = max_over_time(ticks, window)
        for i in range(len(values)):
            cases.append(_case(f"max_over_time(u[{window:g}s])", ticks[i].t))
            expected.append(peak[i])
    got = promtool_values(tmp_path, values, cases)
    assert len(got) == len(expected), got
    assert got == expected


def test_predict_linear_says_nothing_from_one_sample() -> None:
    assert str(frontier_rules.predict_linear(_ticks([0.5, 0.6]), 60.0, 60.0)[0]) == "nan"


def test_every_plain_rule_is_promql_prometheus_loads(tmp_path: Path) -> None:
    rules = []
    for k, rule in enumerate(frontier_rules.plain()):
        expr, held = re.fullmatch(r"(.*) for (\w+)", rule.expr).groups()  # type: ignore[union-attr]
        rules.append({"alert": f"Plain{k}", "expr": expr, "for": held})
    path = tmp_path / "plain.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "plain", "rules": rules}]}))
    result = promtool("check", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_preemption_rate_rule_fires_only_above_one_a_second() -> None:
    ticks = _ticks([0.9] * 200)
    counted = [0.0] * 50 + [float(2 * k) for k in range(150)]  # 1 a second from t = 100 s
    at_one = [replace(t, preemptions_counted=c) for t, c in zip(ticks, counted, strict=True)]
    at_two = [replace(t, preemptions_counted=2 * c) for t, c in zip(ticks, counted, strict=True)]
    rule = next(r for r in frontier_rules.plain() if r.name == "llm-d HighPreemptions")
    assert not any(rule.condition(at_one, i) for i in range(len(at_one)))
    assert rule.condition(at_two, len(at_two) - 1)


def _risky(usages: list[float]) -> list[Tick]:
    return [replace(t, preemption_risk=1.0) for t in _ticks(usages)]


def test_the_page_scraped_every_poll_reads_as_the_page_itself() -> None:
    ticks = _risky([0.5, 0.9, 0.4, 0.5, 0.85, 0.3] * 10)
    every_poll = fuzz_frontier.scraped_score_and_usage_peak(0.99, 0.8, 60.0, 2.0)
    page = score_and_usage_peak(0.99, 0.8, 60.0)
    assert [every_poll(ticks, i) for i in range(len(ticks))] == [
        page(ticks, i) for i in range(len(ticks))
    ]


def test_a_usage_peak_between_two_scrapes_is_not_seen_by_the_scraped_page() -> None:
    # Polls every 2 s; the usage passes 0.8 only at t = 8 s, between the 0- and 15-s scrapes.
    ticks = _risky([0.5, 0.5, 0.5, 0.5, 0.9, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5])
    scraped = fuzz_frontier.scraped_score_and_usage_peak(0.99, 0.8, 60.0, 15.0)
    page = score_and_usage_peak(0.99, 0.8, 60.0)
    assert page(ticks, len(ticks) - 1)
    assert not any(scraped(ticks, i) for i in range(len(ticks)))


def test_the_shipped_page_at_15_s_scrapes_sees_a_peak_between_them_through_the_gauge() -> None:
    # The same polls: the sidecar's own peak over its 2-s polls carries the 0.9 of t = 8 s
    # to the 15-s scrape, where Prometheus's peak of its samples had only 0.5s.
    ticks = _risky([0.5, 0.5, 0.5, 0.5, 0.9, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5])
    scraped = fuzz_frontier.scraped_shipped(page_holds, 60.0, 15.0)
    assert not scraped(ticks, 6)  # the 0-s scrape: before the peak
    assert scraped(ticks, len(ticks) - 1)  # the 15-s scrape (t = 16 s poll) holds it


def test_the_gated_warning_or_a_near_certain_score_passes_its_gate_only_when_near_certain() -> None:
    name = "risk > 0.5 and max_over_time(usage[30s]) > 0.7 or risk > 0.999"
    rule = next(r for r in fuzz_frontier.sidecar_rules() if r.name == name)
    low = _ticks([0.3] * 20)  # the cache never near the gate
    sure = [replace(t, preemption_risk=1.0) for t in low]
    likely = [replace(t, preemption_risk=0.99) for t in low]
    gated = score_and_usage_peak(0.5, 0.7, 30.0)
    assert rule.condition(sure, 19)
    assert not gated(sure, 19)
    assert not rule.condition(likely, 19)
    filling = [replace(t, preemption_risk=0.6) for t in _ticks([0.3] * 10 + [0.75] + [0.3] * 9)]
    assert rule.condition(filling, 19)  # the gate's 30 s still hold the 0.75 of t = 20 s


def test_a_false_alarm_interval_is_the_figure_itself_when_every_safe_hour_agrees() -> None:
    assert fuzz_frontier.false_alarm_interval([(1.0, 1.0)] * 10) == (1.0, 1.0)
    assert fuzz_frontier.false_alarm_interval([]) is None


def test_a_false_alarm_interval_widens_around_one_loud_hour_and_draws_alike_each_time() -> None:
    per_run = [(0.5, 1.0)] * 58 + [(20.8, 1.0)]
    low, high = fuzz_frontier.false_alarm_interval(per_run) or (0.0, 0.0)
    rate = sum(m for m, _ in per_run) / len(per_run)
    assert low < rate < high
    assert low >= 0.5
    assert fuzz_frontier.false_alarm_interval(per_run) == (low, high)
