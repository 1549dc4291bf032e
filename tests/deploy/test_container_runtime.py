"""The sidecar as the container runs it, without a container runtime: the built wheel in a
fresh venv, started as an unprivileged user with a read-only home and working directory,
against the simulated vLLM. It must become ready, serve its metrics, stop cleanly, and write
nothing: the image runs it on a read-only root filesystem.

Everything listens on 127.0.0.1 and every wait is bounded.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require
from tests.deploy.conftest import ROOT, simulated_vllm
from tests.sidecar.conftest import unused_port

pytestmark = pytest.mark.slow

NOBODY = 65534  # any uid without a home or a file of its own will do
READY_WITHIN = 45.0  # seconds: start-up plus a couple of 2 s polls, on a loaded 2-core machine
PIP_ENV = {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}


@dataclass
class Run:
    uid: int | None  # the real uid of the running sidecar, from /proc
    readyz: int | None  # the first 200, or the last status seen
    metrics: str
    exit_code: int | None
    output: str  # stdout and stderr: the logs
    written: list[str]  # what changed under the read-only directories and TMPDIR


def _as_user(argv: list[str]) -> list[str]:
    """argv run as NOBODY when this test runs as root; as is otherwise (already non-root)."""
    if os.geteuid() != 0:
        return argv
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", *argv]


def _world_reachable(path: Path) -> bool:
    """Whether another user can execute path: every parent searchable, the file executable."""
    path = path.resolve()
    if not path.is_file() or not os.stat(path).st_mode & 0o001:
        return False
    return all(os.stat(parent).st_mode & 0o001 for parent in path.parents)


def _interpreter() -> str | None:
    """A Python >= 3.11 another user can run, to base the venv on (pyenv's lives in /root)."""
    candidates = [sys.executable, getattr(sys, "_base_executable", ""), "/usr/bin/python3"]
    candidates += [shutil.which(f"python3.{minor}") or "" for minor in (11, 12, 13, 14)]
    for candidate in filter(None, candidates):
        if not _world_reachable(Path(candidate)):
            continue
        probe = subprocess.run(
            [candidate, "-c", "import sys, venv, ensurepip; assert sys.version_info >= (3, 11)"],
            capture_output=True, timeout=30, check=False,
        )  # fmt: skip
        if probe.returncode == 0:
            return str(Path(candidate).resolve())
    return None


def _skip_reason() -> str | None:
    if sys.platform != "linux":
        return "needs Linux /proc to check the sidecar's uid"
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        return "running as root without setpriv (util-linux) to drop to a non-root user"
    if _interpreter() is None:
        return "no Python >= 3.11 with venv and ensurepip that a non-root user can execute"
    return None


def _tree(*roots: Path) -> dict[str, tuple[int, int, int]]:
    """path → (mode, size, mtime_ns) of everything under roots, the roots included."""
    out = {}
    for root in roots:
        for path in [root, *root.rglob("*")]:
            st = path.lstat()
            out[str(path)] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


def _check(argv: list[str], timeout: float, **kwargs: Any) -> None:
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, check=False,
        env={**os.environ, **PIP_ENV}, **kwargs,
    )  # fmt: skip
    assert proc.returncode == 0, f"{' '.join(argv)}:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}"


def _install(base: Path, python: str) -> Path:
    """The wheel built from what the Dockerfile copies, installed into a fresh venv."""
    src = base / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "exporter", src / "exporter", ignore=shutil.ignore_patterns("__pycache__")
    )
    wheels = base / "wheels"
    _check(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(wheels), str(src)],
        300,
    )
    (wheel,) = wheels.glob("vllm_kv_headroom-*.whl")
    venv = base / "venv"
    _check([python, "-m", "venv", str(venv)], 120)
    python = str(venv / "bin" / "python")
    _check([python, "-m", "pip", "install", "--quiet", str(wheel)], 300)
    # As the Dockerfile does: whatever the sidecar needs at run time must not come from these.
    _check([python, "-m", "pip", "uninstall", "--quiet", "--yes", "pip", "setuptools"], 120)
    return venv


def _run_sidecar(venv: Path, base: Path, vllm_url: str) -> Run:
    home, work, tmp, proc_dir = (base / n for n in ("home", "work", "tmp", "proc"))
    for d in (home, work, tmp, proc_dir):
        d.mkdir()
    for d in (home, work, proc_dir):
        d.chmod(0o555)  # read-only to anyone but root, which the sidecar is not
    tmp.chmod(0o1777)  # writable on purpose: a write there would be caught, not refused
    before = _tree(home, work, venv)
    port = unused_port()
    env = {
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        "HOME": str(home),
        "TMPDIR": str(tmp),
        # As the Dockerfile sets them.
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        # As the sidecar component sets them; the empty /proc keeps the sidecar from adopting
        # whatever vLLM processes happen to run on this machine.
        "KV_HEADROOM_NVML_ENABLED": "false",
        "KV_HEADROOM_PROC_PATH": str(proc_dir),
    }
    argv = [
        str(venv / "bin" / "kv-headroom"), "serve", f"--vllm.url={vllm_url}",
        f"--web.listen-address=127.0.0.1:{port}", "--log.format=json", "--poll.interval=1s",
        "--vllm.timeout=500ms",
    ]  # fmt: skip
    proc = subprocess.Popen(
        _as_user(argv), cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    uid = status = None
    metrics = ""
    try:
        deadline = time.monotonic() + READY_WITHIN
        while time.monotonic() < deadline and proc.poll() is None:
            status, _ = _get(f"http://127.0.0.1:{port}/readyz")
            if status == 200:
                break
            time.sleep(0.5)
        if status == 200:
            _, metrics = _get(f"http://127.0.0.1:{port}/metrics")
            # Serving means setpriv has long exec'd the sidecar: this is its uid, not root's.
            with contextlib.suppress(OSError, StopIteration):
                lines = Path(f"/proc/{proc.pid}/status").read_text().splitlines()
                uid = int(next(li for li in lines if li.startswith("Uid:")).split()[1])
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            output, _ = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate(timeout=10)
    after = _tree(home, work, venv)
    written = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
    written += [str(p) for p in tmp.rglob("*")]
    return Run(uid, status, metrics, proc.returncode, output, written)


@pytest.fixture(scope="module", name="run")
def _run() -> Iterator[Run]:
    require(_skip_reason())
    python = _interpreter()
    assert python is not None
    base = Path(tempfile.mkdtemp(prefix="kv-headroom-runtime-"))
    try:
        base.chmod(0o755)  # mkdtemp's 0700 would lock the unprivileged user out
        venv = _install(base, python)
        with simulated_vllm(max_seconds=150) as vllm_url:
            yield _run_sidecar(venv, base, vllm_url)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_sidecar_runs_as_a_non_root_user(run: Run) -> None:
    assert run.uid is not None
    assert run.uid != 0


def test_sidecar_becomes_ready_against_the_simulated_vllm(run: Run) -> None:
    assert run.readyz == 200, run.output[-3000:]


def test_sidecar_serves_kv_headroom_metrics(run: Run) -> None:
    assert 'kv_headroom_source_up{source="vllm"} 1.0' in run.metrics
    assert "kv_headroom_kv_capacity_tokens{" in run.metrics


def test_sidecar_writes_nothing_to_home_cwd_tmp_or_its_install(run: Run) -> None:
    assert run.written == []


def test_sidecar_stops_cleanly_on_sigterm(run: Run) -> None:
    assert run.exit_code == 0, run.output[-3000:]
    assert "Traceback" not in run.output
