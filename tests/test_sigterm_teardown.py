"""A run stopped by SIGTERM still tears its fixtures down (tests/conftest.py): what they
started in its own process group is stopped, not left running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# A session fixture that starts a process in its own group, as the vLLM harness does, and
# a test that runs until it is stopped.
INNER = """
import os, signal, subprocess, time
import pytest

@pytest.fixture(scope="session")
def child():
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    with open(os.environ["CHILD_PID_FILE"], "w") as f:
        f.write(str(proc.pid))
    yield proc
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()

def test_runs_until_stopped(child):
    time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_run_stopped_by_sigterm_stops_what_its_fixtures_started(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(INNER)
    pid_file = tmp_path / "child.pid"
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
         "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")],
        cwd=ROOT, env={**os.environ, "CHILD_PID_FILE": str(pid_file)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    child = None
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.is_file() and pid_file.read_text()) and time.monotonic() < deadline:
            assert run.poll() is None, "the inner run ended before its fixture started"
            time.sleep(0.1)
        child = int(pid_file.read_text())
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=30)
        assert not _alive(child)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        if child is not None and _alive(child):
            os.killpg(child, signal.SIGKILL)
