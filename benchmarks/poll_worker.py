"""One side of ``benchmarks/poll.py``'s poll comparison: a poller of whichever ``exporter``
is first on ``PYTHONPATH`` (today's tree, or the pinned revision's worktree), polling a
vLLM stand-in on command and reporting each poll's times.

Run by ``poll.py`` only, as ``python benchmarks/poll_worker.py ROOT URL MODEL``: it reads
a count of polls per line on stdin and answers each with one JSON line
(``{"wall": [...], "cpu": [...], "render": [...]}``, seconds); an empty line ends it.

It imports nothing from ``benchmarks`` and uses only what today's package and the pinned
revision's share (``Config``, ``VllmClient``, ``PollerDeps``, ``Poller``), so the same file
drives both. It refuses to run when ``exporter`` does not come from ``ROOT``: a baseline
that silently imported today's code would measure today against itself.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import aiohttp

# Today a scrape renders: one every 15 s (Prometheus's usual interval at its shortest)
# against a poll every 2 s. A revision that rendered in the poll pays it inside the poll.
SCRAPE_EVERY = 8


def _session() -> aiohttp.ClientSession:
    """The session the code under test builds for itself: today's ``client_session`` (no
    cookie jar), else what the pinned revision's ``server.create_app`` opened."""
    from exporter.sources import vllm

    made = getattr(vllm, "client_session", None)
    if made is not None:
        session: aiohttp.ClientSession = made()
        return session
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=4, force_close=False))


async def work(url: str, model: str) -> None:
    from exporter.config import Config
    from exporter.log import configure
    from exporter.poller import Poller, PollerDeps
    from exporter.sources.vllm import VllmClient

    configure("error", "json", sys.stderr)  # stdout carries the answers
    clock = [1_800_000_000.0]
    config = Config(vllm_url=url, nvml_enabled=False, model_path=model)
    loop = asyncio.get_running_loop()
    polled = 0
    async with _session() as session:
        client = VllmClient(session, url, timeout_seconds=1.5, max_bytes=16 << 20)
        deps = PollerDeps(clock=lambda: clock[0], find_processes=lambda _p: [])
        poller = Poller(config, client, deps)
        while line := (await loop.run_in_executor(None, sys.stdin.readline)).strip():
            wall: list[float] = []
            cpu: list[float] = []
            render: list[float] = []
            for _ in range(int(line)):
                t, c = time.perf_counter(), time.process_time()
                await poller.poll_once()
                wall.append(time.perf_counter() - t)
                cpu.append(time.process_time() - c)
                if polled % SCRAPE_EVERY == 0:
                    # The first scrape of a snapshot: today it renders here; a revision
                    # that rendered in the poll hands back what it rendered.
                    t = time.perf_counter()
                    poller.rendered  # noqa: B018
                    render.append(time.perf_counter() - t)
                polled += 1
                clock[0] += 2.0
            print(json.dumps({"wall": wall, "cpu": cpu, "render": render}), flush=True)
        await poller.close()


def main() -> int:
    root, url, model = sys.argv[1:4]
    import exporter

    imported = Path(exporter.__file__).resolve()
    if not imported.is_relative_to(Path(root).resolve()):
        print(f"poll_worker: exporter came from {imported}, not from {root}", file=sys.stderr)
        return 2
    asyncio.run(work(url, model))
    return 0


if __name__ == "__main__":
    sys.exit(main())
