"""The poll loop, the only writer: it schedules the sources and swaps in each snapshot.

Each poll runs the first-stage sources concurrently (vLLM, the process scan, NVML), folds
the page into the history (``observe.fold``), resolves the deployment, runs the sources that
need it (the model directory), assembles the snapshot (``snapshot.build``) and swaps it in;
the first scrape that asks for it renders its exposition, once. Each source is bounded on
its own (HTTP timeouts, a daemon thread under a timeout) and guarded here: whatever it
raises, it shows as ``source_up 0`` and never fails the poll. A source is logged once when
it goes down and once when it comes back. Anything else that goes wrong inside a poll (or
in rendering it) is logged once as ``poll_failed`` and the last good snapshot keeps being
served, with vLLM marked down, until a poll succeeds again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from exporter import snapshot as snapshots
from exporter.config import Config
from exporter.deployment import Deployment, resolved
from exporter.log import get_logger
from exporter.metrics import LIMITS, render_counted
from exporter.observe import Folder, History, fold
from exporter.risk.calibration import Calibrations
from exporter.risk.model import HORIZON, Z_HALF
from exporter.risk.odds import EngineOdds
from exporter.snapshot import Snapshot
from exporter.sources.base import (
    Closing,
    Outcome,
    PollerDeps,
    Readings,
    Source,
    SourceContext,
    SourceHealth,
    Stage,
)
from exporter.sources.cmdline import FLAGS
from exporter.sources.records import VllmApi
from exporter.sources.registry import REGISTRY
from exporter.sources.vllm import CARD, PAGE, VERSION
from exporter.trail import Trail

__all__ = ["Poller", "PollerDeps"]  # PollerDeps lives with the sources; callers import it here


class Poller:
    def __init__(self, config: Config, client: VllmApi, deps: PollerDeps | None = None):
        self.config = config
        self._client = client
        self._deps = deps or PollerDeps()
        self._log = get_logger()
        interval = config.poll_interval_seconds
        self.history = History(config.history_seconds, int(config.history_seconds / interval) + 8)
        # How far each engine's occupancy climbed above the risk model's forecasts.
        self.calibrations = Calibrations(HORIZON, Z_HALF)
        # How often each engine's scores were followed by a preemption.
        self.odds = EngineOdds(HORIZON)
        self.trail = Trail()
        self._sources = self._make_sources()
        self._health = {s.name: SourceHealth(s.name) for s in self._sources if s.reports_health}
        self.readings = Readings(order=tuple(s.name for s in self._sources))
        self._folder = Folder()
        self._limits_hit: set[str] = set()
        self._poll_failure: str | None = None
        self._last_resolved: Deployment | None = None  # the same object while nothing changed
        self._last_expected_note = ""
        self._missing: tuple[str, ...] = ()
        self.snapshot = snapshots.empty(self._deps.clock(), self._states())
        # The empty snapshot renders here, so a scrape always has a rendered one to fall back on.
        self._rendered_for, self._rendered = self.snapshot, render_counted(self.snapshot)[0]
        self.polls = 0
        self.created = self._deps.clock()
        self.last_poll_end: float | None = None

    def _make_sources(self) -> list[Source]:
        """The registry's enabled sources, in the order their health is exported."""
        context = SourceContext(self.config, self._deps, self._client)
        return [plugin.make(context) for plugin in REGISTRY if plugin.on(self.config)]

    # -- the loop -------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Poll every interval (start to start) until ``stop`` is set."""
        interval = self.config.poll_interval_seconds
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while not stop.is_set():
            try:
                await self.poll_once()
            except Exception as e:  # poll_once guards itself; this keeps the loop alive regardless
                self._failed(e)
            next_at += interval
            delay = next_at - loop.time()
            if delay < 0:  # a slow poll: skip the missed ticks instead of bunching up
                next_at = loop.time()
                delay = 0
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)

    async def poll_once(self) -> Snapshot:
        started = time.perf_counter()
        now = self._deps.clock()
        readings = self.readings
        await self._run_stage(Stage.FIRST, now)
        appended = False
        try:
            folded = fold(self._folder, now, readings.get(PAGE))
            self.history.append(folded.observation)
            appended = True
            self._folder = folded.folder
            self._note_missing(readings)
            if folded.restarted:
                self._on_restart(folded.restart_reasons, folded.cache_changes)
                await asyncio.gather(*(s.on_restart(now, readings) for s in self._sources))
            readings.deployment = self._resolve()
            await self._run_stage(Stage.AFTER_DEPLOYMENT, now)
            snapshot = snapshots.build(
                now,
                history=self.history,
                readings=readings,
                sources=self._states(),
                deployment=readings.deployment,
                window_seconds=self.config.window_seconds,
                configured_gpu=self.config.deployment.gpu,
                duration=time.perf_counter() - started,
                excursions=self.calibrations.worst(now),
            )
            self._judge(snapshot)
            snapshot = self._calibrate(snapshot)
            self._note_expected(snapshot)
        except Exception as e:
            # A bug, or input the core cannot take: forget this poll's observation so it
            # cannot fail every later poll too, and serve the last good snapshot with vLLM
            # marked down, so the failure shows where alerts look.
            if appended:
                self.history.drop_latest()
            self._failed(e)
            self._mark("vllm", now, ("internal", self._poll_failure or "poll failed"))
            snapshot = replace(self.snapshot, time=now, sources=self._states())
        else:
            if self._poll_failure is not None:
                self._log.info("poll_recovered", error=self._poll_failure)
                self._poll_failure = None
        self.snapshot = snapshot
        self.trail.add(snapshot)  # the status page's history chart
        self.polls += 1
        self.last_poll_end = self._deps.clock()
        return snapshot

    @property
    def rendered(self) -> bytes:
        """The exposition of the current snapshot, rendered when a scrape first asks for it:
        polls (every 2 s) outnumber scrapes (every 15-60 s), so most snapshots are never
        rendered, and the poll does not wait for it."""
        snapshot = self.snapshot
        if snapshot is not self._rendered_for:
            try:
                body, limited = render_counted(snapshot)
            except Exception as e:
                # A bug in rendering: as for one in the poll, the last snapshot that rendered,
                # with vLLM marked down, so the failure shows where alerts look.
                self._failed(e)
                self._mark("vllm", snapshot.time, ("internal", self._poll_failure or "render"))
                snapshot = replace(self._rendered_for, time=snapshot.time, sources=self._states())
                self.snapshot = snapshot
                body, limited = render_counted(snapshot)
            self._report_limits(limited)
            self._rendered_for, self._rendered = snapshot, body
        return self._rendered

    async def _run_stage(self, stage: Stage, now: float) -> None:
        """The stage's due sources concurrently, each timed, guarded and marked on its own
        (one not due keeps its last health)."""
        runs = [self._run_one(s, now) for s in self._sources if s.stage is stage and _due(s, now)]
        if len(runs) == 1:  # nothing to run beside it: no task to create and schedule
            await runs[0]
        elif runs:
            await asyncio.gather(*runs)

    async def _run_one(self, source: Source, now: float) -> None:
        started = time.perf_counter()
        outcome: Outcome
        try:
            outcome = await source.poll(now, self.readings)
        except Exception as e:  # a source's bug is that source down, not a failed poll
            outcome = ("internal", _one_line(e))
        if source.reports_health:
            self._health[source.name].duration = time.perf_counter() - started
            self._mark(source.name, now, outcome)

    def _states(self) -> tuple[snapshots.SourceState, ...]:
        return tuple(h.state() for h in self._health.values())

    def _mark(self, name: str, now: float, outcome: Outcome) -> None:
        event = self._health[name].mark(now, outcome)
        if event is not None:
            kind, fields = event
            log = self._log.info if kind == "source_up" else self._log.warning
            log(kind, **fields)

    def _note_missing(self, readings: Readings) -> None:
        """vLLM answered without something the sidecar reads: once per change, a log event."""
        page = readings.get(PAGE)
        if page is None:
            return
        missing = page.missing
        if missing != self._missing:
            if missing:
                self._log.warning("vllm_page_missing", missing=list(missing))
            else:
                self._log.info("vllm_page_complete")
            self._missing = missing
        self._health["vllm"].missing = missing

    def _on_restart(
        self, reasons: Sequence[str], changes: Sequence[tuple[str, Mapping[str, str]]]
    ) -> None:
        for engine, changed in changes:
            self._log.info("cache_config_changed", engine=engine, changed=dict(changed))
        # One event per restart, however many signs of it one page shows.
        self._log.info("vllm_restarted", reason="; ".join(reasons))

    def _resolve(self) -> Deployment:
        """The flags vLLM runs with, from its last good page, /v1/models, its command line
        and the sidecar's ``deployment:`` config, most trusted first."""
        good = self.history.last_good()
        page = good.page if good is not None else None
        card, flags = self.readings.get(CARD), self.readings.get(FLAGS)
        deployment = resolved(
            cache_config=page.engines[0].cache_config if page and page.engines else None,
            max_model_len=card.max_model_len if card else None,
            version=self.readings.get(VERSION),
            served_model=card.root if card else None,
            cmdline=flags.values if flags else None,
            cmdline_model=flags.model if flags else None,
            config=self.config.deployment,
        )
        if deployment is self._last_resolved:
            return deployment
        before = dict(self._last_resolved.items()) if self._last_resolved is not None else {}
        self._last_resolved = deployment
        if dict(deployment.items()) != before:
            changed = {
                k: f"{v} ({deployment.origin[k]})"
                for k, v in deployment.items()
                if before.get(k) != v
            }
            self._log.info("deployment", changed=changed)
        return deployment

    def _judge(self, snapshot: Snapshot) -> None:
        """Keep each engine's forecast, to be judged once its horizon has passed."""
        latest = self.history.latest
        if latest is None:
            return
        for view in snapshot.engines:
            point = latest.points.get(view.engine)
            if view.risk is None or view.occupancy is None or point is None:
                continue
            capacity = view.occupancy.usable_blocks * view.occupancy.block_size
            self.calibrations.observe(
                view.engine,
                point.t,
                point.usage * capacity,
                view.risk.level_tokens,
                view.risk.spread_tokens,
                (point.epoch, capacity),
            )

    def _calibrate(self, snapshot: Snapshot) -> Snapshot:
        """Each engine's score as its own past calibrates it (risk/odds.py)."""
        latest = self.history.latest
        if latest is None:
            return snapshot
        # Without vLLM's preemption counter no poll can be judged: no figure at all, rather
        # than one that only ever learns "nothing followed".
        page = self.readings.get(PAGE)
        counted = {e.engine for e in page.engines if e.preemptions is not None} if page else set()
        views = []
        for view in snapshot.engines:
            point = latest.points.get(view.engine)
            if (
                view.risk is not None
                and point is not None
                and point.preemptions is not None
                and view.engine in counted
                and not view.stale
            ):
                probability = self.odds.observe(
                    view.engine, point.epoch, point.t, view.risk.preemption_risk, point.preemptions
                )
                view = replace(view, preemption_probability=probability)
            views.append(view)
        return replace(snapshot, engines=tuple(views))

    def _note_expected(self, snapshot: Snapshot) -> None:
        if snapshot.expected_note != self._last_expected_note:
            self._log.info(
                "expected_capacity",
                available=snapshot.expected is not None,
                note=snapshot.expected_note,
            )
            self._last_expected_note = snapshot.expected_note

    def _failed(self, e: Exception) -> None:
        """Log an unexpected failure once (until a poll succeeds), as one line, no traceback."""
        message = _one_line(e)
        if message != self._poll_failure:
            self._log.error("poll_failed", error=message)
        self._poll_failure = message

    def _report_limits(self, limited: Mapping[str, int]) -> None:
        """One event when a cardinality limit starts to bite, one when it stops."""
        for limit in LIMITS:
            hit = limited.get(limit, 0) > 0
            if hit and limit not in self._limits_hit:
                self._log.warning("limit_reached", limit=limit, left_out=limited[limit])
                self._limits_hit.add(limit)
            elif not hit and limit in self._limits_hit:
                self._log.info("limit_cleared", limit=limit)
                self._limits_hit.discard(limit)

    def alive(self) -> bool:
        """Has a poll finished recently (within three intervals, at least 10 s)?"""
        limit = max(3 * self.config.poll_interval_seconds, 10.0)
        return self._deps.clock() - (self.last_poll_end or self.created) <= limit

    async def close(self) -> None:
        """Each source that holds something (a session, an NVML handle) lets it go; one that
        fails to close does not keep the others from closing."""
        for source in self._sources:
            if isinstance(source, Closing):
                try:
                    await source.close()
                except Exception as e:
                    self._log.warning("source_close_failed", source=source.name, error=_one_line(e))


def _due(source: Source, now: float) -> bool:
    try:
        return source.due(now)
    except Exception:  # a bug there: poll it anyway, and its poll says what is wrong
        return True


def _one_line(e: BaseException) -> str:
    """``Type: message at file:line in function``, where it was raised: one log line."""
    frame = e.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    where = ""
    if frame is not None:
        code = frame.tb_frame.f_code
        where = f" at {Path(code.co_filename).name}:{frame.tb_lineno} in {code.co_name}"
    return f"{type(e).__name__}: {' '.join(str(e).split())[:200]}{where}"
