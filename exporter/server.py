"""The HTTP face: ``/metrics``, ``/healthz``, ``/readyz`` and a status page at ``/``.

It only serves what the poll loop computed: ``/metrics`` returns the bytes rendered with
the latest snapshot (gzipped once per snapshot when asked), so concurrent scrapes cost
a dictionary lookup and always agree with each other.
"""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from exporter.config import Config
from exporter.poller import Poller, PollerDeps
from exporter.sources.vllm import VllmClient
from exporter.status import status_page

POLLER = web.AppKey("poller", Poller)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _Gzip:
    """The gzip of the latest rendering, made at most once per snapshot."""

    def __init__(self) -> None:
        self._source: bytes | None = None
        self._body = b""

    def of(self, body: bytes) -> bytes:
        if body is not self._source:
            self._body = gzip.compress(body, compresslevel=5)
            self._source = body
        return self._body


GZIP = web.AppKey("gzip", _Gzip)


async def metrics(request: web.Request) -> web.Response:
    poller = request.app[POLLER]
    body = poller.rendered
    if "gzip" in request.headers.get("Accept-Encoding", ""):
        return web.Response(
            body=request.app[GZIP].of(body),
            headers={"Content-Type": CONTENT_TYPE, "Content-Encoding": "gzip"},
        )
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def healthz(request: web.Request) -> web.Response:
    """Alive while the poll loop keeps polling (a stuck loop fails the liveness probe)."""
    if request.app[POLLER].alive():
        return web.Response(text="ok\n")
    return web.Response(status=503, text="poll loop stalled\n")


async def readyz(request: web.Request) -> web.Response:
    """Ready once vLLM has answered once: before that there is nothing true to serve."""
    if request.app[POLLER].snapshot.vllm_ready:
        return web.Response(text="ready\n")
    return web.Response(status=503, text="waiting for vLLM to answer /metrics\n")


async def index(request: web.Request) -> web.Response:
    poller = request.app[POLLER]
    html = status_page(poller.snapshot, poller.config)
    return web.Response(text=html, content_type="text/html", charset="utf-8")


def create_app(config: Config, deps: PollerDeps | None = None) -> web.Application:
    """The application, with the poll loop tied to its lifetime."""
    app = web.Application(client_max_size=64 * 1024)
    app[GZIP] = _Gzip()

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=4, force_close=False)
        async with aiohttp.ClientSession(connector=connector) as session:
            client = VllmClient(
                session,
                config.vllm_url,
                timeout_seconds=config.vllm_timeout_seconds,
                max_bytes=config.vllm_max_page_bytes,
            )
            poller = Poller(config, client, deps)
            app[POLLER] = poller
            stop = asyncio.Event()
            task = asyncio.create_task(poller.run(stop), name="poll-loop")
            try:
                yield
            finally:
                stop.set()
                try:
                    await asyncio.wait_for(task, timeout=config.vllm_timeout_seconds + 5)
                except TimeoutError:
                    task.cancel()
                await poller.close()

    app.cleanup_ctx.append(lifecycle)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/", index)
    return app
