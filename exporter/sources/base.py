"""What every source shares: the ``Source`` shape, the readings sources write, per-source
health, and daemon threads for blocking reads.

A source is an object with a ``name`` (its ``source`` label), a ``stage``, ``due(now)``
(has this poll work for it?) and an async ``poll(now, readings)`` that writes what it read
into ``readings`` and returns ``None`` (answered) or ``(kind, message)`` (down). The poller
runs the due sources of a stage concurrently, times each, and keeps its ``SourceHealth``.
A source module declares itself with a ``Plugin`` (its name, its settings, its enable flag
and how to make it); adding a source is that one file and one line in
``sources/registry.py``. What a source reads for the snapshot goes in a typed ``Slot`` of
``Readings``, declared beside the source, so no other source needs to know of it. The
records sources hand each other and the poller injects live in ``sources/records.py`` and
``sources/nvml_reader.py``, which import no source, so this module imports none either.

Blocking work runs in daemon threads, one at a time per job: a call that hangs (a GPU that
fell off the bus, a stale NFS mount) is waited on by later polls instead of being started
again, and cannot keep the process from exiting on SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, cast, runtime_checkable

from exporter.deployment import Deployment
from exporter.settings import Spec
from exporter.sources.nvml_reader import NvmlReader
from exporter.sources.records import Flags, ModelSource, VllmApi, VllmProcess

T = TypeVar("T")

# None: the source answered. (kind, message): it did not; kind is stable, message one line.
Outcome = tuple[str, str] | None


class Stage(enum.Enum):
    FIRST = 1  # polled concurrently at the start of a poll
    AFTER_DEPLOYMENT = 2  # needs the flags resolved from what the first stage read


class Slot(Generic[T]):
    """A typed place in ``Readings``, declared by the source that fills it.

    More than one source may fill the same slot (NVML and dcgm-exporter both read GPU
    memory): ``Readings.get`` gives the value of the one registered first that has one, so a
    second source fills in where the first has nothing, whichever finished first.
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Slot({self.name!r})"


@dataclass
class Readings:
    """The latest of what each source read: sources write it, ``snapshot.build`` reads it."""

    deployment: Deployment = field(default_factory=Deployment)  # set between the two stages
    # Which writer of a slot wins: the sources' names in registry order (the poller sets it).
    order: tuple[str, ...] = ()
    _slots: dict[Slot[Any], dict[str, Any]] = field(default_factory=dict, repr=False)

    def put(self, slot: Slot[T], writer: str, value: T | None) -> None:
        """What ``writer`` read for ``slot`` this poll; None: it has nothing now."""
        self._slots.setdefault(slot, {})[writer] = value

    def get(self, slot: Slot[T]) -> T | None:
        """The slot's value from the first writer in ``order`` that has one."""
        written = self._slots.get(slot)
        if not written:
            return None
        if len(written) == 1:  # one writer (all but GPU memory): no ranking, every poll
            return cast(T, next(iter(written.values())))
        rank = {name: i for i, name in enumerate(self.order)}
        for writer in sorted(written, key=lambda w: (rank.get(w, len(rank)), w)):
            value = written[writer]
            if value is not None:
                return cast(T, value)
        return None


class Source(Protocol):
    name: str  # the ``source`` label; a helper that exports no health says so below
    stage: Stage
    reports_health: bool

    def due(self, now: float) -> bool:
        """Has this poll work for the source? A stage starts only those that have: a task
        for a source with nothing to do cost ~65 µs a poll, most of a stage's overhead."""
        ...

    async def poll(self, now: float, readings: Readings) -> Outcome: ...

    async def on_restart(self, now: float, readings: Readings) -> None:
        """vLLM restarted: what this source holds about the old process may be stale."""


@runtime_checkable
class Closing(Protocol):
    """A source that holds something to release at shutdown (a session, an NVML handle)."""

    async def close(self) -> None: ...


class SourceConfig(Protocol):
    """What the sources read of the sidecar's configuration (``exporter.config.Config``,
    which imports the registry and so cannot be imported here)."""

    @property
    def vllm_url(self) -> str: ...

    @property
    def vllm_timeout_seconds(self) -> float: ...

    @property
    def model_path(self) -> str | None: ...

    @property
    def nvml_devices(self) -> tuple[str, ...] | None: ...

    @property
    def proc_path(self) -> str: ...

    def get(self, spec: Spec[T]) -> T: ...

    def value(self, key: str) -> Any: ...


@dataclass
class PollerDeps:
    """Everything the poller and its sources touch outside themselves; tests replace any of
    it. None: the real thing (the process scan, the model loader, a fresh NVML reader)."""

    clock: Callable[[], float] = time.time
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    find_processes: Callable[[str], list[VllmProcess]] | None = None
    read_flags: Callable[[VllmProcess], Flags] | None = None
    load_model: Callable[[str], ModelSource] | None = None
    nvml: NvmlReader | None = None


@dataclass(frozen=True)
class SourceContext:
    """What a plug-in is made from: the configuration, the poller's deps and vLLM's client."""

    config: SourceConfig
    deps: PollerDeps
    client: VllmApi

    @property
    def within(self) -> float:
        """How long one read may take: vLLM's timeout, which ends before the next poll."""
        return self.config.vllm_timeout_seconds


@dataclass(frozen=True)
class Plugin:
    """A source as the registry knows it: its name, the settings it declares (each a YAML
    key, a ``KV_HEADROOM_*`` variable, a docs row, and a ``serve`` flag when listed in
    ``flags``), the key of its enable flag (None: always on) and how to make it."""

    name: str
    make: Callable[[SourceContext], Source]
    settings: tuple[Spec[Any], ...] = ()
    enabled: str | None = None
    flags: tuple[str, ...] = ()

    def on(self, config: SourceConfig) -> bool:
        return self.enabled is None or bool(config.value(self.enabled))


@dataclass(frozen=True)
class SourceState:
    """One source's health as a snapshot carries it."""

    name: str
    up: bool
    last_success: float | None = None
    error_kind: str | None = None
    error: str | None = None
    errors_total: int = 0
    poll_duration_seconds: float | None = None  # how long its last poll took
    missing: tuple[str, ...] = ()  # what an answering source lacked (e.g. cache_config_info)


@dataclass
class SourceHealth:
    """One source's health across polls; ``mark`` returns the log event a change deserves."""

    name: str
    up: bool = False
    seen: bool = False  # has ever been tried, so the first failure is logged too
    last_success: float | None = None
    error_kind: str | None = None
    error: str | None = None
    errors_total: int = 0
    down_since: float | None = None
    duration: float | None = None
    missing: tuple[str, ...] = ()

    def mark(self, now: float, outcome: Outcome) -> tuple[str, dict[str, Any]] | None:
        """Record a poll's outcome; an event (name, fields) only when the state changes."""
        event: tuple[str, dict[str, Any]] | None = None
        if outcome is None:
            if not self.up:
                down = round(now - self.down_since, 1) if self.down_since else None
                event = ("source_up", {"source": self.name, "down_seconds": down})
            self.up, self.last_success, self.error_kind, self.error = True, now, None, None
            self.down_since = None
        else:
            kind, message = outcome
            if kind != "not_configured":  # a choice, not a failure: count real errors only
                self.errors_total += 1
            if self.up or not self.seen or self.error_kind != kind:
                event = ("source_down", {"source": self.name, "kind": kind, "error": message})
            if self.up or self.down_since is None:
                self.down_since = now
            self.up, self.error_kind, self.error = False, kind, message
        self.seen = True
        return event

    def state(self) -> SourceState:
        return SourceState(
            self.name,
            self.up,
            self.last_success,
            self.error_kind,
            self.error,
            self.errors_total,
            self.duration,
            self.missing if self.up else (),
        )


def in_daemon_thread(fn: Callable[[], T], name: str) -> asyncio.Future[T]:
    """``fn()`` in a daemon thread, as a future of this loop.

    ``asyncio.to_thread`` uses the loop's executor, whose threads the interpreter joins at
    exit: one NVML call that never returns would then hang the shutdown after SIGTERM.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():  # cancelled meanwhile
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def run() -> None:
        result, error = None, None
        try:
            result = fn()
        except BaseException as e:  # handed to the awaiting coroutine, not lost in the thread
            error = e
        with contextlib.suppress(RuntimeError):  # the loop closed while this ran
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


class Jobs:
    """Blocking calls in daemon threads, one at a time per job name."""

    def __init__(self) -> None:
        self._running: dict[str, asyncio.Future[Any]] = {}

    async def run(self, job: str, fn: Callable[[], T], within: float) -> T:
        """``fn()`` in a daemon thread, waited on for at most ``within`` s (TimeoutError).

        While an earlier call of the same job still runs, it is waited on again rather
        than a second one started beside it (NVML handles are not thread-safe, and a hung
        file system would otherwise collect a thread per poll). Finished jobs are
        forgotten, so job names that change (a model path per load) do not pile up.
        """
        for name in [n for n, f in self._running.items() if f.done() and n != job]:
            del self._running[name]
        future = self._running.get(job)
        if future is None or future.done():
            future = self._running[job] = in_daemon_thread(fn, f"kv-headroom-{job}")
        result: T = await asyncio.wait_for(asyncio.shield(future), timeout=within)
        return result
