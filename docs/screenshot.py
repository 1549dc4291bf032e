"""Renders the status page after a simulated run and photographs it: docs/status-page.png.

    python docs/screenshot.py                     # ramp-to-overload, a minute past the
                                                  # first preemption
    python docs/screenshot.py --scenario demo --at 300

The sidecar polls the simulated vLLM on a simulated clock (every 2 s, as deployed), so half
an hour of history takes seconds. The page is photographed by headless Chromium (Debian's
``chromium`` package) with a fresh profile and no network beyond the file itself.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import aiohttp
from aiohttp.test_utils import TestServer

from exporter.demo_cli import sidecar_config, sidecar_deps
from exporter.log import configure
from exporter.poller import Poller
from exporter.simulator.server import create_app as simulator_app
from exporter.simulator.simulation import Simulation, load_scenario
from exporter.sources.vllm import VllmClient
from exporter.status import status_page

DOCS = Path(__file__).resolve().parent
START = 1_800_000_000.0
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-scrollbars",
)  # fmt: skip


async def render(scenario: str, at: float | None, every: float = 2.0) -> str:
    """The page as a browser would get it, at ``at`` simulated seconds (default: a minute
    after the first preemption)."""
    sim = Simulation(load_scenario(scenario), start_time=START)
    server = TestServer(simulator_app(sim, clock=lambda: 0.0), host="127.0.0.1")
    await server.start_server()
    now = START
    url = str(server.make_url("")).rstrip("/")
    config = sidecar_config(sim, url, "127.0.0.1", 9847, every)
    async with aiohttp.ClientSession() as session:
        client = VllmClient(session, url, timeout_seconds=1.0, max_bytes=1 << 24)
        poller = Poller(config, client, sidecar_deps(sim, clock=lambda: now))
        stop = at if at is not None else sim.scenario.duration
        try:
            while now - START < stop:
                now += every
                sim.advance_to(now - START)
                await poller.poll_once()
                first = poller.trail.last_preemption
                if at is None and first is not None:
                    stop = min(stop, first - START + 60)
            return status_page(poller.snapshot, config, poller.trail)
        finally:
            await poller.close()
            await server.close()


def photograph(html: str, png: Path, width: int, height: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "status.html"
        page.write_text(html, encoding="utf-8")
        chromium = shutil.which("chromium")
        if chromium is None:
            raise SystemExit(
                "docs/screenshot.py: no chromium on PATH (Debian: apt-get install chromium)"
            )
        subprocess.run(  # noqa: S603 - our own argv: a file we just wrote
            [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp}/profile",
             f"--window-size={width},{height}", f"--screenshot={png}", page.as_uri()],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="photograph the status page")
    parser.add_argument("--scenario", default="ramp-to-overload")
    parser.add_argument("--at", type=float, help="simulated seconds (default: see above)")
    parser.add_argument("--html", type=Path, help="also keep the page here")
    parser.add_argument("--png", type=Path, default=DOCS / "status-page.png")
    parser.add_argument("--size", default="1000x740", help="the browser window, WxH")
    args = parser.parse_args(argv)
    configure("warning", "console", sys.stderr)  # the poller's info events are not the point
    html = asyncio.run(render(args.scenario, args.at))
    if args.html:
        args.html.write_text(html, encoding="utf-8")
    width, _, height = args.size.partition("x")
    photograph(html, args.png, int(width), int(height))
    print(args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
