"""The running sidecar — its aiohttp app, poller and HTTP client — against a scripted vLLM.

``sidecar`` serves the real app on 127.0.0.1 with the poll loop left to the test: each
``poll()`` is one poll of the real poller on a clock the test moves, and each ``scrape()``
reads ``/metrics`` over HTTP and checks it is a valid exposition, with prometheus_client's
parser and with ``promtool check metrics`` where promtool is installed.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import AsyncIterator, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import pytest
import structlog
from aiohttp.test_utils import TestClient, TestServer

from exporter.config import Config
from exporter.poller import Poller, PollerDeps
from exporter.server import POLLER, create_app
from tests.exposition import families_by_name
from tests.scripted_vllm import ScriptedVllm
from tests.sidecar.conftest import TINYLLAMA, Clock, fixture_page

PROMTOOL = shutil.which("promtool")


def check_exposition(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The exposition parsed; fails the test when either parser rejects it."""
    parsed = dict(families_by_name(text))
    if PROMTOOL is not None:
        proc = subprocess.run(
            [PROMTOOL, "check", "metrics"],
            input=text,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return parsed


def value(text: str, name: str, **labels: str) -> float | None:
    for found, v in families_by_name(text).get(name, []):
        if all(found.get(k) == want for k, want in labels.items()):
            return v
    return None


@dataclass
class Sidecar:
    client: TestClient  # type: ignore[type-arg]
    poller: Poller
    clock: Clock
    events: list[MutableMapping[str, Any]] = field(default_factory=list)

    async def poll(self, times: int = 1) -> None:
        for _ in range(times):
            await self.poller.poll_once()
            self.clock.tick(self.poller.config.poll_interval_seconds)

    async def scrape(self) -> str:
        resp = await self.client.get("/metrics")
        assert resp.status == 200
        text = await resp.text()
        check_exposition(text)
        return text

    def named(self, event: str, **fields: object) -> list[MutableMapping[str, Any]]:
        return [
            e
            for e in self.events
            if e["event"] == event and all(e.get(k) == v for k, v in fields.items())
        ]

    def forget_events(self) -> None:
        self.events.clear()


MakeSidecar = Callable[..., Any]


@pytest.fixture(name="scripted")
async def _scripted() -> AsyncIterator[ScriptedVllm]:
    fake = ScriptedVllm(fixture_page("vllm-0.32-cpu-preempted.txt"))
    await fake.start()
    yield fake
    await fake.close()


@pytest.fixture(name="make_sidecar")
async def _make_sidecar() -> AsyncIterator[MakeSidecar]:
    clients: list[TestClient] = []  # type: ignore[type-arg]
    capture = structlog.testing.capture_logs()
    events = capture.__enter__()

    async def make(url: str, *, deps: PollerDeps | None = None, **cfg: Any) -> Sidecar:
        clock = Clock()
        deps = deps or PollerDeps()
        deps.clock = clock
        deps.find_processes = lambda _p: []
        settings: dict[str, Any] = {
            "vllm_url": url,
            "vllm_timeout_seconds": 0.5,
            "poll_interval_seconds": 2.0,
            "nvml_enabled": deps.nvml is not None,
            "model_path": TINYLLAMA,
        }
        settings.update(cfg)
        app = create_app(Config(**settings), deps, poll=False)
        client = TestClient(TestServer(app, host="127.0.0.1"))
        await client.start_server()
        clients.append(client)
        return Sidecar(client, app[POLLER], clock, events)

    try:
        yield make
    finally:
        for client in clients:
            await client.close()
        capture.__exit__(None, None, None)


class ThreadedVllm:
    """A ScriptedVllm on its own event loop in a thread, for tests that run the real
    ``kv-headroom serve`` in a child process and wait on it synchronously."""

    def __init__(self, page: str) -> None:
        import asyncio
        import threading

        self.loop = asyncio.new_event_loop()
        self.fake = ScriptedVllm(page)
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.call(self.fake.start())

    def call(self, coro: Any) -> Any:
        import asyncio

        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def close(self) -> None:
        self.call(self.fake.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


@pytest.fixture(name="threaded_vllm")
def _threaded_vllm() -> Any:
    vllm = ThreadedVllm(fixture_page("vllm-0.32-cpu-preempted.txt"))
    yield vllm
    vllm.close()
