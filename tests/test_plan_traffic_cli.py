"""``kv-headroom plan --traffic`` as a user runs it: the figures, the JSON, the errors."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import termios
import time
from dataclasses import replace
from pathlib import Path

import pytest

from exporter.capacity.arch import parse_config
from exporter.capacity.gpus import lookup_gpu
from exporter.capacity.plan import PlanRequest, plan
from exporter.capacity.releases import release
from exporter.cli import main
from exporter.plan.cli import what_if_guess
from exporter.plan.traffic import Headroom, Limit, Outcome
from tests.conftest import fixture_config

PLAN = ["plan", "--model", "Llama-3.1-8B-Instruct", "--gpu", "L4", "--max-model-len", "8192"]


def write_log(folder: Path, rate: float = 1.0, seconds: int = 60) -> Path:
    """A CSV log in its own column names: ``rate`` requests a second of chat-sized work."""
    rows = ["ts_ms,in,out"]
    n = int(rate * seconds)
    for i in range(n):
        rows.append(f"{int(i * 1000 / rate)},{600 + 37 * (i % 11)},{120 + 13 * (i % 7)}")
    path = folder / "chat.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def write_ordinary_log(folder: Path, prompt: int = 600, rate: float = 1.0) -> Path:
    """A log as a gateway writes it: seconds, and OpenAI's usage names."""
    rows = ["timestamp,prompt_tokens,output_tokens"]
    rows += [f"{i / rate:.3f},{prompt + 37 * (i % 11)},{120 + 13 * (i % 7)}" for i in range(60)]
    path = folder / "gateway.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main([*PLAN, *args])
    out, err = capsys.readouterr()
    return code, out, err


LOG_FLAGS = ["--traffic-columns", "time=ts_ms,prompt=in,output=out", "--traffic-time-unit", "ms"]


def test_json_carries_the_replay_and_the_largest_multiple_held(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    log = write_log(tmp_path)
    code, out, _ = run(
        capsys, "--traffic", str(log), *LOG_FLAGS, "--no-what-if", "--output", "json"
    )
    doc = json.loads(out)["traffic"]
    assert code == 0
    assert doc["requests"] == 60
    assert set(doc["replay"]["queue_wait_seconds"]) == {"p50", "p95", "p99"}
    for key in ("peak_kv_usage", "p95_kv_usage", "preemptions", "binding_resource"):
        assert key in doc["replay"]
    assert doc["max_multiplier"] > 1
    assert doc["failed_multiplier"] / doc["max_multiplier"] - 1 == pytest.approx(
        doc["precision"], abs=1e-3
    )


def test_each_what_if_gains_the_multiple_it_holds(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    log = write_log(tmp_path)
    _, out, _ = run(capsys, "--traffic", str(log), *LOG_FLAGS, "--output", "json")
    doc = json.loads(out)
    fp8 = next(w for w in doc["what_if"] if w["change"].startswith("FP8"))
    # Twice the blocks on the same traffic: at least as much traffic held.
    assert fp8["traffic"]["max_multiplier"] >= doc["traffic"]["max_multiplier"]


def test_the_batch_cap_and_gpu_what_ifs_carry_the_multiple_held_too(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    log = write_log(tmp_path, rate=2.0)
    _, out, _ = run(
        capsys, "--traffic", str(log), *LOG_FLAGS, "--max-num-seqs", "4", "--output", "json"
    )
    rows = {w["change"]: w for w in json.loads(out)["what_if"]}
    held = {change: rows[change]["traffic"]["max_multiplier"] for change in rows}
    # Four sequences at a time bind this traffic: half the cap holds less, twice more.
    assert held["--max-num-seqs 2"] < held["--max-num-seqs 8"]
    assert held["--gpu L40S"] > 0  # one memory class up: on the same traffic


def test_every_what_if_row_of_the_table_shows_the_traffic_held(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    log = write_log(tmp_path)
    _, out, _ = run(capsys, "--traffic", str(log), *LOG_FLAGS)
    rows = out.split("What if\n", 1)[1].splitlines()
    assert [r.split("  ")[1] for r in rows if r.split()[0] in ("--max-num-seqs", "--gpu")] == [
        "--max-num-seqs 128",
        "--max-num-seqs 512",
        "--gpu L40S",
    ]
    assert all(re.search(r"[×] ?[\d.]+ traffic", r) for r in rows if "would not start" not in r)


def test_table_says_what_the_deployment_holds(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    log = write_log(tmp_path)
    code, out, _ = run(capsys, "--traffic", str(log), *LOG_FLAGS, "--no-what-if")
    assert code == 0
    assert "holds                   ×" in out
    assert "queue wait              p50" in out


def test_a_log_with_usual_column_names_plans_as_it_is(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    log = write_ordinary_log(tmp_path)
    code, out, _ = run(capsys, "--traffic", str(log), "--no-what-if", "--output", "json")
    assert code == 0
    assert json.loads(out)["traffic"]["requests"] == 60


def test_traffic_the_deployment_does_not_hold_at_1x_exits_1_after_the_report(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # 60 prompts of 6k tokens a second: more prefill than an L4 computes in a second.
    log = write_ordinary_log(tmp_path, prompt=6000, rate=60.0)
    code, out, _ = run(capsys, "--traffic", str(log), "--no-what-if", "--output", "json")
    doc = json.loads(out)["traffic"]
    assert code == 1
    assert doc["replay"]["held"] is False
    assert doc["max_multiplier"] < 1


def plan_cli(log: Path) -> list[str]:
    return [sys.executable, "-m", "exporter", *PLAN, "--traffic", str(log), "--no-what-if"]


def test_no_progress_is_written_when_stderr_is_a_pipe(tmp_path: Path) -> None:
    proc = subprocess.run(
        plan_cli(write_ordinary_log(tmp_path)),
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 0
    assert proc.stderr == ""


def read_until_exit(fd: int, proc: subprocess.Popen[bytes], timeout: float) -> bytes:
    """All a process writes to a pty until it exits (read as it comes: a full pty blocks
    its writer)."""
    got, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # Linux: EIO once the last writer has closed
                break
            if not chunk:
                break
            got += chunk
        elif proc.poll() is not None:
            break
    return got


def test_progress_on_a_terminal_is_one_line_redrawn_in_place(tmp_path: Path) -> None:
    leader, follower = pty.openpty()
    termios.tcsetwinsize(follower, (24, 300))  # wide enough for the temporary path
    proc = subprocess.Popen(
        plan_cli(write_ordinary_log(tmp_path)), stdout=subprocess.PIPE, stderr=follower
    )
    os.close(follower)
    try:
        shown = read_until_exit(leader, proc, timeout=120).decode()
        proc.communicate(timeout=120)
    finally:
        os.close(leader)
    assert proc.returncode == 0
    redraws = shown.split("\r")
    assert shown.count("\n") == 1  # the terminal's own line ending is "\r\n"
    assert shown.endswith("\r\n")
    assert len(redraws) > 3  # the line moved: several states were drawn over each other
    assert redraws[1].startswith("replaying 60 requests over 1.0 min from ")
    assert re.fullmatch(r"60 requests from \S+ replayed in [\d.]+ s\x1b\[K", redraws[-2])


def test_a_tighter_queue_bound_holds_less_traffic(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Four sequences at a time: the queue, not the cache, limits this deployment.
    log = write_log(tmp_path, rate=2.0)
    held = []
    for bound in ("30s", "200ms"):
        _, out, _ = run(
            capsys,
            "--traffic",
            str(log),
            *LOG_FLAGS,
            "--no-what-if",
            "--max-num-seqs",
            "4",
            "--max-queue-wait",
            bound,
            "--output",
            "json",
        )
        held.append(json.loads(out)["traffic"]["max_multiplier"])
    assert held[1] < held[0]


def test_a_scenario_is_traffic_too(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "--max-num-seqs",
        "12",
        "--traffic",
        "steady-full",
        "--no-what-if",
        "--recommend-replays",
        "0",
        "--output",
        "json",
    )
    doc = json.loads(out)["traffic"]
    # At 1× it queues past 5 s behind the cap of 12: not held. (At 20 the L4's KV cache,
    # with 0.20+'s CUDA-graph estimate taken out, binds first.)
    assert code == 1
    assert doc["binding_resource"] == "max_num_seqs"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--traffic-columns", "when=ts"], "--traffic-columns = 'when=ts'"),
        (["--traffic-columns", "prompt=in,output=out"], "has no column 'timestamp'"),
        (
            [],
            "its columns: ts_ms, in, out; map them with "
            "--traffic-columns time=COLUMN,prompt=COLUMN,output=COLUMN",
        ),
        (["--traffic-precision", "0"], "--traffic-precision = 0.0"),
    ],
)
def test_bad_traffic_input_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], message: str
) -> None:
    log = write_log(tmp_path)
    code, out, err = run(capsys, "--traffic", str(log), *args)
    assert code == 2
    assert out == ""
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_a_missing_log_exits_2_naming_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run(capsys, "--traffic", str(tmp_path / "nope.jsonl"))
    assert code == 2
    assert "nope.jsonl" in err
    assert "cannot be read" in err


def test_parallel_probes_bracket_the_same_threshold(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    log = write_log(tmp_path, rate=2.0)
    brackets = []
    for jobs in ("1", "3"):
        _, out, _ = run(
            capsys,
            "--traffic",
            str(log),
            *LOG_FLAGS,
            "--no-what-if",
            "--traffic-jobs",
            jobs,
            "--output",
            "json",
        )
        doc = json.loads(out)["traffic"]
        brackets.append((doc["max_multiplier"], doc["failed_multiplier"]))
    (h1, f1), (h2, f2) = brackets
    assert h1 < f2
    assert h2 < f1


def failed_on(m: float, preemptions: int, waits: dict[str, float]) -> Outcome:
    return Outcome(m, 0, preemptions, None, 0.0, 0.0, {"p95": 0.0}, waits, 0.0, 0.0, True, False)


def test_a_what_if_search_starts_at_the_answer_scaled_by_the_cache_when_the_cache_binds() -> None:
    arch = parse_config(fixture_config("meta-llama__Llama-3.1-8B-Instruct"), "llama")
    request = PlanRequest(arch, "llama", lookup_gpu("H100-80GB"), release("0.32.0"))
    planned = plan(request)
    fp8 = plan(replace(request, kv_cache_dtype="fp8"))
    cache = Headroom("as planned", None, Limit(0.4, 0.42, (failed_on(0.42, 3, {}),)))
    batch = Headroom("as planned", None, Limit(0.4, 0.42, (failed_on(0.42, 0, {"x": 9.0}),)))
    scale = fp8.cap.num_blocks / planned.cap.num_blocks
    assert what_if_guess(cache, planned, fp8) == pytest.approx(0.4 * scale)
    assert what_if_guess(batch, planned, fp8) == 0.4  # the cache's size does not move it
