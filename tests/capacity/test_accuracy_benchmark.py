"""benchmarks/plan_accuracy.py reports the out-of-family error next to the other predictors."""

from __future__ import annotations

import json

import pytest

from benchmarks import plan_accuracy


def test_accuracy_report_has_a_leave_one_family_out_predictor(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert plan_accuracy.main(["--output", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["summary"]) == {"shipped", "held-out", "lofo", "naive"}
    assert len(doc["families"]) >= 3
    assert all("lofo_err_pct" in row for row in doc["rows"])


def test_out_of_family_median_error_beats_the_naive_budget(
    capsys: pytest.CaptureFixture[str],
) -> None:
    plan_accuracy.main(["--output", "json"])
    summary = json.loads(capsys.readouterr().out)["summary"]
    assert summary["lofo"]["median_abs_error_pct"] < summary["naive"]["median_abs_error_pct"]
