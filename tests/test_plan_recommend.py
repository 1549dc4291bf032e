"""``kv-headroom plan --traffic``'s recommendation: the fewest GPUs that hold a log."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import termios
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from exporter.capacity.arch import parse_config
from exporter.capacity.gpus import lookup_gpu
from exporter.capacity.plan import PlanRequest
from exporter.capacity.plan import plan as plan_request
from exporter.capacity.releases import release
from exporter.cli import main
from exporter.plan.recommend import Prefill
from exporter.plan.traffic import (
    DEFAULT_MAX_QUEUE_WAIT,
    engine_at,
    load_traffic,
    replay,
    split_traffic,
)
from tests.conftest import fixture_config
from tests.test_plan_traffic_cli import read_until_exit, write_ordinary_log

PLAN = ["plan", "--model", "Llama-3.1-8B-Instruct", "--gpu", "L4", "--max-model-len", "8192"]
COARSE = ["--traffic-precision", "0.2"]  # the multiples' search: a few probes, not a dozen


def write_log(folder: Path, prompt: int = 3000, rate: float = 4.0) -> Path:
    """A gateway's log (its own column names): 60 requests, ``rate`` a second. At 3k-token
    prompts, 4 a second, one L4 falls behind (its p95 queue wait passes 5 s)."""
    return write_ordinary_log(folder, prompt, rate)


def plan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    """``plan --output json`` without the what-if table (nine searches the recommendation
    does not need)."""
    code = main([*PLAN, *COARSE, *args, "--no-what-if", "--output", "json"])
    out, _ = capsys.readouterr()
    return code, json.loads(out)


def test_a_log_the_planned_deployment_does_not_hold_gets_one_that_does(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    log = str(write_log(tmp_path))
    code, doc = plan(capsys, "--traffic", log)
    assert code == 1
    assert doc["traffic"]["replay"]["held"] is False
    best = doc["recommendations"][0]
    assert best["replicas"] == 1
    # Planned as recommended, the same log holds at 1×, and the plan exits 0.
    flags = best["change"].split()
    code, again = plan(capsys, *flags, "--traffic", log, "--recommend-replays", "0")
    assert code == 0
    assert again["traffic"]["replay"]["held"] is True


def test_the_fewest_gpus_win_over_the_smaller_gpu(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    log = str(write_log(tmp_path))
    _, only_l4 = plan(capsys, "--traffic", log, "--recommend-gpus", "L4")
    _, with_h100 = plan(capsys, "--traffic", log, "--recommend-gpus", "L4,H100")
    # L4s alone need several; one H100 holds it, so the H100 is the answer.
    assert only_l4["recommendation_search"]["fewest_gpus"] > 1
    assert {r["gpu"] for r in only_l4["recommendations"]} == {"L4"}
    assert [r["gpus"] for r in with_h100["recommendations"]] == [1]
    assert with_h100["recommendations"][0]["gpu"] == "H100-80GB"


def test_every_recommendation_has_the_fewest_gpus_its_multiple_and_what_binds(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _, doc = plan(capsys, "--traffic", str(write_log(tmp_path)), "--recommend-gpus", "L4")
    recs = doc["recommendations"]
    fewest = doc["recommendation_search"]["fewest_gpus"]
    assert recs
    for r in recs:
        assert r["gpus"] == fewest == r["replicas"] * r["tensor_parallel_size"]
        assert r["max_multiplier"] >= 1
        assert r["binding_resource"] in ("kv_cache", "compute", "max_num_seqs")
        assert r["queue_wait_seconds"]["p95"] <= 5


def test_the_planned_deployment_that_holds_exits_0_beside_its_recommendation(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, doc = plan(capsys, "--traffic", str(write_log(tmp_path, prompt=600, rate=1.0)))
    assert code == 0
    assert doc["recommendations"][0]["gpus"] == 1


def test_the_table_lists_the_recommendation_before_the_what_ifs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main([*PLAN, *COARSE, "--traffic", str(write_log(tmp_path)), "--recommend-gpus", "L4"])
    out, _ = capsys.readouterr()
    assert code == 1
    section = out.split("\nRecommended: ", 1)[1].split("\n\n", 1)[0].splitlines()
    assert section[0].startswith("the fewest GPUs that hold this traffic (no preemption")
    assert section[1].split() == ["GPUs", "deployment", "blocks", "holds", "binding"]
    assert "--gpu L4" in section[2]
    assert section[-1].startswith("  (")
    assert "replayed" in section[-1]
    assert out.index("Recommended:") < out.index("What if")


def test_a_search_out_of_replays_says_so(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(
        [
            *PLAN,
            *COARSE,
            "--traffic",
            str(write_log(tmp_path)),
            "--recommend-gpus",
            "L4",
            "--recommend-replays",
            "1",
        ]
    )
    out, _ = capsys.readouterr()
    assert code == 1
    assert "Recommended: no deployment found" in out
    assert "(raise --recommend-replays)" in out


def test_the_recommendation_comes_without_the_what_ifs_and_goes_with_no_replays(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    log = str(write_log(tmp_path))
    _, doc = plan(capsys, "--traffic", log, "--recommend-gpus", "L4")
    assert doc["what_if"] == []  # --no-what-if
    assert doc["recommendations"]
    _, doc = plan(capsys, "--traffic", log, "--recommend-replays", "0")
    assert "recommendations" not in doc


def test_a_deployment_that_would_not_start_still_gets_one_that_holds(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # 72B of bf16 weights do not load on one H100: no replay as planned, but a recommendation.
    code = main(
        [
            "plan",
            "--model",
            "Qwen/Qwen2.5-72B-Instruct",
            "--max-model-len",
            "8192",
            *COARSE,
            "--traffic",
            str(write_log(tmp_path, prompt=600, rate=1.0)),
            "--recommend-gpus",
            "H100",
            "--output",
            "json",
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert code == 1
    assert "traffic" not in doc
    assert doc["recommendations"][0]["gpus"] >= 2
    assert doc["recommendations"][0]["gpu"] == "H100-80GB"


def test_the_search_shows_on_the_same_progress_line(tmp_path: Path) -> None:
    leader, follower = pty.openpty()
    termios.tcsetwinsize(follower, (24, 300))
    command = [sys.executable, "-m", "exporter", *PLAN, *COARSE]
    log = write_log(tmp_path)
    proc = subprocess.Popen(
        [*command, "--traffic", str(log), "--recommend-gpus", "L4"],
        stdout=subprocess.PIPE,
        stderr=follower,
    )
    os.close(follower)
    try:
        shown = read_until_exit(leader, proc, timeout=120).decode()
        proc.communicate(timeout=120)
    finally:
        os.close(leader)
    assert proc.returncode == 1
    assert shown.count("\n") == 1
    assert any(r.startswith("recommending: ") for r in shown.split("\r"))


def test_what_the_prefill_bound_rules_out_fails_its_replay(tmp_path: Path) -> None:
    traffic, scenario = load_traffic(str(write_log(tmp_path)))
    arch = parse_config(fixture_config("meta-llama__Llama-3.1-8B-Instruct"), "llama")
    request = PlanRequest(arch, "llama", lookup_gpu("L4"), release("0.32.0"), max_model_len=8192)
    prefill = Prefill(traffic, DEFAULT_MAX_QUEUE_WAIT, 8192)
    ruled_out = 0
    for tp, replicas in [(1, 1), (1, 2), (2, 1), (1, 3), (2, 2), (4, 1)]:
        config = engine_at(plan_request(replace(request, tensor_parallel_size=tp)), scenario)
        if prefill.fails(config, replicas):
            ruled_out += 1
            shares = split_traffic(traffic, replicas)
            assert not all(replay(s, config, 1.0).held for s in shares)
    assert ruled_out >= 2


def test_parallel_probes_find_the_same_deployments_each_to_the_precision(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Near its threshold a multiple's verdict is not strictly monotone (traffic-headroom.md),
    # so the brackets of a 3-wide and a 1-wide search need not overlap at this precision.
    log = str(write_log(tmp_path))
    runs = []
    for jobs in ("1", "3"):
        _, doc = plan(capsys, "--traffic", log, "--recommend-gpus", "L4", "--traffic-jobs", jobs)
        runs.append(doc["recommendations"])
    one, three = runs
    assert [r["change"] for r in one] == [r["change"] for r in three]
    for r in three:
        assert r["max_multiplier"] >= 1
        assert r["failed_multiplier"] / r["max_multiplier"] - 1 <= 0.2 + 1e-9
