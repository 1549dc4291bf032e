"""The real ``kv-headroom serve`` process: signals during a poll, a port already taken, a
GPU whose NVML calls never return, and every way its config file can be wrong."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import missing
from tests.faults.conftest import ThreadedVllm
from tests.processes import ROOT
from tests.sidecar.conftest import unused_port

SERVE = [sys.executable, "-m", "exporter", "serve"]


def start(*args: str, script: str | None = None) -> subprocess.Popen[str]:
    command = [sys.executable, "-c", script, *args] if script else [*SERVE, *args]
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ}
    )


def wait_until(check: object, what: str, proc: subprocess.Popen[str]) -> None:
    for _ in range(200):  # bounded: 20 s
        if check():  # type: ignore[operator]
            return
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    out, err = proc.communicate(timeout=10)
    pytest.fail(f"never saw {what}; exit {proc.returncode}\n{out}\n{err}")


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def events(stdout: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_during_a_poll_exits_0_without_a_traceback(
    threaded_vllm: ThreadedVllm, sig: signal.Signals
) -> None:
    threaded_vllm.call(threaded_vllm.fake.set_fault("hang"))  # every poll hangs in /metrics
    port = unused_port()
    proc = start(
        "--web.listen-address", f"127.0.0.1:{port}",
        "--vllm.url", threaded_vllm.fake.url,
        "--vllm.timeout", "20s", "--poll.interval", "30s",
        "--no-nvml.enabled", "--log.format", "json",
    )  # fmt: skip
    try:
        wait_until(lambda: threaded_vllm.fake.requests.get("/metrics"), "a poll begin", proc)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=15)  # well before the 20 s read timeout
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in out + err
    assert [e["event"] for e in events(out)][-1] == "stopping"


HANGING_NVML = textwrap.dedent(
    """
    import asyncio, sys, threading
    import pynvml
    from exporter.config import Config
    from exporter.log import configure
    from exporter.poller import PollerDeps
    from exporter.serve_cli import serve
    from exporter.sources.nvml import NvmlReader

    class HungDriver:  # a GPU off the bus: nvmlInit never returns
        NVMLError = pynvml.NVMLError
        def nvmlInit(self):
            threading.Event().wait()
        def nvmlShutdown(self):
            pass

    config = Config(
        vllm_url=sys.argv[1], listen_host="127.0.0.1", listen_port=int(sys.argv[2]),
        vllm_timeout_seconds=0.3, poll_interval_seconds=0.5,
    )
    configure("info", "json")
    sys.exit(asyncio.run(serve(config, deps=PollerDeps(nvml=NvmlReader(HungDriver())))))
    """
)


def test_sigterm_exits_although_an_nvml_call_never_returns(threaded_vllm: ThreadedVllm) -> None:
    port = unused_port()
    proc = start(threaded_vllm.fake.url, str(port), script=HANGING_NVML)
    try:
        wait_until(lambda: listening(port), "the port open", proc)
        wait_until(lambda: threaded_vllm.fake.requests.get("/metrics", 0) >= 2, "polls", proc)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert '"kind": "timeout"' in out
    assert "Traceback" not in out + err


def test_port_taken_exits_1_with_one_line_naming_the_address() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        address = ["--web.listen-address", f"127.0.0.1:{port}"]
        vllm = ["--vllm.url", f"http://127.0.0.1:{unused_port()}"]
        proc = subprocess.run(
            [*SERVE, *address, *vllm, "--no-nvml.enabled", "--log.format", "json"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert proc.returncode == 1
    assert proc.stderr == ""
    (event,) = events(proc.stdout)  # nothing polled before the port was bound
    assert event["event"] == "listen_failed"
    assert event["address"] == f"127.0.0.1:{port}"
    assert "in use" in str(event["error"]).lower()


def check_config(*args: str) -> subprocess.CompletedProcess[str]:
    """``kv-headroom serve ARGS --check-config`` in a process of its own."""
    return subprocess.run(
        [*SERVE, *args, "--check-config"], capture_output=True, text=True, timeout=60, check=False
    )


def run_config(path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return check_config("--config.file", str(path), *extra)


BAD_CONFIGS = {
    "invalid_yaml": ("poll:\n  interval: [2s\n", ["invalid YAML", "line 3"]),
    "top_level_list": ("- vllm\n- poll\n", ["the top level must be a mapping"]),
    "section_not_mapping": ("poll: 5\n", ["poll = 5", "must be a mapping"]),
    "wrong_type": ("poll:\n  interval: [1, 2]\n", ["poll.interval = [1, 2]", "duration"]),
    "quoted_boolean": ('nvml:\n  enabled: "yes"\n', ["nvml.enabled = 'yes'", "true or false"]),
    "unknown_section": ("vlm:\n  url: x\n", ["vlm: unknown key"]),
    "unknown_key": ("vllm:\n  urll: http://x\n", ["vllm.urll: unknown key", "valid: url"]),
    "not_utf8": (b"poll:\n  interval: \xff\n", ["not UTF-8"]),
}


@pytest.mark.parametrize("case", BAD_CONFIGS)
def test_bad_config_file_exits_2_with_one_line_naming_file_key_and_value(
    tmp_path: Path, case: str
) -> None:
    content, expected = BAD_CONFIGS[case]
    assert isinstance(content, str | bytes)
    path = tmp_path / "kv.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    proc = run_config(path)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    problems = [line for line in proc.stderr.splitlines() if line.startswith("kv-headroom serve: ")]
    assert len(problems) == 1, proc.stderr
    assert str(path) in problems[0]
    for fragment in expected:
        assert fragment in problems[0]


def test_missing_config_file_exits_2_naming_it(tmp_path: Path) -> None:
    proc = run_config(tmp_path / "absent.yaml")
    assert proc.returncode == 2
    assert f"config.file = '{tmp_path / 'absent.yaml'}': no such file" in proc.stderr
    assert "Traceback" not in proc.stderr


def _unprivileged_python() -> list[str] | None:
    """argv prefix running this Python's environment as nobody, or None where that cannot be.

    Root reads any file, so the unreadable-file path is only reached as another user. The
    interpreter must be one that user can execute (pyenv's lives under /root) and of this
    minor version, so the environment's compiled packages load in it.
    """
    if os.geteuid() != 0:
        return [sys.executable]
    if shutil.which("setpriv") is None:
        return None
    minor = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (sys.executable, shutil.which(minor), f"/usr/bin/{minor}"):
        if not candidate or not Path(candidate).is_file():
            continue
        path = Path(candidate).resolve()
        if not all(os.stat(p).st_mode & 0o001 for p in (path, *path.parents)):
            continue
        return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", str(path)]
    return None


def test_unreadable_config_file_exits_2_naming_it() -> None:
    python = _unprivileged_python()
    if python is None:
        missing("no setpriv or no Python an unprivileged user can run")
    # pytest's tmp_path sits under a root-only directory: nobody must reach the file itself
    base = Path(tempfile.mkdtemp(prefix="kv-unreadable-"))
    try:
        base.chmod(0o755)
        path = base / "kv.yaml"
        path.write_text("poll:\n  interval: 2s\n")
        path.chmod(0o000)
        paths = [str(ROOT), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
        proc = subprocess.run(
            [*python, "-m", "exporter", "serve", "--config.file", str(path), "--check-config"],
            capture_output=True, text=True, timeout=60, check=False, cwd=base,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(paths), "HOME": str(base)},
        )  # fmt: skip
    finally:
        shutil.rmtree(base, ignore_errors=True)
    assert proc.returncode == 2, proc.stderr
    assert "permission denied" in proc.stderr
    assert str(path) in proc.stderr
    assert "Traceback" not in proc.stderr
