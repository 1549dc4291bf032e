"""The whole product on real vLLM 0.32 (CPU), the way a user runs it.

Per architecture: a vLLM server (dummy weights, a small KV cache), ``kv-headroom serve``
next to it, and one Prometheus with rules/ scraping every vLLM and sidecar each second.
First streamed requests of known length, one at a time until the sidecar has read one
running (tokens per running sequence) three times, then one
closed-loop client for at least SAFE_S seconds and until the sidecar has watched vLLM long
enough to project a trend (``safe_phase``; safe: the risk must stay low), then one more
client every STEP_S seconds, up to as many as must overfill the cache twice whatever the
machine's speed (``most_clients``), until vLLM counts a preemption (the context quantiles
are checked then). The architectures run side by side; afterwards the load stops and
Prometheus is watched until both alerts have resolved. Everything started is stopped by
process group, whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from exporter.risk.model import (
    ALERT_FOR_SECONDS,
    LEVEL_SECONDS,
    TREND_MIN_SECONDS,
    WARNING_FOR_SECONDS,
    page_holds,
    warning_holds,
)
from tests.conftest import FIXTURES
from tests.e2e.gauges import Reading, reading, value
from tests.e2e.vllm_harness import (
    RampResult,
    Request,
    Sample,
    VllmServer,
    drive_ramp,
    stream_one,
)
from tests.processes import Prometheus, Sidecar

IMMINENT = "VllmKvCachePreemptionImminent"
LIKELY = "VllmKvCachePreemptionLikely"
PREEMPTING = "VllmKvCachePreempting"
# The safe phase's score is checked from LEVEL_SECONDS in: until then the level (the occupancy's
# mean over LEVEL_SECONDS) still holds the probes', one 1,800-token request a quarter of the
# cache, and the score with it (a clean clone's CI: 0.99 as the phase began, 0.55 at 30 s,
# 0.39 at 38 s under one client at 10 % usage). Then SAFE_CHECKED_S of the safe load alone.
SAFE_CHECKED_S = 30.0
SAFE_S = LEVEL_SECONDS + SAFE_CHECKED_S
# The ramp starts once the sidecar's history is this much past TREND_MIN_SECONDS: a sidecar
# that has watched its vLLM for hours projects the ramp's trend from its first step, which
# is what the stack checks. Before, the ramp started SAFE_S after the probes, however long
# they had taken: the score jumped from about 0.1 to 0.99 when the trend came, 35-51 s
# into the ramp here and later where the probes were quicker (stop 53's CI run had the
# warning +3 s before the first preemption, and Prometheus's 4 s after it).
TREND_MARGIN_S = 10.0
STEP_S = 20.0
AFTER_PREEMPTION_S = 5.0
# The requests' lengths (request_mix): the least of both is what a client surely holds.
PROMPT = (200, 600)
ANSWER = (300, 800)
# How long the ramp may take once every client runs: the time, at the rate the server has
# generated tokens so far, to generate the cache's size FILLS times over (at least
# MIN_FILL_S). A machine that generates nothing still stops at RAMP_CEILING_S.
FILLS = 10
MIN_FILL_S = 120.0
RAMP_CEILING_S = 1800.0
# VllmKvCachePreempting looks back 5 minutes: it resolves that long after the last one.
RESOLVE_BOUND_S = 7 * 60.0
PROBE = Request(prompt_tokens=300, max_tokens=1500)
# Stream probes one after another until the sidecar has reported this many readings of one,
# at most PROBE_TRIES: a fast server streams a probe in a few seconds, one or two polls.
PROBE_READINGS = 3
PROBE_TRIES = 10
# How late a streamed token may reach the client after vLLM counted it in its cache: the
# API server that renders /metrics also streams the tokens, and a loaded CI machine held
# them back more than a second (the sidecar saw 15 more tokens than the stream had shown).
DELIVERY_S = 3.0


@dataclass(frozen=True)
class Architecture:
    name: str
    config: Path
    served_name: str
    extra_args: tuple[str, ...]
    # The servers run side by side: each one's compute threads on a core of its own, so
    # that neither starves the other (or its own API server) on a small machine.
    cpus: str
    tokens: int  # the KV cache the ramp is sized for, checked when the server is up


ARCHITECTURES = (
    # 4 layers, 2 KV heads of 32: 1,024 bytes per token; 48 blocks of 128 (BASE_ARGS).
    Architecture(
        "llama-gqa", FIXTURES / "vllm" / "tinyllama.config.json", "tinyllama", (), "0", 6_144
    ),
    # MLA: 4 layers of one (512 + 64)-wide latent: 4,608 bytes per token; 400 blocks of 16.
    # The reference CPU MLA backend on every machine: on a CPU with AMX tiles vLLM 0.32
    # picks its AMX one, whose 128-token blocks made the 400 blocks 51,200 tokens, which
    # the ramp never filled (vllm_harness.KV_CACHE_TOKENS).
    Architecture(
        "deepseek-mla",
        FIXTURES / "vllm" / "tinydeepseek.config.json",
        "tinydeepseek",
        ("--num-gpu-blocks-override", "400", "--attention-backend", "CPU_MLA"),
        "1",
        6_400,
    ),
)


def request_mix(rng: random.Random) -> Request:
    return Request(rng.randint(*PROMPT), rng.randint(*ANSWER))


def most_clients(tokens: int) -> int:
    """Closed-loop clients whose shortest requests alone hold twice a cache of ``tokens``:
    vLLM admits a request whose prompt fits and grows it as it decodes, so with this many
    it must run out of blocks and preempt, on a machine of any speed."""
    return math.ceil(2 * tokens / (PROMPT[0] + ANSWER[0]))


def safe_phase(history: float | None) -> float:
    """Seconds of one client, for a sidecar that has ``history`` seconds of its vLLM when
    the run starts: SAFE_S, or longer until the trend has TREND_MARGIN_S of history."""
    return max(SAFE_S, TREND_MIN_SECONDS + TREND_MARGIN_S - (history or 0.0))


def clients(elapsed: float, tokens: int, safe: float = SAFE_S) -> int:
    """One client while safe; then two, one more every STEP_S seconds, up to most_clients."""
    ramp = 1 if elapsed < safe else 2 + int((elapsed - safe) // STEP_S)
    return min(ramp, most_clients(tokens))


def ramp_bound(samples: Sequence[Sample], tokens: int, safe: float = SAFE_S) -> float:
    """Seconds the ramp may run, from what the server has done so far: until its last
    client starts, then FILLS caches' worth of tokens at the rate it has generated them."""
    last_client = safe + (most_clients(tokens) - 2) * STEP_S
    span = samples[-1].t - samples[0].t if samples else 0.0
    rate = (samples[-1].generated - samples[0].generated) / span if span > 0 else 0.0
    fill = FILLS * tokens / rate if rate > 0 else math.inf
    return min(RAMP_CEILING_S, last_client + max(MIN_FILL_S, fill))


def first_preemption(samples: Sequence[Sample]) -> float | None:
    """When vLLM's preemption counter first moved (the sample that shows it)."""
    return next((s.t for s in samples if s.preemptions > samples[0].preemptions), None)


# (time, preemption_risk, kv_usage_max_1m_ratio, kv_usage_max_30s_ratio) at one read of
# the sidecar's /metrics: the score and each alert's usage gate, as the rules read them.
Gates = tuple[float, float, float | None, float | None]


def held_at(series: Sequence[Gates], holds: Callable[[Gates], bool], hold: float) -> float | None:
    """When ``holds`` had held at every read for ``hold`` seconds (a rule's for:), or None."""
    pending = None
    for gates in series:
        if holds(gates):
            pending = gates[0] if pending is None else pending
            if gates[0] - pending >= hold:
                return gates[0]
        else:
            pending = None
    return None


def alert_fired_at(series: Sequence[Gates], warning: bool = False) -> float | None:
    """The shipped page (or, with ``warning``, the warning), Prometheus's for: included, on
    the sidecar's own series: the score and the usage peak it exports for the alert's gate."""
    if warning:
        return held_at(series, lambda g: warning_holds(g[1], g[3]), WARNING_FOR_SECONDS)
    return held_at(series, lambda g: page_holds(g[1], g[2]), ALERT_FOR_SECONDS)


@dataclass
class ArchRun:
    arch: Architecture
    sidecar: str  # host:port, the instance label Prometheus gives it
    vllm_text: str = ""  # vLLM's /metrics after the probe
    sidecar_text: str = ""  # the sidecar's, right after
    # (sidecar tokens per running sequence, tokens the client had when the sidecar's poll
    # of vLLM began, tokens it had DELIVERY_S after that poll ended)
    probe: list[tuple[float, int, int]] = field(default_factory=list)
    probes_streamed: int = 0  # each one is a finished request of PROBE's length
    # The sidecar's /metrics when vLLM first counted a preemption, and the requests that
    # had finished by then (all of them whole: none aborted yet).
    context_text: str = ""
    context_completions: list[tuple[float, int, int]] = field(default_factory=list)
    ramp: RampResult = field(default_factory=lambda: RampResult([]))
    # what the page and the warning read, at each read of the sidecar (``Gates``)
    risk: list[Gates] = field(default_factory=list)
    readings: list[Reading] = field(default_factory=list)  # the sidecar's gauges, each second
    load_stopped: float = 0.0
    unanswered: int = 0  # the watcher's reads of the sidecar that got no answer in time
    safe: float = SAFE_S  # how long one client ran (safe_phase)

    @property
    def started(self) -> float:
        return self.ramp.samples[0].t

    @property
    def first_preemption(self) -> float | None:
        return first_preemption(self.ramp.samples)

    @property
    def safe_risk(self) -> list[float]:
        """The risk while one client ran, once the level held only its load (SAFE_S)."""
        start = self.started + LEVEL_SECONDS
        return [v for t, v, *_ in self.risk if start <= t <= self.started + self.safe]

    @property
    def preemptions(self) -> float:
        return self.ramp.samples[-1].preemptions - self.ramp.samples[0].preemptions


@dataclass
class StackRun:
    archs: dict[str, ArchRun]
    # (alert name, sidecar instance) -> [(firing from, until or None while it still fires)]
    alerts: dict[tuple[str, str], list[list[float | None]]] = field(default_factory=dict)
    quiet_at: float | None = None  # when none of the two alerts fired any more
    load_stopped: float = 0.0
    unanswered: int = 0  # reads of Prometheus's alerts that got no answer in time

    def first(self, alert: str, run: ArchRun) -> float | None:
        episodes = self.alerts.get((alert, run.sidecar), [])
        return episodes[0][0] if episodes else None


# The watchers below read every second from processes on a 2-core machine that two vLLM
# engines keep busy: one read that gets no answer within its 5 s (Prometheus or the sidecar
# starved of CPU for a moment) costs a sample, not the run. Answers missing this long do.
MISSING_LIMIT_S = 60.0
T = TypeVar("T")


class _Answers:
    """A watcher's reads: how many went unanswered, and for how long in a row."""

    def __init__(self, what: str) -> None:
        self.what, self.missed = what, 0
        self._since: float | None = None

    async def read(self, fn: Callable[[], T], errors: type[Exception]) -> T | None:
        """``fn()`` in a thread; None, after a second's pause, when it got no answer."""
        try:
            result = await asyncio.to_thread(fn)
        except errors as error:
            self.missed += 1
            now = time.monotonic()
            since = self._since = self._since or now
            if now - since > MISSING_LIMIT_S:
                raise RuntimeError(
                    f"{self.what}: no answer for {MISSING_LIMIT_S:.0f} s ({error})"
                ) from None
            await asyncio.sleep(1.0)
            return None
        self._since = None
        return result


async def _probe(server: VllmServer, sidecar: Sidecar, run: ArchRun) -> None:
    while len(run.probe) < PROBE_READINGS and run.probes_streamed < PROBE_TRIES:
        await _probe_once(server, sidecar, run)
    run.vllm_text = await asyncio.to_thread(server.metrics_text)
    run.sidecar_text = await asyncio.to_thread(sidecar.metrics)


async def _probe_once(server: VllmServer, sidecar: Sidecar, run: ArchRun) -> None:
    """One probe from an idle server (as the sidecar sees it, so that every reading of one
    running request is of this one), the sidecar read every 0.5 s while it streams.

    Each reading is placed in the stream by the sidecar's own clock: its poll of vLLM
    began at ``source_last_success_timestamp_seconds`` and took
    ``source_poll_duration_seconds``. So no reading of an earlier probe counts, and the
    check holds on a machine of any speed."""
    progress: list[tuple[float, int]] = []

    async def on_progress(n: int) -> None:
        progress.append((time.time(), n))

    def streamed_at(t: float) -> int:
        return max((n for when, n in progress if when <= t), default=0)

    deadline = time.monotonic() + 60
    while value(await asyncio.to_thread(sidecar.metrics), "kv_headroom_requests_running") != 0:
        assert time.monotonic() < deadline, "the server never looked idle to the sidecar"
        await asyncio.sleep(0.5)
    sent = time.time()
    task = asyncio.create_task(
        stream_one(server.url, model=server.model, request=PROBE,
                   seed=987_654 + run.probes_streamed, on_progress=on_progress)
    )  # fmt: skip
    polls: dict[float, tuple[float, float]] = {}  # poll began -> (tokens per sequence, ended)
    while not task.done():
        text = await asyncio.to_thread(sidecar.metrics)
        began = value(text, "kv_headroom_source_last_success_timestamp_seconds", source="vllm")
        took = value(text, "kv_headroom_source_poll_duration_seconds", source="vllm")
        per_seq = value(text, "kv_headroom_tokens_per_running_sequence", engine="0")
        one = value(text, "kv_headroom_requests_running") == 1
        # began >= sent: a poll of this probe, not of the idle server before it
        if one and began is not None and began >= sent and took is not None and per_seq is not None:
            polls[began] = (per_seq, began + took)
        await asyncio.sleep(0.5)
    await task
    run.probes_streamed += 1
    for began, (per_seq, ended) in sorted(polls.items()):
        run.probe.append((per_seq, streamed_at(began), streamed_at(ended + DELIVERY_S)))


async def _arch(arch: Architecture, server: VllmServer, sidecar: Sidecar, run: ArchRun) -> None:
    await _probe(server, sidecar, run)
    history = value(run.sidecar_text, "kv_headroom_risk_history_seconds", engine="0")
    run.safe = safe_phase(history)
    done = asyncio.Event()

    answers = _Answers(f"{arch.name} sidecar /metrics")

    async def watch() -> None:
        while not done.is_set():
            text = await answers.read(sidecar.metrics, AssertionError)
            run.unanswered = answers.missed
            if text is None:
                continue
            now = time.time()
            run.readings.append(reading(now, text))
            last = run.readings[-1]
            if last.risk is not None:
                run.risk.append((now, last.risk, last.peak_page, last.peak_warning))
            if not run.context_text and first_preemption(run.ramp.samples) is not None:
                run.context_text = text
                run.context_completions = list(run.ramp.completions)
            await asyncio.sleep(1.0)

    def enough(samples: Sequence[Sample]) -> bool:
        first = first_preemption(samples)
        return first is not None and samples[-1].t - first >= AFTER_PREEMPTION_S

    watcher = asyncio.create_task(watch())
    try:
        await drive_ramp(
            server.url, model=server.model,
            concurrency=lambda t: clients(t, arch.tokens, run.safe),
            requests=request_mix, until=enough,
            bound=lambda s: ramp_bound(s, arch.tokens, run.safe),
            seed=ARCHITECTURES.index(arch), result=run.ramp,
        )  # fmt: skip
    finally:
        run.load_stopped = time.time()
        done.set()
        await watcher


async def _watch_alerts(prom: Prometheus, run: StackRun, stop: asyncio.Event) -> None:
    ours = (IMMINENT, LIKELY, PREEMPTING)
    answers = _Answers("Prometheus /api/v1/alerts")
    while not stop.is_set():
        alerts = await answers.read(lambda: prom.api("alerts"), RuntimeError)
        run.unanswered = answers.missed
        if alerts is None:
            continue
        now = time.time()
        firing = {
            (a["labels"]["alertname"], a["labels"].get("instance", ""))
            for a in alerts["alerts"]
            if a["state"] == "firing" and a["labels"]["alertname"] in ours
        }
        for key in firing:
            episodes = run.alerts.setdefault(key, [])
            if not episodes or episodes[-1][1] is not None:
                episodes.append([now, None])
        for key, episodes in run.alerts.items():
            if key not in firing and episodes[-1][1] is None:
                episodes[-1][1] = now
        if run.load_stopped and run.alerts and not firing:
            run.quiet_at = now
            return
        await asyncio.sleep(1.0)


async def run_stack(
    servers: dict[str, VllmServer],
    while_resolving: Callable[[], Coroutine[Any, Any, None]] | None = None,
) -> StackRun:
    """The stack run; ``while_resolving`` runs (to completion) once the load has stopped,
    alongside the minutes of waiting for the alerts to resolve, when the servers idle."""
    args = ("--no-nvml.enabled",)  # otherwise the defaults: a 2 s poll, a 1.5 s timeout
    sidecars = {
        a.name: Sidecar(servers[a.name].url, "--model.path", str(a.config), *args)
        for a in ARCHITECTURES
    }
    hostport = {name: s.url.removeprefix("http://") for name, s in sidecars.items()}
    prom = Prometheus(
        {
            "vllm": [s.url.removeprefix("http://") for s in servers.values()],
            "kv-headroom": list(hostport.values()),
        }
    )
    run = StackRun({a.name: ArchRun(a, hostport[a.name]) for a in ARCHITECTURES})
    try:
        await asyncio.gather(
            *(asyncio.to_thread(s.start) for s in sidecars.values()), asyncio.to_thread(prom.start)
        )
        stop = asyncio.Event()
        alerts = asyncio.create_task(_watch_alerts(prom, run, stop))
        try:
            await asyncio.gather(
                *(_arch(a, servers[a.name], sidecars[a.name], run.archs[a.name])
                  for a in ARCHITECTURES)
            )  # fmt: skip
            run.load_stopped = time.time()
            meanwhile = asyncio.create_task(while_resolving()) if while_resolving else None
            with contextlib.suppress(TimeoutError):  # the resolution test says so
                await asyncio.wait_for(asyncio.shield(alerts), RESOLVE_BOUND_S)
            if meanwhile is not None:
                await meanwhile
        finally:
            stop.set()
            await alerts
        for name, sidecar in sidecars.items():
            assert "Traceback" not in sidecar.log(tail=1_000_000), f"{name}: {sidecar.log()}"
    finally:
        for sidecar in sidecars.values():
            sidecar.cleanup()
        prom.cleanup()
    return run


def summary(run: StackRun) -> str:
    lines = []
    for name, a in run.archs.items():
        tokens = value(a.sidecar_text, "kv_headroom_kv_capacity_tokens", source="observed")
        blocks = value(a.sidecar_text, "kv_headroom_kv_capacity_blocks", source="observed")
        expected = value(a.sidecar_text, "kv_headroom_kv_capacity_tokens", source="expected")
        fired, warned = alert_fired_at(a.risk), alert_fired_at(a.risk, warning=True)
        first = a.first_preemption
        lead = f"{first - fired:+.0f} s" if fired and first else "never"
        early = f"{first - warned:+.0f} s" if warned and first else "never"
        imminent, preempting = run.first(IMMINENT, a), run.first(PREEMPTING, a)
        prom_lead = f"{preempting - imminent:+.0f} s" if imminent and preempting else "n/a"
        likely = run.first(LIKELY, a)
        prom_early = f"{preempting - likely:+.0f} s" if likely and preempting else "n/a"
        lines.append(
            f"{name}: capacity {tokens:,.0f} tokens in {blocks:,.0f} blocks (expected "
            f"{expected:,.0f}); risk while safe ({a.safe:.0f} s of one client) at most "
            f"{max(a.safe_risk, default=0):.2f}; "
            f"first preemption counted {first - a.started:.0f} s into the run, "
            f"{a.preemptions:g} in all; page {lead} and warning {early} before it; in Prometheus "
            f"{IMMINENT} {prom_lead} and {LIKELY} {prom_early} before {PREEMPTING}; "
            f"{a.unanswered} reads unanswered"
            if tokens is not None and blocks is not None and expected is not None and first
            else f"{name}: incomplete run"
        )
    if run.quiet_at:
        lines.append(
            f"both alerts resolved {run.quiet_at - run.load_stopped:.0f} s after the load stopped"
        )
    lines.append(f"Prometheus's alerts: {run.unanswered} reads unanswered")
    return "\n".join(lines)
