"""Two runs on freshly started vLLM 0.32 (CPU) servers, each with a fresh sidecar (issue 13).

* **Cold start into a burst** — the harness's Llama with 96 blocks of 128 and an
  8,192-token context, a sidecar started next to it, and ``COLD_IDLE_S`` later a burst of requests
  all at once whose prompts fit the cache and whose answers overfill it: vLLM preempts
  within seconds, while the sidecar has watched for less than its trend needs. Scale-up
  into a traffic spike is this case.
* **A compute-bound queue** — the issue's reproduction: the same Llama with 200 blocks of
  128, ``--max-num-batched-tokens 128 --max-num-seqs 64``, and waves of 64 long prompts with
  very short answers. Prefill admits about one prompt at a time, so dozens of requests
  wait while the cache sits mostly empty and nothing is preempted: a queue that is not KV
  pressure.

* **A queue behind max_num_seqs** — the same Llama with a batch of at most
  ``BATCH_MAX_SEQS``, a cache of 400 blocks of 128, and short prompts with long answers all
  at once: most requests wait for a batch slot while the cache sits nearly empty. The
  sidecar reads the flag from vLLM's command line, as in a pod.

All record the sidecar's own gauges (``Reading``) every ``READ_EVERY_S`` and vLLM's
/metrics every 0.25 s, so a failure shows what the sidecar said over time. Everything
started is stopped by process group, whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from exporter.risk.model import (
    WARNING_THRESHOLD,
    warning_holds,
)
from tests.conftest import FIXTURES
from tests.e2e.gauges import Reading, reading
from tests.e2e.vllm_harness import Request, RunResult, Sample, VllmServer, drive
from tests.processes import Sidecar

# The servers' names in the session's fleet.
COLD, COMPUTE, BATCH = "cold-start", "compute-bound", "max-num-seqs-bound"
CONFIG = FIXTURES / "vllm" / "tinyllama.config.json"
READ_EVERY_S = 0.5  # the sidecar polls vLLM every 2 s (its default); read its page faster
SIDECAR_ARGS = ("--model.path", str(CONFIG), "--no-nvml.enabled")

# The burst: two requests whose prompts take a tenth of a 12,288-token cache and whose
# answers would need a fifth more than all of it, so the batch outgrows the cache while it
# decodes. On a CPU server a step's time hardly depends on the batch, so the cache fills at
# a rate proportional to the number of sequences, and this vLLM decodes about 480 tokens a
# second per sequence on an idle 2-core machine: few long sequences in a large cache leave
# that machine over 10 s of growth, two or more 2 s polls between the growth showing (the
# age prior warns once about 60 % of the free space has gone) and vLLM evicting a request.
# Measured before: five sequences in 6,144 tokens filled it in 3 s, three in 4 s — the
# warning landed on the eviction's own poll.
COLD_IDLE_S = 10.0  # the sidecar watches an idle server this long first (< 30 s)
COLD_BURST = 2
COLD_PROMPT = (500, 700)
COLD_GENERATION = (6800, 7400)  # at most 8,100 tokens in all: max_model_len is COLD_MAX_LEN
COLD_MAX_LEN = 8192
COLD_BLOCKS = 96  # of 128 tokens: 12,288
COLD_SEED = 13

# The reproduction of a prefill-bound queue.
COMPUTE_ARGS = (
    "--num-gpu-blocks-override", "200", "--block-size", "128",
    "--max-num-batched-tokens", "128", "--max-num-seqs", "64",
)  # fmt: skip
COMPUTE_WAVES = 2
COMPUTE_WAVE = 64
COMPUTE_PROMPT = (1000, 1900)
COMPUTE_GENERATION = (4, 16)
COMPUTE_SEED = 1300
# A queue behind max_num_seqs: 40 requests, 4 at a time, each at most 900 tokens of a
# 51,200-token cache; about ten rounds of ~600 decode steps keep the queue there for
# many of the sidecar's polls.
BATCH_MAX_SEQS = 4
BATCH_ARGS = (
    "--num-gpu-blocks-override", "400", "--block-size", "128",
    "--max-num-seqs", str(BATCH_MAX_SEQS),
)  # fmt: skip
BATCH_REQUESTS = 40
BATCH_PROMPT = (100, 200)
BATCH_GENERATION = (500, 700)
BATCH_SEED = 1400
# The sidecar's first polls see requests it has not watched finish; from this many seconds
# after it started the bottleneck gauge must name the resource.
SETTLE_S = 10.0
# Queued readings from SETTLE_S a queue run waits for before it stops sending waves, and
# the most waves it sends to get them.
MIN_SETTLED = 10
MAX_WAVES = 12


@dataclass
class ColdStartRun:
    sidecar_spawned: float = 0.0  # its process started (it may poll before /healthz answers)
    sidecar_started: float = 0.0  # its /healthz answered
    burst_at: float = 0.0
    readings: list[Reading] = field(default_factory=list)
    burst: RunResult | None = None

    @property
    def samples(self) -> list[Sample]:
        return self.burst.samples if self.burst else []

    @property
    def first_preemption(self) -> float | None:
        """When vLLM's own counter first moved (the 0.25 s sample that shows it)."""
        return self.burst.first_preemption_at if self.burst else None

    @property
    def first_eviction(self) -> float | None:
        """When vLLM first sent a running request of the burst back to the queue.

        vLLM counts a preemption only when the request is scheduled again, seconds later
        on a full cache; the eviction itself shows as soon as the whole burst had been
        admitted (nothing waiting) and a request waits again: nothing else arrives.
        """
        admitted = False
        for s in self.samples:
            if admitted and s.waiting >= 1:
                return s.t
            admitted = admitted or (s.waiting == 0 and s.running + s.waiting == COLD_BURST)
        return None

    def _first(self, holds: Callable[[int], bool]) -> Reading | None:
        """The first reading at which ``holds`` (by index) while the sidecar had seen no
        preemption, taken before vLLM counted one."""
        first = self.first_preemption
        return next(
            (
                r
                for i, r in enumerate(self.readings)
                if r.risk is not None
                and r.preemptions == 0
                and (first is None or r.t < first)
                and holds(i)
            ),
            None,
        )

    @property
    def high(self) -> Reading | None:
        """The first reading whose score is above the warning's threshold."""
        return self._first(lambda i: (self.readings[i].risk or 0.0) > WARNING_THRESHOLD)

    @property
    def warning(self) -> Reading | None:
        """The first reading at which the shipped warning's condition holds: the score above
        WARNING_THRESHOLD with the usage peak the sidecar exports for its window
        (``kv_usage_max_30s_ratio``) above WARNING_USAGE, or the score above WARNING_CERTAIN
        (no ``for:``: a cold start fills its cache in less)."""

        def holds(i: int) -> bool:
            now = self.readings[i]
            return warning_holds(now.risk or 0.0, now.peak_warning)

        return self._first(holds)

    def before_preemption(self) -> list[Reading]:
        first = self.first_preemption
        return [r for r in self.readings if first is None or r.t < first]


@dataclass
class QueueRun:
    """A run whose queue is held back by something other than the cache: batches of
    requests, each sent at once when the previous one has finished."""

    sidecar_started: float = 0.0
    readings: list[Reading] = field(default_factory=list)
    waves: list[RunResult] = field(default_factory=list)

    @property
    def samples(self) -> list[Sample]:
        return [s for w in self.waves for s in w.samples]

    @property
    def queued(self) -> list[Reading]:
        """The sidecar's readings while it saw requests wait."""
        return [r for r in self.readings if r.waiting is not None and r.waiting >= 1]

    @property
    def settled(self) -> list[Reading]:
        """The queued readings from SETTLE_S after the sidecar started."""
        return [r for r in self.queued if r.t >= self.sidecar_started + SETTLE_S]

    @property
    def preemptions(self) -> float:
        return sum(w.preemptions for w in self.waves)


async def _read(sidecar: Sidecar, into: list[Reading], stop: asyncio.Event) -> None:
    while not stop.is_set():
        with contextlib.suppress(AssertionError, OSError):  # a slow page: the next read
            text = await asyncio.to_thread(sidecar.metrics)
            # Stamped when the page arrived: a reading stamped when it was asked for is
            # earlier than what it says by the page's latency (seconds on a loaded machine).
            into.append(reading(time.time(), text))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), READ_EVERY_S)


def cold_burst() -> list[Request]:
    rng = random.Random(COLD_SEED)
    return [
        Request(rng.randint(*COLD_PROMPT), rng.randint(*COLD_GENERATION)) for _ in range(COLD_BURST)
    ]


def compute_wave(wave: int) -> list[Request]:
    rng = random.Random(COMPUTE_SEED + wave)
    return [
        Request(rng.randint(*COMPUTE_PROMPT), rng.randint(*COMPUTE_GENERATION),
                prompt_seed=(COMPUTE_SEED + wave) * 1000 + i)
        for i in range(COMPUTE_WAVE)
    ]  # fmt: skip


def batch_requests(wave: int = 0) -> list[Request]:
    rng = random.Random(BATCH_SEED + wave)
    return [
        Request(rng.randint(*BATCH_PROMPT), rng.randint(*BATCH_GENERATION),
                prompt_seed=(BATCH_SEED + wave) * 1000 + i)
        for i in range(BATCH_REQUESTS)
    ]  # fmt: skip


async def run_cold_start(server: VllmServer) -> ColdStartRun:
    """A fresh sidecar on the fresh ``server``; the burst COLD_IDLE_S after it answered."""
    run = ColdStartRun()
    stop = asyncio.Event()
    with Sidecar(server.url, *SIDECAR_ARGS) as sidecar:
        run.sidecar_spawned = time.time()
        await asyncio.to_thread(sidecar.start)
        run.sidecar_started = time.time()
        reader = asyncio.create_task(_read(sidecar, run.readings, stop))
        try:
            await asyncio.sleep(COLD_IDLE_S)
            run.burst_at = time.time()
            requests = cold_burst()
            run.burst = await drive(
                server.url, requests, concurrency=len(requests), model=server.model
            )
        finally:
            stop.set()
            await reader
        assert "Traceback" not in sidecar.log(tail=1_000_000), sidecar.log()
    return run


async def _run_queue(
    server: VllmServer, wave: Callable[[int], list[Request]], least: int, most: int
) -> QueueRun:
    """A fresh sidecar on the fresh ``server``; waves ``wave(0)``, ``wave(1)``, ... each sent
    at once when the previous one has finished: at least ``least``, then more until the
    sidecar has made MIN_SETTLED queued readings from SETTLE_S, at most ``most``. A count of
    readings, not a count of waves, so a fast machine (a wave of the compute-bound run took
    4 s on an idle AVX-512 EPYC, its two waves ended before SETTLE_S) still gives the
    checks something to read."""
    run = QueueRun()
    stop = asyncio.Event()
    with Sidecar(server.url, *SIDECAR_ARGS) as sidecar:
        await asyncio.to_thread(sidecar.start)
        run.sidecar_started = time.time()
        reader = asyncio.create_task(_read(sidecar, run.readings, stop))
        try:
            for w in range(most):
                if w >= least and len(run.settled) >= MIN_SETTLED:
                    break
                requests = wave(w)
                run.waves.append(
                    await drive(server.url, requests, concurrency=len(requests),
                                model=server.model)
                )  # fmt: skip
        finally:
            stop.set()
            await reader
        assert "Traceback" not in sidecar.log(tail=1_000_000), sidecar.log()
    return run


async def run_compute_bound(server: VllmServer) -> QueueRun:
    """COMPUTE_WAVES waves of long prompts with short answers."""
    return await _run_queue(server, compute_wave, COMPUTE_WAVES, MAX_WAVES)


async def run_batch_bound(server: VllmServer) -> QueueRun:
    """Short prompts with long answers, all at once."""
    return await _run_queue(server, batch_requests, 1, MAX_WAVES)


def cold_server() -> VllmServer:
    # The same Llama with room for COLD_MAX_LEN positions (its weights are dummies anyway).
    config = {**json.loads(CONFIG.read_text()), "max_position_embeddings": COLD_MAX_LEN}
    return VllmServer(
        config,
        name="tinyllama",
        extra_args=(
            "--max-model-len", str(COLD_MAX_LEN), "--num-gpu-blocks-override", str(COLD_BLOCKS),
        ),
        env={"VLLM_CPU_OMP_THREADS_BIND": "0"},
        tokens=COLD_BLOCKS * 128,
    )  # fmt: skip


def compute_server() -> VllmServer:
    return VllmServer(
        CONFIG, name="tinyllama", extra_args=COMPUTE_ARGS, env={"VLLM_CPU_OMP_THREADS_BIND": "1"},
        tokens=200 * 128,
    )  # fmt: skip


def batch_server() -> VllmServer:
    return VllmServer(
        CONFIG, name="tinyllama", extra_args=BATCH_ARGS, env={"VLLM_CPU_OMP_THREADS_BIND": "0"},
        tokens=400 * 128,
    )  # fmt: skip


def cold_summary(run: ColdStartRun) -> str:
    first = run.first_preemption
    warn = run.high
    alert = run.warning
    before = run.before_preemption()
    peak = max((r.risk for r in before if r.risk is not None), default=float("nan"))
    if first is None:
        return "cold start: the burst never made vLLM preempt"
    evicted = run.first_eviction
    lead = (
        f"risk {warn.risk:.2f} > {WARNING_THRESHOLD} {first - warn.t:.1f} s before it "
        + (f"and {evicted - warn.t:.1f} s before the first eviction " if evicted else "")
        + f"(history {warn.history:.0f} s)"
        if warn is not None and warn.risk is not None and warn.history is not None
        else f"risk never above {WARNING_THRESHOLD} before it (at most {peak:.2f})"
    ) + (
        f"; the warning's condition {first - alert.t:.1f} s before it"
        + (f" and {evicted - alert.t:.1f} s before the first eviction" if evicted else "")
        if alert is not None
        else "; the warning's condition never held before it"
    )
    return (
        f"cold start: burst {run.burst_at - run.sidecar_started:.0f} s after the sidecar "
        f"started; vLLM's first preemption {first - run.burst_at:.1f} s into the burst "
        f"({run.burst.preemptions if run.burst else 0:g} in all); {lead}; "
        f"{run.burst.finished_at - run.sidecar_started if run.burst else 0:.0f} s in all"
    )


def queue_summary(what: str, run: QueueRun, resource: str) -> str:
    samples = run.samples
    queued = run.queued
    named = sum(r.bottleneck == resource for r in run.settled)
    risk = max((r.risk for r in queued if r.risk is not None), default=float("nan"))
    since = run.sidecar_started
    high = [r.t - since for r in queued if r.risk is None or r.risk >= WARNING_THRESHOLD]
    if high:
        risk_text = f"{risk:.2f} ({len(high)} readings from {high[0]:.0f} to {high[-1]:.0f} s)"
    else:
        risk_text = f"{risk:.2f}"
    return (
        f"{what}: up to {max((s.waiting for s in samples), default=0):g} waiting, "
        f"KV usage at most {max((s.usage for s in samples), default=0):.0%}, "
        f"{run.preemptions:g} preemptions; risk while queued at most {risk_text}; "
        f"bottleneck {resource} in {named} of {len(run.settled)} queued readings after "
        f"{SETTLE_S:.0f} s; "
        f"{run.waves[-1].finished_at - run.sidecar_started if run.waves else 0:.0f} s in all"
    )
