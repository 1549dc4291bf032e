"""benchmarks/poll.py's baseline is a pinned git revision, checked out unedited: it is
there or the benchmark fails with one line, and a worker runs only the code it was given."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import poll


def test_the_baseline_worktree_is_the_pinned_revision_unedited_and_is_removed_after() -> None:
    with poll.pinned_worktree(poll.BASELINE) as tree:
        head = subprocess.run(
            ["git", "-C", str(tree), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
        changed = subprocess.run(
            ["git", "-C", str(tree), "status", "--porcelain"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert (head.stdout.strip(), changed.stdout) == (poll.BASELINE, "")
    assert not tree.exists()


def test_a_revision_missing_from_the_clone_fails_with_one_line_naming_it() -> None:
    with pytest.raises(SystemExit) as exited, poll.pinned_worktree("0" * 40):
        pass
    assert str(exited.value.code) == (
        "benchmarks/poll.py: the baseline revision 0000000 is not in this clone"
        " (clone with full history)"
    )


def test_without_git_the_benchmark_fails_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    with pytest.raises(SystemExit) as exited, poll.pinned_worktree(poll.BASELINE):
        pass
    assert str(exited.value.code) == (
        "benchmarks/poll.py: the baseline is git revision 1ae06a7, and git is not installed"
    )


def test_a_worker_refuses_an_exporter_from_another_tree(tmp_path: Path) -> None:
    """A baseline worker that found today's package would time today against itself."""
    worker = subprocess.run(
        [sys.executable, str(poll.WORKER), str(tmp_path), "http://127.0.0.1:1", poll.MODEL],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(poll.ROOT)},
        stdin=subprocess.DEVNULL,  # without the guard it would poll until stdin ends
        timeout=60,
        check=False,
    )
    assert worker.returncode == 2
    assert f"exporter came from {poll.ROOT}" in worker.stderr
