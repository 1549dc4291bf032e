"""A simulated vLLM on 127.0.0.1 for tests that run the sidecar as a separate process.

    python -m tests.deploy.simulated_vllm [--scenario steady] [--max-seconds 120]

Prints ``port N`` once it listens; stops on SIGTERM or SIGINT, or after --max-seconds so a
test that dies cannot leave it behind.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import time

from aiohttp import web

from exporter.simulator.server import create_app
from exporter.simulator.simulation import Simulation, load_scenario


async def serve(scenario: str, max_seconds: float) -> None:
    sim = Simulation(load_scenario(scenario), start_time=time.time())
    runner = web.AppRunner(create_app(sim), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    assert runner.addresses
    print(f"port {runner.addresses[0][1]}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=max_seconds)
    finally:
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="steady")
    parser.add_argument("--max-seconds", type=float, default=120.0)
    args = parser.parse_args()
    asyncio.run(serve(args.scenario, args.max_seconds))


if __name__ == "__main__":
    main()
