"""Headroom in units of traffic: replay a request log (or a scenario's traffic) through the
simulated engine at a planned deployment, and find the largest multiple of that traffic
the deployment holds. Pure apart from running the simulator (no I/O but ``load_traffic``,
and the progress of a parallel probe on a terminal's stderr).

* **Scaling** — ``Traffic.at(m)`` is the same traffic ``m`` times over, like a log's
  ``rate_scale``: each request is kept with chance ``frac(m)`` on top of ``floor(m)``
  copies. Unlike a re-seeded sample, the draws are fixed per request, so the requests at
  ``m`` are a subset of those at any larger ``m`` (a coupled sample): whether a multiple
  holds then changes with ``m`` for load reasons, not because another sample was drawn,
  and a bisection has one answer. A copy is another user sending a request like it
  within the next ``COPY_SPREAD_SECONDS``; a conversation is kept or dropped whole and its
  copies are other conversations (their own prefix-cache keys); a logged request's copy
  has prefix blocks of its own, repeating as the original's do.
* **Holding** — a multiple holds when the replay never preempts and the p95 queue wait
  (arrival to first scheduled, every engine request) stays at or under the bound.
* **Search** — from 1×: doubling (or halving) until the answer changes, then bisection
  until the highest multiple held and the lowest failed are within ``precision`` of each
  other (relative). A replay stops as soon as it fails for sure (a preemption; more late
  requests than the p95 allows), so failed probes cost little.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import yaml

from exporter.capacity.plan import Plan
from exporter.errors import InputError
from exporter.simulator.engine import REASONS, Engine, EngineConfig, Request
from exporter.simulator.requestlog import LogFormat, copy_hashes, parse_request_log
from exporter.simulator.scenario import Arrival, Scenario, arrivals, parse_scenario, with_logs
from exporter.simulator.simulation import engine_config, load_scenario, read_log, submit_arrival

COPY_SPREAD_SECONDS = 60.0  # a copy arrives within this long after its original
QUEUE_WAIT_QUANTILE = 0.95  # the queue-wait percentile --max-queue-wait bounds
DEFAULT_MAX_QUEUE_WAIT = 5.0
DEFAULT_PRECISION = 0.05  # the search stops when held and failed are this close
SAMPLE_SECONDS = 1.0  # KV usage is sampled this often (simulated time)
DRAIN_SECONDS = 600.0  # after the last arrival, the replay lets the queue drain this long
# The replay at 1× is reported in full, but one that has failed goes on only this long:
# its figures then describe the first part of the traffic (``complete`` says so).
REPORT_AFTER_FAILING = 600.0
MIN_MULTIPLIER, MAX_MULTIPLIER = 1 / 64, 64.0
# Copies of a conversation get their own prefix keys, far above the scenario's own.
_COPY_KEY_STRIDE = 1 << 52
_GOLDEN = (math.sqrt(5) - 1) / 2


@dataclass(frozen=True)
class Traffic:
    """A traffic source at 1×: its arrivals, and one fixed draw per request (or
    conversation) that decides which requests every multiple keeps."""

    name: str
    base: tuple[Arrival, ...]
    span: float  # seconds from 0 to the last arrival (at 1×)
    seed: int = 0
    keep: tuple[float, ...] = field(default=(), repr=False)
    shift: tuple[float, ...] = field(default=(), repr=False)

    @classmethod
    def of(cls, name: str, base: Sequence[Arrival], seed: int = 0) -> Traffic:
        rng = random.Random(seed)  # noqa: S311 - a reproducible sample, not a secret
        by_conversation: dict[int, tuple[float, float]] = {}
        keep, shift = [], []
        for a in base:
            draw = (rng.random(), rng.random())
            if _conversation(a):
                assert a.prefix_key is not None
                draw = by_conversation.setdefault(a.prefix_key, draw)
            keep.append(draw[0])
            shift.append(draw[1])
        span = max((a.time for a in base), default=0.0)
        return cls(name, tuple(base), span, seed, tuple(keep), tuple(shift))

    @property
    def sequences(self) -> int:
        return sum(a.n for a in self.base)

    def at(self, multiplier: float) -> list[Arrival]:
        """The arrivals at ``multiplier`` × this traffic, in time order."""
        if multiplier <= 0:
            return []
        whole = int(multiplier)
        frac = multiplier - whole
        out: list[Arrival] = []
        for a, keep, shift in zip(self.base, self.keep, self.shift, strict=True):
            copies = whole + (1 if keep < frac else 0)
            for c in range(copies):
                out.append(a if c == 0 else _copy(a, c, shift))
        out.sort(key=lambda a: a.time)
        return out


def _conversation(a: Arrival) -> bool:
    """A turn that leaves its answer in the prefix cache for the next turn (a session)."""
    return a.prefix_key is not None and not a.block_hashes and a.cache_len > a.prompt


def _copy(a: Arrival, c: int, shift: float) -> Arrival:
    # The same delay for every turn of a conversation's copy keeps its turns in order;
    # a golden-ratio stride spreads the copies of one request over the whole spread.
    delay = COPY_SPREAD_SECONDS * ((shift + c * _GOLDEN) % 1.0)
    key = a.prefix_key
    if _conversation(a):
        assert key is not None
        key += c * _COPY_KEY_STRIDE
    # A copy's prompt is its own user's (``copy_hashes``).
    hashes = copy_hashes(a.block_hashes, c)
    return dataclasses.replace(a, time=a.time + delay, prefix_key=key, block_hashes=hashes)


@dataclass(frozen=True)
class Outcome:
    """One replay at one multiple."""

    multiplier: float
    sequences: int  # engine requests submitted (n counts n times)
    preemptions: int
    first_preemption_seconds: float | None
    peak_kv_usage: float
    p95_kv_usage: float
    queue_wait_seconds: Mapping[str, float]  # p50, p95, p99 (of those seen)
    waiting_seconds: Mapping[str, float]  # why the queue waited, seconds per reason
    simulated_seconds: float
    wall_seconds: float
    complete: bool  # ran to the end (False: stopped once it had certainly failed)
    held: bool

    @property
    def binding(self) -> str:
        """What limits this replay: the cache when it preempted, else what held the
        queue back longest (``none`` when nobody waited)."""
        if self.preemptions:
            return "kv_cache"
        waits = {r: s for r, s in self.waiting_seconds.items() if r != "none" and s > 0}
        return max(waits, key=lambda r: waits[r]) if waits else "none"


def _quantile(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile of sorted values (0 for none)."""
    if not values:
        return 0.0
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


def replay(
    traffic: Traffic,
    config: EngineConfig,
    multiplier: float,
    *,
    max_queue_wait: float = DEFAULT_MAX_QUEUE_WAIT,
    stop_after: float | None = 0.0,
    progress: Callable[[float], None] | None = None,
) -> Outcome:
    """``multiplier`` × the traffic through an engine of ``config``: until the queue
    drains (at most ``DRAIN_SECONDS`` after the last arrival), or until ``stop_after``
    simulated seconds after the multiple has certainly failed (None: never stop early;
    an overloaded engine simulates step by step, so a day of overload would take hours).
    ``progress`` gets the fraction done about every ten seconds of wall time."""
    started = time.perf_counter()
    todo = traffic.at(multiplier)
    total = sum(a.n for a in todo)
    allowed_late = math.floor((1 - QUEUE_WAIT_QUANTILE) * total)
    engine = Engine(config, start=0.0)
    waits: list[float] = []

    def waited(req: Request) -> float:
        # Not ``first_scheduled or now``: a request scheduled at 0.0 would wait till now.
        scheduled = engine.now if req.first_scheduled is None else req.first_scheduled
        return scheduled - req.arrival

    def finished(req: Request) -> None:
        waits.append(waited(req))

    engine.on_finish = finished
    usage: list[float] = []
    end = (todo[-1].time if todo else 0.0) + DRAIN_SECONDS
    next_sample = 0.0
    next_check = 30.0
    reported = started
    i = 0
    failed_at: float | None = None
    while engine.now < end:
        if (
            failed_at is not None
            and stop_after is not None
            and engine.now >= failed_at + stop_after
        ):
            break
        upcoming = todo[i].time if i < len(todo) else None
        if upcoming is None and not engine.running and not engine.waiting:
            break
        if upcoming is not None and upcoming <= next_sample:
            a = todo[i]
            engine.run_until(a.time, next_arrival=a.time)
            submit_arrival(engine, a)
            i += 1
            continue
        engine.run_until(next_sample, next_arrival=upcoming)
        usage.append(engine.usage)
        next_sample = engine.now + SAMPLE_SECONDS
        if failed_at is None and engine.preempted:
            failed_at = engine.now
        if engine.now >= next_check:
            next_check = engine.now + 30.0
            if failed_at is None and _late(waits, engine, max_queue_wait) > allowed_late:
                failed_at = engine.now
            if progress is not None and time.perf_counter() - reported > 10.0:
                reported = time.perf_counter()
                progress(min(1.0, engine.now / max(end - DRAIN_SECONDS, 1e-9)))
    # Those still queued or running waited at least until now (or until admitted).
    for req in list(engine.running) + list(engine.waiting):
        waits.append(waited(req))
    waits.sort()
    usage.sort()
    p95_wait = _quantile(waits, QUEUE_WAIT_QUANTILE)
    complete = not (todo and i < len(todo)) and not engine.running and not engine.waiting
    complete = complete or engine.now >= end
    held = failed_at is None and not engine.preempted and p95_wait <= max_queue_wait
    return Outcome(
        multiplier=multiplier,
        sequences=total,
        preemptions=engine.preempted,
        first_preemption_seconds=engine.first_preemption_at,
        peak_kv_usage=usage[-1] if usage else 0.0,
        p95_kv_usage=_quantile(usage, 0.95),
        queue_wait_seconds={
            "p50": _quantile(waits, 0.5),
            "p95": p95_wait,
            "p99": _quantile(waits, 0.99),
        },
        waiting_seconds={r: engine.reason_seconds.get(r, 0.0) for r in REASONS},
        simulated_seconds=engine.now,
        wall_seconds=time.perf_counter() - started,
        complete=complete,
        held=held,
    )


def _late(waits: Sequence[float], engine: Engine, bound: float) -> int:
    """Requests that certainly waited longer than ``bound``."""
    late = sum(1 for w in waits if w > bound)
    for req in engine.waiting:
        if engine.now - req.arrival > bound:
            late += 1
    for req in engine.running:
        if req.first_scheduled is not None and req.first_scheduled - req.arrival > bound:
            late += 1
    return late


@dataclass(frozen=True)
class Limit:
    """The largest multiple held, the smallest that failed, and every probe."""

    held: float | None  # None: not even MIN_MULTIPLIER holds
    failed: float | None  # None: MAX_MULTIPLIER holds
    probes: tuple[Outcome, ...]

    @property
    def precision(self) -> float | None:
        """How far apart held and failed are, relative to held."""
        if self.held is None or self.failed is None:
            return None
        return self.failed / self.held - 1

    @property
    def binding(self) -> str:
        """What gave out first: the binding resource of the lowest multiple that failed."""
        fails = [p for p in self.probes if not p.held]
        if not fails:
            return "none"
        return min(fails, key=lambda p: p.multiplier).binding

    def at(self, multiplier: float) -> Outcome | None:
        return next((p for p in self.probes if p.multiplier == multiplier), None)


def search(
    evaluate: Callable[[float], Outcome],
    *,
    precision: float = DEFAULT_PRECISION,
    start: float = 1.0,
    step: float = 2.0,
    width: int = 1,
    evaluate_many: Callable[[Sequence[float]], Sequence[Outcome]] | None = None,
) -> Limit:
    """The largest multiple ``evaluate`` holds, to within ``precision`` (relative): from
    ``start``, multiplying (or dividing) by ``step`` until the answer changes, then
    bisecting geometrically. A good guess for ``start`` with a small ``step`` saves probes.

    With ``width`` > 1, each round probes ``width`` multiples at once through
    ``evaluate_many`` (in parallel processes): the next ``width`` steps out, or ``width``
    points splitting the bracket into ``width + 1`` equal ratios, so a round narrows it
    ``width + 1``-fold instead of 2-fold."""
    if precision <= 0 or step <= 1 or width < 1:
        raise ValueError("precision must be above 0, step above 1 and width at least 1")
    probes: list[Outcome] = []

    def probe_all(ms: Sequence[float]) -> list[bool]:
        outcomes = (
            list(evaluate_many(ms))
            if evaluate_many is not None and len(ms) > 1
            else [evaluate(m) for m in ms]
        )
        probes.extend(outcomes)
        return [o.held for o in outcomes]

    def climb(ms: list[float], held: float) -> tuple[float, float | None]:
        """Probe ascending multiples: the highest hold below the first failure, and that
        failure (None when all held)."""
        for m, ok in zip(ms, probe_all(ms), strict=True):
            if not ok:
                return held, m
            held = m
        return held, None

    held: float | None = None
    failed: float | None = None
    if probe_all([start])[0]:
        highest = start
        while highest < MAX_MULTIPLIER and failed is None:
            ms = sorted({min(MAX_MULTIPLIER, highest * step**k) for k in range(1, width + 1)})
            highest, failed = climb(ms, highest)
        held = highest
    else:
        failed = start
        while failed > MIN_MULTIPLIER and held is None:
            ms = sorted({max(MIN_MULTIPLIER, failed / step**k) for k in range(1, width + 1)})
            verdicts = probe_all(ms)
            for m, ok in reversed(list(zip(ms, verdicts, strict=True))):
                if ok:
                    held = m
                    break
                failed = m
    if held is None or failed is None:
        return Limit(held, failed, tuple(probes))
    while failed / held - 1 > precision:
        ratio = failed / held
        # Geometric points: precision is relative.
        ms = [held * ratio ** (k / (width + 1)) for k in range(1, width + 1)]
        held, lower = climb(ms, held)
        failed = failed if lower is None else lower
    return Limit(held, failed, tuple(probes))


class StatusLine:
    """Progress on a terminal as one line redrawn in place (a carriage return, then the
    rest of the old line erased). ``for_stream`` gives None when the stream is not a
    terminal: in a log or a pipe, a line per probe buries the answer (a day's search wrote
    dozens), and nobody watches it move."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.shown = False

    @classmethod
    def for_stream(cls, stream: TextIO) -> StatusLine | None:
        try:
            return cls(stream) if stream.isatty() else None
        except ValueError:  # a closed stream
            return None

    def __call__(self, text: str) -> None:
        try:
            width = os.get_terminal_size(self.stream.fileno()).columns
        except (OSError, ValueError):
            width = 0
        # A line wider than the terminal wraps, and a carriage return then redraws only
        # its last row: cut it to fit (a terminal that reports no width gets 80).
        width = width or 80
        self.stream.write(f"\r{text.strip()[: width - 1]}\x1b[K")
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        """End the line, so that what follows starts on a line of its own."""
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()
            self.shown = False


# Each worker process holds the traffic and the engine once (a day of traffic is large),
# then replays the multiples it is sent.
_WORKER: dict[str, object] = {}


def _init_worker(traffic: Traffic, config: EngineConfig, bound: float, label: str | None) -> None:
    _WORKER.update(traffic=traffic, config=config, bound=bound, label=label)


def _replay_in_worker(multiplier: float) -> Outcome:
    traffic = _WORKER["traffic"]
    config = _WORKER["config"]
    bound = _WORKER["bound"]
    label = _WORKER["label"]
    assert isinstance(traffic, Traffic)
    assert isinstance(config, EngineConfig)
    assert isinstance(bound, float)

    line = StatusLine(sys.stderr)

    def progress(done: float) -> None:
        # The worker shares the parent's terminal (it is given a label only then): a long
        # probe says how far it has got on the same line, as a sequential one does,
        # instead of going quiet for minutes.
        line(f"{label} ×{multiplier:.3g}: {done:.0%} of the traffic replayed")

    return replay(
        traffic,
        config,
        multiplier,
        max_queue_wait=bound,
        progress=progress if label is not None else None,
    )


def parallel_replays(
    traffic: Traffic, config: EngineConfig, bound: float, jobs: int, label: str | None = None
) -> tuple[Callable[[Sequence[float]], Sequence[Outcome]], Callable[[], None]]:
    """``evaluate_many`` for ``search`` over ``jobs`` processes, and how to stop them; with
    a ``label``, a long replay redraws its progress on stderr (a terminal's) under it."""
    from concurrent.futures import ProcessPoolExecutor

    pool = ProcessPoolExecutor(
        jobs, initializer=_init_worker, initargs=(traffic, config, bound, label)
    )

    def many(ms: Sequence[float]) -> Sequence[Outcome]:
        return list(pool.map(_replay_in_worker, ms))

    return many, lambda: pool.shutdown(cancel_futures=True)


def engine_at(plan: Plan, scenario: Scenario | None = None) -> EngineConfig:
    """The simulated engine of a planned deployment (timings from its GPU, or the
    scenario's own ``engine:`` overrides; prefix caching as the scenario says)."""
    base = scenario or Scenario("plan", "", "safe", 0.0, 0, {}, {})
    return engine_config(base, plan, plan.request.gpu)


def traffic_of(scenario: Scenario) -> Traffic:
    """A scenario's open-loop traffic (phases and logs) at 1×."""
    if scenario.closed_loop is not None:
        raise InputError(
            scenario.source or scenario.name,
            "closed_loop",
            None,
            "plan --traffic needs open-loop traffic (phases or a request log)",
        )
    return Traffic.of(scenario.name, list(arrivals(scenario)), scenario.seed)


LOG_SUFFIXES = (".csv", ".jsonl", ".json", ".ndjson")


def _columns_flag(roles: Sequence[str]) -> str:
    """How ``plan`` maps a log's columns, for an error that names them."""
    return "--traffic-columns " + ",".join(f"{role}=COLUMN" for role in roles)


def load_traffic(
    source: str,
    *,
    columns: Mapping[str, str] | None = None,
    time_unit: str = "s",
    hash_block_tokens: int = 512,
) -> tuple[Traffic, Scenario]:
    """A request log (CSV or JSON Lines) or a scenario (a file or a built-in name)."""
    path = Path(source)
    if path.suffix.lower() not in LOG_SUFFIXES:
        scenario = load_scenario(source)
        return traffic_of(scenario), scenario
    text = read_log(source)
    fmt = "csv" if path.suffix.lower() == ".csv" else "jsonl"
    log: dict[str, object] = {
        "file": str(path.resolve()),
        "format": fmt,
        "time_unit": time_unit,
        "hash_block_tokens": hash_block_tokens,
    }
    if columns:
        log["columns"] = dict(columns)
    base_columns = {**LogFormat().columns, **(columns or {})}
    records = parse_request_log(
        text, source, LogFormat(fmt, base_columns, time_unit), hint=_columns_flag
    )
    if not records:
        raise InputError(source, "", None, "holds no request")
    span = records[-1].time - records[0].time
    doc = {"name": path.name, "duration": span + 1.0, "traffic": log}
    scenario = parse_scenario(yaml.safe_dump(doc), str(path))
    scenario = with_logs(scenario, lambda _p: text)
    return traffic_of(scenario), scenario


@dataclass(frozen=True)
class Headroom:
    """One deployment on the traffic: the replay at 1× (None when not asked for) and the
    largest multiple held."""

    label: str
    at_one: Outcome | None
    limit: Limit


def assess_traffic(
    traffic: Traffic,
    config: EngineConfig,
    *,
    label: str = "",
    max_queue_wait: float = DEFAULT_MAX_QUEUE_WAIT,
    precision: float = DEFAULT_PRECISION,
    guess: float | None = None,
    say: Callable[[str], None] | None = None,
    jobs: int = 1,
    report_at_one: bool = True,
) -> Headroom:
    """The replay at 1× (run to the end, for its figures) and the search around it;
    ``guess`` (another deployment's answer) starts the search near the answer. Without
    ``report_at_one`` (a what-if, whose table row shows only the multiple) 1× is not
    replayed unless the search comes by it: on a day of traffic that holds at 1×, that
    replay would cost as much as a probe."""

    def run(m: float, *, stop_after: float | None = 0.0) -> Outcome:
        def progress(done: float) -> None:
            if say is not None:
                say(f"  {label} ×{m:.3g}: {done:.0%} of the traffic replayed")

        outcome = replay(
            traffic,
            config,
            m,
            max_queue_wait=max_queue_wait,
            stop_after=stop_after,
            progress=progress,
        )
        if say is not None:
            verdict = "holds" if outcome.held else f"fails ({_why(outcome, max_queue_wait)})"
            say(f"  {label} ×{m:.3g}: {verdict} · {outcome.wall_seconds:.1f} s")
        return outcome

    first = run(1.0, stop_after=REPORT_AFTER_FAILING) if report_at_one else None

    def evaluate(m: float) -> Outcome:
        return first if first is not None and m == 1.0 else run(m)

    many: Callable[[Sequence[float]], Sequence[Outcome]] | None = None
    pool = (
        parallel_replays(traffic, config, max_queue_wait, jobs, label if say else None)
        if jobs > 1
        else None
    )
    if pool is not None:
        pooled = pool[0]

        def many_said(ms: Sequence[float]) -> Sequence[Outcome]:
            outcomes = pooled(ms)
            for o in outcomes:
                if say is not None:
                    verdict = "holds" if o.held else f"fails ({_why(o, max_queue_wait)})"
                    say(f"  {label} ×{o.multiplier:.3g}: {verdict} · {o.wall_seconds:.1f} s")
            return outcomes

        many = many_said
    try:
        if guess is not None and guess > 0:
            limit = search(
                evaluate,
                precision=precision,
                start=guess,
                step=1.25,
                width=jobs,
                evaluate_many=many,
            )
            if first is not None and first not in limit.probes:
                limit = dataclasses.replace(limit, probes=(first, *limit.probes))
        else:
            limit = search(evaluate, precision=precision, width=jobs, evaluate_many=many)
    finally:
        if pool is not None:
            pool[1]()
    return Headroom(label, first, limit)


def _why(outcome: Outcome, bound: float) -> str:
    if outcome.preemptions:
        when = outcome.first_preemption_seconds or 0.0
        return f"preempted at {when / 60:.1f} min"
    return f"p95 queue wait {outcome.queue_wait_seconds['p95']:.1f} s > {bound:g} s"


def split_traffic(traffic: Traffic, replicas: int) -> tuple[Traffic, ...]:
    """The traffic as ``replicas`` engines behind a round-robin router get it: requests
    dealt in arrival order, a conversation's turns kept on the replica of its first
    (sticky sessions: its prefix cache is there). Each share keeps its requests' draws,
    so a share at ``m`` is what its replica gets of the whole at ``m`` (a copy goes where
    its original went)."""
    if replicas <= 1:
        return (traffic,)
    owner: dict[int, int] = {}
    members: list[list[int]] = [[] for _ in range(replicas)]
    turn = 0
    for i, a in enumerate(traffic.base):
        if _conversation(a) and a.prefix_key in owner:
            r = owner[a.prefix_key]
        else:
            r, turn = turn, (turn + 1) % replicas
            if _conversation(a):
                assert a.prefix_key is not None
                owner[a.prefix_key] = r
        members[r].append(i)
    return tuple(
        Traffic(
            f"{traffic.name} ({r + 1}/{replicas})",
            tuple(traffic.base[i] for i in ix),
            traffic.span,
            traffic.seed,
            tuple(traffic.keep[i] for i in ix),
            tuple(traffic.shift[i] for i in ix),
        )
        for r, ix in enumerate(members)
    )
