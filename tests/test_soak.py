"""The soak benchmark still runs: a short soak with a high fault rate survives every fault.
(Its figures — 100,000 polls, memory and descriptors — come from the full run.)"""

from __future__ import annotations

import json

import pytest

from benchmarks import soak


def test_a_short_soak_survives_every_fault_it_injects(capsys: pytest.CaptureFixture[str]) -> None:
    code = soak.main(
        ["--polls", "300", "--fault-rate", "0.2", "--scenario", "demo", "--output", "json"]
    )
    summary = json.loads(capsys.readouterr().out)
    assert summary["polls"] >= 300
    assert summary["faults_tried"] > 10
    assert summary["faults_survived"] == summary["faults_tried"], summary["failures"]
    assert summary["checkpoints"]["end"]["fds"] > 0
    assert code in (0, 1)  # memory checks mean little over 300 polls; faults are the point
