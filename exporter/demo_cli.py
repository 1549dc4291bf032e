"""``kv-headroom demo``: the whole product without a GPU or vLLM.

Starts the simulated vLLM on a scenario and the sidecar against it (with a simulated
GPU for its NVML view), prints where to look, and shows a live one-screen summary —
redrawn in place on a terminal, one line every few seconds with ``--plain`` or when the
output is not a terminal. Stops after ``--duration`` or on Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import signal
import sys
import time
from typing import Any, TextIO

from aiohttp import web

from exporter.config import Config, Deployment
from exporter.log import configure
from exporter.poller import Poller, PollerDeps
from exporter.server import HANDLER_LIMITS, POLLER
from exporter.server import create_app as sidecar_app
from exporter.simulator.nvml import SimulatedNvml
from exporter.simulator.scenario import parse_duration
from exporter.simulator.server import create_app as simulator_app
from exporter.simulator.simulation import Simulation, builtin_names, load_scenario
from exporter.snapshot import EngineView, Snapshot
from exporter.sources.nvml import NvmlReader

EXIT_OK = 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="run the sidecar against a simulated vLLM (no GPU, no vLLM needed)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--scenario",
        default="demo",
        help=f"a built-in scenario ({', '.join(builtin_names())}) or a scenario YAML file",
    )
    p.add_argument("--duration", help="stop after this long, e.g. 30s, 5m (default: never)")
    p.add_argument("--speed", type=float, default=1.0, help="simulated seconds per second")
    p.add_argument("--plain", action="store_true", help="plain lines instead of a live screen")
    p.add_argument("--listen", default="127.0.0.1:9847", help="the sidecar's address")
    p.add_argument("--poll-interval", default="2s", help="the sidecar's poll interval")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    scenario = load_scenario(args.scenario)
    duration = parse_duration(args.duration, "--duration", "") if args.duration else None
    interval = parse_duration(args.poll_interval, "--poll-interval", "")
    host, _, port = args.listen.rpartition(":")
    live = sys.stdout.isatty() and not args.plain
    # Logs would tear the live screen; keep them for problems only.
    configure("warning" if live else "info", "console" if live else "json", sys.stderr)
    return asyncio.run(
        demo(
            scenario_name=args.scenario,
            sim=Simulation(scenario, start_time=time.time()),
            host=host or "127.0.0.1",
            port=int(port),
            interval=interval,
            speed=args.speed,
            duration=duration,
            live=live,
            out=sys.stdout,
        )
    )


async def demo(
    *,
    scenario_name: str,
    sim: Simulation,
    host: str,
    port: int,
    interval: float,
    speed: float,
    duration: float | None,
    live: bool,
    out: TextIO,
) -> int:
    sim_runner = web.AppRunner(simulator_app(sim, speed=speed), access_log=None)
    await sim_runner.setup()
    sim_site = web.TCPSite(sim_runner, "127.0.0.1", 0)
    await sim_site.start()
    vllm_url = f"http://127.0.0.1:{_port(sim_site)}"

    plan = sim.sizing.plan
    config = Config(
        vllm_url=vllm_url,
        listen_host=host,
        listen_port=port,
        poll_interval_seconds=interval,
        vllm_timeout_seconds=min(1.5, interval / 2),
        model_path=sim.sizing.model_name,
        deployment=Deployment(
            max_num_seqs=plan.max_num_seqs,
            max_num_batched_tokens=plan.max_num_batched_tokens,
            tensor_parallel_size=plan.request.tensor_parallel_size,
        ),
    )
    nvml = SimulatedNvml(f"NVIDIA {sim.sizing.gpu.name}", sim.gpu_memory, os.getpid())
    deps = PollerDeps(nvml=NvmlReader(nvml), find_processes=lambda _p: [])
    app = sidecar_app(config, deps)
    runner = web.AppRunner(app, access_log=None, **HANDLER_LIMITS)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as e:
        # A sidecar (or an earlier demo) often holds the default port: the demo is a
        # look around, so any free port will do, as long as the user is told which.
        site = web.TCPSite(runner, host, 0)
        try:
            await site.start()
        except OSError:
            print(
                f"kv-headroom demo: cannot listen on {host}:{port}: {e.strerror}", file=sys.stderr
            )
            await runner.cleanup()
            await sim_runner.cleanup()
            return 1
        print(
            f"kv-headroom demo: {host}:{port} is taken ({e.strerror}); "
            f"listening on port {_port(site)} instead",
            file=sys.stderr,
        )
    sidecar = f"http://{host}:{_port(site)}"
    header = [
        f"kv-headroom demo · scenario {scenario_name}: {sim.scenario.description.strip()}",
        f"  simulated vLLM   {vllm_url}/metrics",
        f"  sidecar metrics  {sidecar}/metrics",
        f"  status page      {sidecar}/",
    ]
    print("\n".join(header), file=out, flush=True)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    started = loop.time()
    poller: Poller = app[POLLER]
    last_plain = -1e9
    try:
        while not stop.is_set():
            elapsed = loop.time() - started
            if duration is not None and elapsed >= duration:
                break
            if sim.done:
                break
            if live:
                screen = summary(poller.snapshot, sim, elapsed)
                out.write("\x1b[H\x1b[2J" + "\n".join(header) + "\n\n" + screen + "\n")
                out.flush()
            elif elapsed - last_plain >= max(5.0, interval):
                out.write(plain_line(poller.snapshot, sim, elapsed) + "\n")
                out.flush()
                last_plain = elapsed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=1.0)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        out.write(plain_line(poller.snapshot, sim, loop.time() - started) + "\n")
        out.write("stopped.\n")
        out.flush()
        await runner.cleanup()
        await sim_runner.cleanup()
    return EXIT_OK


def _port(site: web.TCPSite) -> int:
    server = site._server
    assert server is not None
    sockets = getattr(server, "sockets", None)
    assert sockets
    return int(sockets[0].getsockname()[1])


def _bar(ratio: float, width: int = 30) -> str:
    filled = round(max(0.0, min(1.0, ratio)) * width)
    return "█" * filled + "░" * (width - filled)


def _fmt(value: float | None, unit: str = "") -> str:
    return "–" if value is None else f"{value:,.0f}{unit}"


def summary(snap: Snapshot, sim: Simulation, elapsed: float) -> str:
    """The one-screen view: capacity, usage, headroom, preemptions, risk."""
    lines = [f"t = {elapsed:6.0f} s   simulated {sim.now:6.0f} s of {sim.scenario.duration:.0f} s"]
    plan = snap.expected
    if not snap.engines:
        lines.append("waiting for the first poll…")
        return "\n".join(lines)
    v = snap.engines[0]
    expected = f" (expected {plan.cap.num_blocks:,})" if plan else ""
    lines.append(
        f"capacity   {_fmt(v.num_blocks)} blocks × {v.block_size} = "
        f"{_fmt(v.capacity_tokens)} tokens{expected}"
    )
    usage = v.kv_usage or 0.0
    lines.append(
        f"KV usage   {_bar(usage)} {usage * 100:5.1f} %   running {_fmt(v.running)}   "
        f"waiting {_fmt(v.waiting)}"
    )
    if v.occupancy is not None:
        p95 = v.contexts.get("p95")
        lines.append(
            f"headroom   {v.occupancy.free_tokens:,} tokens free · "
            f"{_fmt(v.free_sequences.get('p95'))} more sequences fit at p95"
            + (f" ({p95:,.0f} tokens)" if p95 else "")
        )
    if v.context is not None:
        q = v.context.quantiles
        lines.append(
            f"context    p50 {q['p50']:,.0f}   p95 {q['p95']:,.0f}   p99 {q['p99']:,.0f} tokens"
            f" · {v.sequences_per_request:.1f} sequences per request"
        )
    lines.append(f"preempted  {v.preemptions_total:,.0f} times since the sidecar started")
    lines.insert(1, risk_line(v))
    for g in snap.gpus:
        lines.append(
            f"GPU {g.index}      {g.used_bytes / 2**30:.1f} of {g.total_bytes / 2**30:.1f} GiB used"
            + (f", {g.foreign_bytes / 2**30:.1f} GiB foreign" if g.foreign_bytes else "")
        )
    return "\n".join(lines)


def _seconds(value: float) -> str:
    return "never" if math.isinf(value) else f"{value:,.0f} s"


def risk_line(v: EngineView) -> str:
    """The headline: how likely vLLM preempts soon, and when the cache would run out."""
    r = v.risk
    if r is None:
        return "risk       – (no opinion yet)"
    return (
        f"risk       {r.preemption_risk:4.2f}   exhaustion in {_seconds(r.seconds_to_exhaustion)}"
        f"   overcommit {r.overcommit_ratio:.2f}×"
    )


def plain_line(snap: Snapshot, sim: Simulation, elapsed: float) -> str:
    if not snap.engines:
        return f"t={elapsed:.0f}s waiting for the first poll"
    v = snap.engines[0]
    usage = (v.kv_usage or 0.0) * 100
    risk = "–" if v.risk is None else f"{v.risk.preemption_risk:.2f}"
    exhaustion = "–" if v.risk is None else _seconds(v.risk.seconds_to_exhaustion).replace(" ", "")
    return (
        f"t={elapsed:.0f}s sim={sim.now:.0f}s risk={risk} exhaustion={exhaustion} "
        f"usage={usage:.1f}% running={_fmt(v.running)} "
        f"waiting={_fmt(v.waiting)} free_p95={_fmt(v.free_sequences.get('p95'))} "
        f"preemptions={v.preemptions_total:.0f}"
    )
