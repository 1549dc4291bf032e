"""A scripted vLLM on 127.0.0.1 and a poller wired to it, for the sidecar's tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from exporter.config import Config
from exporter.poller import Poller, PollerDeps
from exporter.sources.vllm import VllmClient
from tests.conftest import FIXTURES

TINYLLAMA = str(FIXTURES / "vllm" / "tinyllama.config.json")


def fixture_page(name: str) -> str:
    return (FIXTURES / "vllm" / name).read_text()


@dataclass
class FakeVllm:
    """What the fake answers; tests change it between polls."""

    page: str = ""
    mode: str = "ok"  # ok | delay | status500 | garbage
    delay: float = 0.0
    max_model_len: int | None = 2048
    version: str = "0.32.0"
    model: str = "tinyllama"
    root: str | None = None  # what vLLM loaded, when --served-model-name renames it
    models_status: int = 200  # /v1/models's HTTP status
    requests: list[str] = field(default_factory=list)
    server: TestServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return str(self.server.make_url("")).rstrip("/")

    def app(self) -> web.Application:
        async def metrics(request: web.Request) -> web.StreamResponse:
            self.requests.append("/metrics")
            if self.mode == "delay":
                await asyncio.sleep(self.delay)
            if self.mode == "status500":
                return web.Response(status=500, text="engine dead")
            body = "<html>not metrics</html>" if self.mode == "garbage" else self.page
            return web.Response(text=body, content_type="text/plain")

        async def models(request: web.Request) -> web.Response:
            if self.models_status != 200:
                return web.json_response({}, status=self.models_status)
            root = self.root or self.model
            card = {"id": self.model, "root": root, "max_model_len": self.max_model_len}
            return web.json_response({"object": "list", "data": [card]})

        async def version(request: web.Request) -> web.Response:
            return web.json_response({"version": self.version})

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/v1/models", models)
        app.router.add_get("/version", version)
        return app


@pytest.fixture(name="fake_vllm")
async def _fake_vllm() -> AsyncIterator[FakeVllm]:
    fake = FakeVllm(page=fixture_page("vllm-0.32-cpu-preempted.txt"))
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    fake.server = server
    yield fake
    await server.close()


class Clock:
    """A clock the test moves: each poll is one interval later."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float = 2.0) -> None:
        self.now += seconds


@dataclass
class Rig:
    poller: Poller
    clock: Clock
    session: aiohttp.ClientSession

    async def poll(self, times: int = 1, every: float = 2.0) -> None:
        for _ in range(times):
            await self.poller.poll_once()
            self.clock.tick(every)

    @property
    def text(self) -> str:
        return self.poller.rendered.decode()


MakeRig = Callable[..., Any]


@pytest.fixture(name="make_rig")
async def _make_rig() -> AsyncIterator[MakeRig]:
    sessions: list[aiohttp.ClientSession] = []
    pollers: list[Poller] = []

    async def make(
        url: str, *, model_path: str | None = TINYLLAMA, deps: PollerDeps | None = None, **cfg: Any
    ) -> Rig:
        clock = Clock()
        deps = deps or PollerDeps()
        deps.clock = clock
        deps.find_processes = deps.find_processes if cfg.pop("scan", False) else (lambda _p: [])
        settings: dict[str, Any] = {
            "vllm_url": url,
            "vllm_timeout_seconds": 0.5,
            "poll_interval_seconds": 2.0,
            "nvml_enabled": deps.nvml is not None,
            "model_path": model_path,
        }
        settings.update(cfg)
        config = Config(**settings)
        session = aiohttp.ClientSession()
        sessions.append(session)
        client = VllmClient(
            session,
            url,
            timeout_seconds=config.vllm_timeout_seconds,
            max_bytes=config.vllm_max_page_bytes,
        )
        poller = Poller(config, client, deps)
        pollers.append(poller)
        return Rig(poller, clock, session)

    yield make
    for poller in pollers:
        await poller.close()
    for session in sessions:
        await session.close()


def unused_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def golden_path(name: str) -> Path:
    return Path(__file__).parent.parent / "golden" / (name.removesuffix(".txt") + ".prom")
