"""``kv-headroom demo``: the whole product without a GPU or vLLM.

Starts the simulated vLLM on a scenario and the sidecar against it (with a simulated
GPU for its NVML view), prints where to look, and shows a live one-screen summary —
redrawn in place on a terminal, one line every few seconds with ``--plain`` or when the
output is not a terminal. Stops after ``--duration`` or on Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import io
import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from aiohttp import web

from exporter.cli_args import bounded_float
from exporter.config import TIMEOUT_SHARE, Config, ConfigError, load_config
from exporter.deployment import Deployment
from exporter.log import configure
from exporter.poller import Poller, PollerDeps
from exporter.serve_cli import add_config_flag, config_error, config_flags
from exporter.server import HANDLER_LIMITS, POLLER
from exporter.server import create_app as sidecar_app
from exporter.simulator.nvml import SimulatedNvml
from exporter.simulator.scenario import parse_duration
from exporter.simulator.server import create_app as simulator_app
from exporter.simulator.simulation import Simulation, builtin_names, load_scenario
from exporter.snapshot import EngineView, Snapshot
from exporter.sources.nvml import NvmlReader

EXIT_OK, EXIT_BAD_INPUT = 0, 2


DEFAULT_LISTEN = "127.0.0.1:9847"  # the sidecar's port, on loopback: a demo is not a service
DEMO_FLAGS = ("web.listen_address", "poll.interval", "log.level", "log.format")


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="run the sidecar against a simulated vLLM (no GPU, no vLLM needed)",
        description="Starts a simulated vLLM on a scenario and the sidecar against it, prints "
        "where to look, and shows a live one-screen summary: redrawn in place on a terminal, "
        "one line every few seconds with --plain or when the output is not a terminal. Stops "
        "after --duration or on Ctrl-C.",
    )
    p.add_argument(
        "--scenario",
        default="demo",
        help=f"a built-in scenario ({', '.join(builtin_names())}) or a scenario YAML file",
    )
    p.add_argument("--duration", help="stop after this long, e.g. 30s, 5m (default: never)")
    p.add_argument(
        "--speed",
        type=_speed,
        default=1.0,
        help="simulated seconds per second; 5 shows the demo's preemptions within half a minute",
    )
    p.add_argument("--plain", action="store_true", help="plain lines instead of a live screen")
    add_config_flag(p, "web.listen_address", "--listen", default=DEFAULT_LISTEN)
    add_config_flag(p, "poll.interval", "--poll-interval")
    add_config_flag(p, "log.level", default="warning")
    add_config_flag(p, "log.format", default="console")
    p.set_defaults(func=run)


_speed = bounded_float(1000, "a number", "5")


def run(args: argparse.Namespace) -> int:
    flags = config_flags(args, DEMO_FLAGS)
    flags["web.listen_address"] = flags["web.listen_address"] or DEFAULT_LISTEN
    flags["log.level"] = flags["log.level"] or "warning"
    flags["log.format"] = flags["log.format"] or "console"
    try:
        # The same checks and the same words as serve's, for the flags the two share.
        settings = load_config(flags, {})
    except ConfigError as e:
        config_error("demo", e)
        return EXIT_BAD_INPUT
    scenario = load_scenario(args.scenario)
    duration = parse_duration(args.duration, "--duration", "") if args.duration else None
    live = sys.stdout.isatty() and not args.plain
    # Logs go to stderr, never among the screen's or the plain lines; at warning level by
    # default, since a demo's info events (sources coming up) are noise to a first-time user.
    # On a terminal that also shows the live screen, stderr is that screen: hold the lines
    # back and print them once the screen stops, rather than tear it between redraws.
    held = HeldLines() if live and sys.stderr.isatty() else None
    configure(settings.log_level, settings.log_format, held if held is not None else sys.stderr)
    try:
        return asyncio.run(
            demo(
                scenario_name=args.scenario,
                sim=Simulation(scenario, start_time=time.time()),
                host=settings.listen_host or "127.0.0.1",
                port=settings.listen_port,
                interval=settings.poll_interval_seconds,
                speed=args.speed,
                duration=duration,
                live=live,
                out=sys.stdout,
            )
        )
    finally:
        if held is not None:
            sys.stderr.write(held.text())


class HeldLines(io.StringIO):
    """Log lines kept while the live screen is up, the last ``MAX_HELD`` of them."""

    MAX_HELD = 200

    def __init__(self) -> None:
        super().__init__()
        self._lines: collections.deque[str] = collections.deque(maxlen=self.MAX_HELD)

    def write(self, text: str) -> int:
        self._lines.extend(line for line in text.splitlines() if line)
        return len(text)

    def isatty(self) -> bool:
        return False

    def text(self) -> str:
        return "".join(line + "\n" for line in self._lines)


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

    config = sidecar_config(sim, vllm_url, host, port, interval)
    deps = sidecar_deps(sim)
    app = sidecar_app(config, deps)
    runner = web.AppRunner(app, access_log=None, **HANDLER_LIMITS)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    moved = ""
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
        moved = f"{host}:{port} is taken ({e.strerror}); listening on port {_port(site)} instead"
        print(f"kv-headroom demo: {moved}", file=sys.stderr)
    header = banner(scenario_name, sim, vllm_url, f"http://{host}:{_port(site)}", speed)
    if moved:  # the live screen's first redraw wipes what stderr said
        header.append(f"  note             {moved}")
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


def sidecar_config(sim: Simulation, vllm_url: str, host: str, port: int, interval: float) -> Config:
    """The sidecar's settings against the simulated vLLM: what a deploy would set by hand."""
    plan = sim.sizing.plan
    return Config(
        vllm_url=vllm_url,
        listen_host=host,
        listen_port=port,
        poll_interval_seconds=interval,
        vllm_timeout_seconds=min(1.5, TIMEOUT_SHARE * interval),
        model_path=sim.sizing.model_name,
        deployment=Deployment(
            max_num_seqs=plan.max_num_seqs,
            max_num_batched_tokens=plan.max_num_batched_tokens,
            tensor_parallel_size=plan.request.tensor_parallel_size,
        ),
    )


def sidecar_deps(sim: Simulation, clock: Callable[[], float] = time.time) -> PollerDeps:
    """The simulated GPU in place of NVML; no process scan (there is no vLLM process)."""
    nvml = SimulatedNvml(f"NVIDIA {sim.sizing.gpu.name}", sim.gpu_memory, os.getpid())
    return PollerDeps(clock=clock, nvml=NvmlReader(nvml), find_processes=lambda _p: [])


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


def banner(
    scenario_name: str, sim: Simulation, vllm_url: str, sidecar: str, speed: float
) -> list[str]:
    """What is running and where to look, printed once above the live screen."""
    lines = [
        f"kv-headroom demo · scenario {scenario_name}: {sim.scenario.description.strip()}",
        f"  status page      {sidecar}/   ← risk, what limits the engine, history, capacity",
        f"  sidecar metrics  {sidecar}/metrics",
        f"  simulated vLLM   {vllm_url}/metrics",
    ]
    if speed == 1.0:
        lines.append(
            "  in a hurry?      kv-headroom demo --speed 5   (simulated time runs 5× faster)"
        )
    return lines


def summary(snap: Snapshot, sim: Simulation, elapsed: float) -> str:
    """The one-screen view: the risk and what limits the engine first, then the numbers."""
    lines = [f"t = {elapsed:6.0f} s   simulated {sim.now:6.0f} s of {sim.scenario.duration:.0f} s"]
    plan = snap.expected
    if not snap.engines:
        lines.append("waiting for the first poll…")
        return "\n".join(lines)
    v = snap.engines[0]
    lines += [risk_line(v), load_line(v), limit_line(v)]
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
    for g in snap.gpus:
        lines.append(
            f"GPU {g.index}      {g.used_bytes / 2**30:.1f} of {g.total_bytes / 2**30:.1f} GiB used"
            + (f", {g.foreign_bytes / 2**30:.1f} GiB foreign" if g.foreign_bytes else "")
        )
    return "\n".join(lines)


def exhaustion_text(seconds: float) -> str:
    """When the risk's own forecast crosses the cache's size. +Inf is no time at all but
    "the forecast never gets there": said in words, never as "in inf s"."""
    return (
        "exhaustion: not on this trend"
        if math.isinf(seconds)
        else f"exhaustion in {seconds:,.0f} s"
    )


def risk_line(v: EngineView) -> str:
    """The headline: how likely vLLM preempts soon, the forecast the score rests on, and
    when that forecast would run the cache out — one forecast, so the three agree."""
    r = v.risk
    if r is None:
        return "risk       – (no opinion yet: the model needs a few polls of history)"
    return (
        f"risk       {r.preemption_risk:4.2f}   forecast {r.forecast_usage:.2f} of the cache   "
        f"{exhaustion_text(r.seconds_to_exhaustion)}   overcommit {r.overcommit_ratio:.2f}×"
    )


def load_line(v: EngineView) -> str:
    """The load headroom, under the risk: how many times today's traffic the engine holds
    and what gives out first; the one number an autoscaler would act on."""
    ratio = v.load_headroom_ratio
    if ratio is None:
        return "load       – (no traffic to scale yet)"
    return (
        f"load       {ratio:.2f}× today's traffic fits · "
        f"{v.load_headroom_resource or '–'} gives out first (below 1: scale out)"
    )


def bottleneck(v: EngineView) -> tuple[str | None, str]:
    """What limits the engine and the evidence, where this build's snapshot says.

    Read with getattr: the fields arrive with the bottleneck model, and the demo and the
    status page must work with a snapshot from before it as well as after.
    """
    return getattr(v, "bottleneck", None), str(getattr(v, "bottleneck_evidence", "") or "")


def limit_line(v: EngineView) -> str:
    what, why = bottleneck(v)
    if what is None:
        return "limited by –"
    return f"limited by {what}" + (f" · {why}" if why else "")


def plain_line(snap: Snapshot, sim: Simulation, elapsed: float) -> str:
    if not snap.engines:
        return f"t={elapsed:.0f}s waiting for the first poll"
    v = snap.engines[0]
    usage = (v.kv_usage or 0.0) * 100
    risk = forecast = exhaustion = "–"
    if v.risk is not None:
        risk, forecast = f"{v.risk.preemption_risk:.2f}", f"{v.risk.forecast_usage:.2f}"
        # One word per field, so the line still splits on spaces.
        tte = v.risk.seconds_to_exhaustion
        exhaustion = "not-on-this-trend" if math.isinf(tte) else f"{tte:,.0f}s"
    what, why = bottleneck(v)
    ratio = v.load_headroom_ratio
    held = "–" if ratio is None else f"{ratio:.2f}"
    # The evidence is prose: quoted and last, so the line still splits on spaces before it.
    because = f" why={json.dumps(why, ensure_ascii=False)}" if why else ""
    return (
        f"t={elapsed:.0f}s sim={sim.now:.0f}s risk={risk} forecast={forecast} "
        f"exhaustion={exhaustion} "
        f"load_headroom={held} binds={v.load_headroom_resource or '–'} "
        f"limit={what or '–'} usage={usage:.1f}% running={_fmt(v.running)} "
        f"waiting={_fmt(v.waiting)} free_p95={_fmt(v.free_sequences.get('p95'))} "
        f"preemptions={v.preemptions_total:.0f}{because}"
    )
