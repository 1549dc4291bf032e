"""The simulated vLLM on HTTP: ``/metrics`` (vLLM 0.32's), ``/v1/models``, ``/version``,
``/health``, on a real clock: a background task keeps the simulation at wall-clock time
(times ``speed``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from exporter.simulator.simulation import Simulation

SIMULATION = web.AppKey("simulation", Simulation)
TICK_SECONDS = 0.05


def create_app(
    sim: Simulation, *, speed: float = 1.0, clock: Callable[[], float] = time.monotonic
) -> web.Application:
    app = web.Application()
    app[SIMULATION] = sim

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=sim.page(), content_type="text/plain", charset="utf-8")

    async def models(_: web.Request) -> web.Response:
        card = {
            "id": sim.sizing.model_name,
            "object": "model",
            "owned_by": "vllm",
            "root": sim.sizing.model_name,
            "max_model_len": sim.sizing.plan.max_model_len,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def version(_: web.Request) -> web.Response:
        return web.json_response({"version": sim.sizing.plan.request.release.label})

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="")

    async def run(app: web.Application) -> AsyncIterator[None]:
        started = clock()

        async def tick() -> None:
            while not sim.done:
                sim.advance_to((clock() - started) * speed)
                await asyncio.sleep(TICK_SECONDS)

        task = asyncio.create_task(tick(), name="simulation")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    app.cleanup_ctx.append(run)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/version", version)
    app.router.add_get("/health", health)
    return app
