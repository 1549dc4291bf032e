"""Real Prometheus and real ``kv-headroom serve`` processes for the integration tiers.

Each runs in its own process group on 127.0.0.1 and is stopped by group id — on success,
failure or interrupt (``atexit`` too). Every wait is bounded.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import yaml

ROOT = Path(__file__).resolve().parent.parent
# Environment variables the tests read themselves (tests/e2e/vllm_harness.py), not settings.
HARNESS_ENV = frozenset(
    {"KV_HEADROOM_VLLM_VENV", "KV_HEADROOM_KEEP_VLLM_LOGS", "KV_HEADROOM_E2E_BOUND_SCALE"}
)
# Their values, taken out of os.environ when the session starts (tests/conftest.py): they
# share the sidecar's KV_HEADROOM_ prefix, the sidecar refuses a setting it does not know
# (exit 2), and many tests start it with the whole environment. A proof run with
# KV_HEADROOM_VLLM_VENV set failed 27 such tests.
_WITHHELD: dict[str, str] = {}


def withhold_harness_env() -> None:
    """Move the harness's variables out of os.environ, where every child would inherit
    them, into harness_setting's keeping."""
    for name in HARNESS_ENV:
        if name in os.environ:
            _WITHHELD[name] = os.environ.pop(name)


def harness_setting(name: str) -> str | None:
    """A harness variable: from os.environ where a test set it, else as the session began."""
    return os.environ.get(name) or _WITHHELD.get(name)


RULES = sorted((ROOT / "rules").glob("*.yml"))
STOP_GRACE_S = 10.0

# Talk to 127.0.0.1 directly even when HTTP(S)_PROXY is set.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """(status, body); (0, reason) when nothing answers."""
    try:
        with _OPENER.open(url, timeout=timeout) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except OSError as exc:
        return 0, str(exc)


def wait_for(
    url: str, timeout: float, what: str, proc: subprocess.Popen[bytes], log: Path | None = None
) -> None:
    """Until ``url`` answers 200; a process that exits first fails with the end of ``log``
    (its output), so that a CI log alone says why."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            said = log.read_text(errors="replace")[-4000:] if log and log.is_file() else ""
            raise RuntimeError(
                f"{what} exited with {proc.returncode} before {url} answered"
                + (f"; its output:\n{said}" if said else "")
            )
        if http_get(url, timeout=2.0)[0] == 200:
            return
        time.sleep(0.2)
    raise TimeoutError(f"{what}: {url} did not answer 200 within {timeout:.0f}s")


class _Process:
    """A child in its own process group, its output in a log file."""

    name = "process"

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self.dir = Path(tempfile.mkdtemp(prefix=f"kv-headroom-{self.name}-"))
        self.log_path = self.dir / "output.log"
        self.port = free_port()

    def _spawn(self, cmd: Sequence[str], env: dict[str, str] | None = None) -> None:
        with self.log_path.open("wb") as log:
            self._proc = subprocess.Popen(
                list(cmd), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                cwd=self.dir, env=env,
            )  # fmt: skip
        atexit.register(self.stop)

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        assert self._proc is not None, f"{self.name} not started"
        return self._proc

    def log(self, tail: int = 4000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-tail:]
        return ""

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        atexit.unregister(self.stop)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=STOP_GRACE_S)

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cleanup()


class Sidecar(_Process):
    """``kv-headroom serve`` from this checkout, JSON logs in ``log_path``."""

    name = "sidecar"

    def __init__(self, vllm_url: str, *args: str) -> None:
        super().__init__()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = (
            "--vllm.url", vllm_url, "--web.listen-address", f"127.0.0.1:{self.port}",
            "--log.format", "json", *args,
        )  # fmt: skip

    def start(self, timeout: float = 30.0) -> Self:
        # The harness's own knobs share the sidecar's KV_HEADROOM_ prefix (see _WITHHELD);
        # one a test set with monkeypatch is not passed on either.
        env = {k: v for k, v in os.environ.items() if k not in HARNESS_ENV}
        env["PYTHONPATH"] = str(ROOT)
        self._spawn([sys.executable, "-m", "exporter", "serve", *self.args], env)
        wait_for(self.url + "/healthz", timeout, "kv-headroom serve", self.proc, self.log_path)
        return self

    def metrics(self) -> str:
        status, text = http_get(self.url + "/metrics")
        assert status == 200, f"sidecar /metrics: {status} {text[:300]}"
        return text


class Prometheus(_Process):
    """Debian's ``prometheus`` with the project's rules, scraping the given targets."""

    name = "prometheus"
    # --storage.tsdb.retention.time; None keeps Prometheus's default (15 days).
    retention: str | None = None

    def __init__(
        self,
        jobs: dict[str, Sequence[str]],
        *,
        interval: str = "1s",
        rules: Sequence[Path] = tuple(RULES),
    ) -> None:
        super().__init__()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval,
                       "scrape_timeout": interval},
            "rule_files": [str(p) for p in rules],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": list(targets)}]}
                for job, targets in jobs.items()
            ],
        }  # fmt: skip
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))

    @staticmethod
    def available() -> bool:
        return shutil.which("prometheus") is not None

    def start(self, timeout: float = 60.0) -> Self:
        self._spawn([
            "prometheus", f"--config.file={self.dir / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.dir / 'data'}",
            *([f"--storage.tsdb.retention.time={self.retention}"] if self.retention else []),
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--web.enable-lifecycle",
        ])  # fmt: skip
        wait_for(self.url + "/-/ready", timeout, "prometheus", self.proc, self.log_path)
        return self

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        status, text = http_get(f"{self.url}/api/v1/{path}" + (f"?{query}" if query else ""))
        body = json.loads(text) if text.startswith("{") else {"error": text}
        if status != 200 or body.get("status") != "success":
            raise RuntimeError(f"prometheus {path} {params}: {status} {body.get('error', text)}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        result: list[dict[str, Any]] = data["result"]
        return result

    def firing(self) -> set[str]:
        """Names of the alerts firing now."""
        return {a["labels"]["alertname"] for a in self.api("alerts")["alerts"]
                if a["state"] == "firing"}  # fmt: skip

    def targets_up(self) -> dict[str, bool]:
        return {t["scrapeUrl"]: t["health"] == "up" for t in self.api("targets")["activeTargets"]}
