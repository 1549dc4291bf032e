"""Soak: the sidecar polling a simulated vLLM 100,000 times while faults are injected at
random, measuring whether it stays whole — memory flat after warm-up, no file descriptors
leaked, every fault survived and recovered from.

What runs, and what is simulated:

- The sidecar is the real thing: ``create_app`` (aiohttp, its poller, its HTTP client to
  vLLM, NVML reader) on 127.0.0.1 with production settings (2 s interval, 10 min window,
  15 min history), scraped over HTTP every 50 polls. Only its clock is virtual: each poll
  is 2 s later, and polls follow each other as fast as they complete.
- vLLM is ``ScriptedVllm`` in a child process serving the simulator's vLLM 0.32 page for
  a 30-minute scenario (``ramp-to-overload`` by default) at 2 s per request, replayed from
  the start when it ends (the sidecar sees a vLLM restart each time). The child is where
  the wire faults happen: refused, reset, hang, trickle, 100 MB, gzip, HTTP 500, and every
  page fault (truncated, invalid UTF-8, NaN/±Inf/negative, duplicates, relabel, ...).
- NVML is the simulator's GPU behind pynvml's own structs, raising pynvml's own errors
  (GPU lost, library not found, uninitialised, no permission, not supported, ...) or
  hanging past the timeout.

A fault lasts 1-3 polls; it is survived when every poll during it completes, renders an
exposition prometheus_client parses with the faulted source's ``source_up`` as expected,
and the first poll after it shows the source up again (a poll that itself times out on a
loaded machine is given up to two more, and counted). Memory is the sidecar process's
Python objects, its RSS (the child is not in it) and, with ``--tracemalloc``, Python's own
allocations; descriptors are its open fds. RSS also holds what glibc keeps of the freed
16 MiB bodies the ``huge`` faults bring: it climbs for the first ~20,000 polls and then
stays put (with ``MALLOC_ARENA_MAX=2`` it does not climb), so its check is on the second
half of the run.

    python benchmarks/soak.py [--polls 100000] [--fault-rate 0.02] [--seed 1] [--output json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import os
import random
import sys
import threading
import time
import tracemalloc
from collections import Counter
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
import pynvml
import structlog
from aiohttp import web

from exporter.config import Config
from exporter.poller import PollerDeps
from exporter.server import HANDLER_LIMITS, POLLER, create_app
from exporter.simulator.nvml import SimulatedNvml
from exporter.sources.nvml import NvmlReader
from tests.exposition import families_by_name
from tests.scripted_vllm import FAULTS, ScriptedVllm

INTERVAL = 2.0
TIMEOUT = 0.25  # hang and trickle cost this much real time per poll
SCRAPE_EVERY = 50
RECOVERY_POLLS = 3
# Page faults the sidecar reads through (vLLM stays up); every other vLLM fault is a down.
VLLM_STAYS_UP = {"duplicate", "html_labels", "relabel", "restart"}
NVML_FAULTS = {
    "nvml_gpu_lost": pynvml.NVML_ERROR_GPU_IS_LOST,
    "nvml_library_not_found": pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
    "nvml_uninitialized": pynvml.NVML_ERROR_UNINITIALIZED,
    "nvml_no_permission": pynvml.NVML_ERROR_NO_PERMISSION,
    "nvml_not_supported": pynvml.NVML_ERROR_NOT_SUPPORTED,
    "nvml_driver_not_loaded": pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
    "nvml_unknown": pynvml.NVML_ERROR_UNKNOWN,
    "nvml_hang": -1,
}
ALL_FAULTS = (*FAULTS, *NVML_FAULTS)


# -- the child: a simulated vLLM that misbehaves on cue -----------------------------------


def _child(scenario: str, polls: int, conn: Connection) -> None:
    from exporter.simulator.simulation import Simulation, load_scenario

    sim = Simulation(load_scenario(scenario))
    cycle = min(polls + 1, int(sim.scenario.duration / INTERVAL))
    # Simulated before serving, so that a poll never waits on the simulation.
    pages: list[str] = []
    for i in range(cycle):
        sim.advance_to(INTERVAL * (i + 1))
        pages.append(sim.page())
    served = [0]

    def page() -> str:
        served[0] += 1
        return pages[(served[0] - 1) % cycle]

    async def main() -> None:
        fake = ScriptedVllm(page)
        fake.trickle_seconds = 0.05
        fake.card.model = sim.sizing.model_name
        fake.card.max_model_len = sim.sizing.plan.max_model_len
        await fake.start()
        conn.send(fake.url)
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        commands: asyncio.Queue[Any] = asyncio.Queue()
        loop.add_reader(conn.fileno(), lambda: commands.put_nowait(conn.recv()))
        while not done.is_set():
            command, fault = await commands.get()
            if command == "stop":
                done.set()
            else:
                await fake.set_fault(fault)
            conn.send("ok")
        await fake.close()

    asyncio.run(main())


# -- the parent: the sidecar --------------------------------------------------------------


class FaultyGpu(SimulatedNvml):
    """The simulator's GPU, failing with one of pynvml's errors (or hanging) on cue."""

    def __init__(self) -> None:
        total = 48 << 30
        super().__init__("NVIDIA L40S", lambda: (total, total * 9 // 10, total - (466 << 20)), 1)
        self.fault: int | None = None

    def nvmlDeviceGetMemoryInfo(self, handle: int, version: int | None = None) -> Any:
        for _ in range(200):  # hung while the fault lasts (bounded: 10 s), then answers
            if self.fault != -1:
                break
            time.sleep(0.05)
        if self.fault is not None and self.fault != -1:
            raise pynvml.NVMLError(self.fault)
        return super().nvmlDeviceGetMemoryInfo(handle, version)


class EventCounter:
    """A structlog processor that counts events and drops them (no I/O, no growth)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def __call__(self, _logger: Any, _name: str, event: MutableMapping[str, Any]) -> Any:
        self.counts[str(event.get("event"))] += 1
        raise structlog.DropEvent


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@dataclass
class Checkpoint:
    polls: int
    rss_bytes: int
    fds: int
    objects: int
    traced_bytes: int | None


@dataclass
class Result:
    polls: int = 0
    seconds: float = 0.0
    scrapes: int = 0
    tried: Counter[str] = field(default_factory=Counter)
    survived: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    slow_recoveries: int = 0  # good polls that timed out on a loaded machine
    checkpoints: dict[str, Checkpoint] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)


def checkpoint(polls: int) -> Checkpoint:
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else None
    return Checkpoint(polls, rss_bytes(), open_fds(), len(gc.get_objects()), traced)


def source_up(text: str, source: str) -> float | None:
    for labels, v in families_by_name(text).get("kv_headroom_source_up", []):
        if labels.get("source") == source:
            return v
    return None


async def soak(args: argparse.Namespace) -> Result:
    rng = random.Random(args.seed)
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=_child, args=(args.scenario, args.polls, theirs), daemon=True)
    child.start()
    url = ours.recv()

    def child_fault(name: str | None) -> None:
        ours.send(("fault", name))
        ours.recv()

    counter = EventCounter()
    structlog.configure(processors=[counter], cache_logger_on_first_use=False)
    clock = [1_800_000_000.0]
    gpu = FaultyGpu()
    config = Config(
        vllm_url=url,
        vllm_timeout_seconds=TIMEOUT,
        poll_interval_seconds=INTERVAL,
        model_path="meta-llama/Llama-3.1-8B-Instruct",
    )
    deps = PollerDeps(clock=lambda: clock[0], find_processes=lambda _p: [])
    deps.nvml = NvmlReader(gpu)
    app = create_app(config, deps, poll=False)
    runner = web.AppRunner(app, access_log=None, **HANDLER_LIMITS)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    poller = app[POLLER]
    result = Result()
    # Warm-up: the history ring (15 min = 450 polls) full and the scenario replayed once.
    warmup = max(1, min(args.polls // 2, max(args.polls // 10, 1_000)))
    active: tuple[str, int] | None = None  # (fault, polls left)
    recovering: str | None = None
    started = time.perf_counter()
    async with aiohttp.ClientSession() as scraper:

        def timed_out(source: str) -> bool:
            state = poller.snapshot.source(source)
            return state is not None and state.error_kind == "timeout"

        async def poll() -> str:
            await poller.poll_once()
            clock[0] += INTERVAL
            result.polls += 1
            if result.polls % SCRAPE_EVERY == 0:
                async with scraper.get(f"http://127.0.0.1:{port}/metrics") as resp:
                    assert resp.status == 200
                    await resp.read()
                result.scrapes += 1
            return poller.rendered.decode()

        await poll()
        result.checkpoints["start"] = checkpoint(result.polls)
        # A fault under way when the count is reached is seen through to its recovery.
        while result.polls < args.polls or active is not None or recovering is not None:
            if result.polls == warmup:
                if args.tracemalloc:
                    tracemalloc.start()
                result.checkpoints["after warm-up"] = checkpoint(result.polls)
            if result.polls == args.polls // 2 and result.polls > warmup:
                result.checkpoints["halfway"] = checkpoint(result.polls)
            fresh = result.polls < args.polls and active is None and recovering is None
            if fresh and rng.random() < args.fault_rate:
                name = rng.choice(ALL_FAULTS)
                active = (name, rng.randint(1, 3))
                result.tried[name] += 1
                if name in NVML_FAULTS:
                    gpu.fault = NVML_FAULTS[name]
                else:
                    child_fault(name)
            text = await poll()
            if active is not None:
                name, left = active
                source = "nvml" if name in NVML_FAULTS else "vllm"
                expect = 1 if name in VLLM_STAYS_UP else 0
                if source_up(text, source) != expect and not timed_out(source):
                    result.failures.append(f"poll {result.polls}: {name}: {source} not {expect}")
                if left > 1:
                    active = (name, left - 1)
                else:
                    active, recovering = None, name
                    if name in NVML_FAULTS:
                        gpu.fault = None
                    else:
                        child_fault(None)
            elif recovering is not None:
                source = "nvml" if recovering in NVML_FAULTS else "vllm"
                # The first good poll brings the source back; on a loaded machine that poll
                # itself may time out, so up to RECOVERY_POLLS are given (and counted).
                for _ in range(RECOVERY_POLLS):
                    if source_up(text, source) == 1 or not timed_out(source):
                        break
                    result.slow_recoveries += 1
                    text = await poll()
                if source_up(text, source) == 1:
                    result.survived[recovering] += 1
                else:
                    result.failures.append(f"poll {result.polls}: {recovering} not recovered")
                recovering = None
    result.seconds = time.perf_counter() - started
    result.checkpoints["end"] = checkpoint(result.polls)
    if tracemalloc.is_tracing():
        tracemalloc.stop()
    result.events = dict(counter.counts)
    await runner.cleanup()
    ours.send(("stop", None))
    child.join(timeout=10)
    if child.is_alive():
        child.kill()
    return result


def report(result: Result, args: argparse.Namespace) -> dict[str, Any]:
    cp = result.checkpoints
    warm = cp.get("after warm-up", cp["start"])
    end = cp["end"]
    tried, survived = sum(result.tried.values()), sum(result.survived.values())
    half = cp.get("halfway", warm)
    checks = {
        "every fault survived and recovered": tried == survived and not result.failures,
        # Python's own objects are the leak detector: flat from the end of warm-up on.
        "Python objects flat after warm-up (< 1% more)": end.objects < warm.objects * 1.01,
        # RSS also holds what glibc keeps of freed 16 MiB reads; it plateaus within the
        # first half of a long run, so the second half is what must be flat.
        "RSS flat over the second half (< 2 MB)": end.rss_bytes - half.rss_bytes < 2 << 20,
        "no descriptor growth after warm-up": end.fds <= warm.fds,
    }
    if end.traced_bytes is not None and warm.traced_bytes is not None:
        checks["traced Python memory flat (< 1 MB)"] = (
            end.traced_bytes - warm.traced_bytes < 1 << 20
        )
    return {
        "polls": result.polls,
        "scrapes": result.scrapes,
        "seconds": round(result.seconds, 1),
        "sidecar_time_hours": round(result.polls * INTERVAL / 3600, 1),
        "scenario": args.scenario,
        "faults_tried": tried,
        "faults_survived": survived,
        "fault_kinds": len(result.tried),
        "by_fault": {k: [result.tried[k], result.survived[k]] for k in sorted(result.tried)},
        "failures": result.failures[:20],
        "recoveries_delayed_by_a_timeout": result.slow_recoveries,
        "checkpoints": {k: vars(v) for k, v in cp.items()},
        "events": result.events,
        "checks": checks,
    }


def print_human(r: dict[str, Any]) -> None:
    print(
        f"{r['polls']:,} polls in {r['seconds']:.0f} s ({r['sidecar_time_hours']} h of sidecar "
        f"time on the virtual clock), {r['scrapes']:,} scrapes; scenario {r['scenario']} "
        "replayed from the start each time it ends"
    )
    print(
        f"faults: {r['faults_tried']} tried, {r['faults_survived']} survived and recovered "
        f"({r['fault_kinds']} kinds); {r['recoveries_delayed_by_a_timeout']} recovery polls "
        "timed out on a loaded machine and were retried"
    )
    print()
    print(f"{'checkpoint':<15}{'polls':>9}{'RSS MB':>9}{'fds':>6}{'objects':>10}{'traced MB':>11}")
    for name, c in r["checkpoints"].items():
        traced = "–" if c["traced_bytes"] is None else f"{c['traced_bytes'] / 2**20:.2f}"
        print(
            f"{name:<15}{c['polls']:>9,}{c['rss_bytes'] / 2**20:>9.1f}{c['fds']:>6}"
            f"{c['objects']:>10,}{traced:>11}"
        )
    print()
    print("  ".join(f"{k} {t}/{s}" for k, (t, s) in r["by_fault"].items()))
    for failure in r["failures"]:
        print("FAILED:", failure)
    print()
    for check, ok in r["checks"].items():
        print(f"[{'ok' if ok else 'FAIL'}] {check}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--polls", type=int, default=100_000)
    p.add_argument("--fault-rate", type=float, default=0.02, help="chance a poll starts one")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--scenario", default="ramp-to-overload")
    p.add_argument("--tracemalloc", action="store_true", help="trace Python allocations too")
    p.add_argument("--output", choices=("text", "json"), default="text")
    args = p.parse_args(argv)
    result = asyncio.run(soak(args))
    summary = report(result, args)
    if args.output == "json":
        print(json.dumps(summary, indent=2))
    else:
        print_human(summary)
    return 0 if all(summary["checks"].values()) else 1


if __name__ == "__main__":
    threading.current_thread().name = "soak"
    sys.exit(main())
