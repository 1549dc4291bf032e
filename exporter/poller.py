"""The poll loop: the only writer. Sources → observation → history → snapshot → bytes.

Each poll gathers the sources concurrently, each under its own bound (HTTP timeouts for
vLLM; a daemon thread under a timeout for NVML, the process scan and model files), folds
the result into the history, builds a snapshot with the pure core and swaps it in together
with its rendered exposition. A failing source never fails a poll: it shows as
``source_up 0``, is logged once when it goes down and once when it comes back. Anything
else that goes wrong inside a poll is logged once as ``poll_failed`` and the last good
snapshot keeps being served, with vLLM marked down, until a poll succeeds again.

Blocking work runs in daemon threads, one at a time per kind: a call that hangs (a GPU
that fell off the bus, a stale NFS mount) is waited on by later polls instead of being
started again, and cannot keep the process from exiting on SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from exporter.capacity.arch import ModelArch, parse_config
from exporter.capacity.plan import Plan, PlanRequest, plan
from exporter.config import Config
from exporter.deployment import Resolved, gpu_for_plan, label_value, plan_request, resolve
from exporter.errors import InputError
from exporter.log import get_logger
from exporter.metrics import LIMITS, render_counted
from exporter.observe import History, Observation, Totals, advance, restarted
from exporter.snapshot import (
    Snapshot,
    SourceState,
    engine_views,
    gpu_views,
)
from exporter.sources.cmdline import Flags, VllmProcess, find_vllm_processes, parse_flags
from exporter.sources.model_dir import ModelSource, load_model
from exporter.sources.nvml import NvmlFailure, NvmlReader, NvmlSample, select_devices
from exporter.sources.vllm import ModelCard, SourceError, VllmClient, gather_vllm
from exporter.sources.vllm_page import MAX_ENGINES, EngineMetrics, VllmPage
from exporter.trail import record

CARD_REFRESH_SECONDS = 60.0
PROCESS_SCAN_SECONDS = 30.0
# Per-engine counter state is kept across polls so totals survive restarts; engines that
# stop appearing are forgotten, least recently seen first, beyond this many.
MAX_TRACKED_ENGINES = 2 * MAX_ENGINES

T = TypeVar("T")


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


@dataclass
class _Source:
    name: str
    up: bool = False
    seen: bool = False  # has ever been tried, so the first failure is logged too
    last_success: float | None = None
    error_kind: str | None = None
    error: str | None = None
    errors_total: int = 0
    down_since: float | None = None

    def state(self) -> SourceState:
        return SourceState(
            self.name, self.up, self.last_success, self.error_kind, self.error, self.errors_total
        )


@dataclass
class _Model:
    key: tuple[str, str]  # (where, dtype) it was loaded for
    source: ModelSource
    arch: ModelArch


@dataclass
class PollerDeps:
    """Everything the poller touches outside itself; tests replace any of it."""

    clock: Callable[[], float] = time.time
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    find_processes: Callable[[str], list[VllmProcess]] = find_vllm_processes
    read_flags: Callable[[VllmProcess], Flags] = lambda p: parse_flags(p.argv)
    load_model: Callable[[str], ModelSource] = load_model
    nvml: NvmlReader | None = None


class Poller:
    def __init__(self, config: Config, client: VllmClient, deps: PollerDeps | None = None):
        self.config = config
        self._client = client
        self._deps = deps or PollerDeps()
        if self._deps.nvml is None and config.nvml_enabled:
            self._deps.nvml = NvmlReader()
        self._log = get_logger()
        interval = config.poll_interval_seconds
        self.history = History(config.history_seconds, int(config.history_seconds / interval) + 8)
        self._sources = {name: _Source(name) for name in ("vllm", "nvml", "model")}
        if not config.nvml_enabled:
            del self._sources["nvml"]
        self._raw: OrderedDict[str, EngineMetrics] = OrderedDict()
        self._totals: dict[str, Totals] = {}
        self._jobs: dict[str, asyncio.Future[Any]] = {}
        self._page_problems = False
        self._limits_hit: set[str] = set()
        self._poll_failure: str | None = None
        self._card: ModelCard | None = None
        self._version: str | None = None
        self._card_due = 0.0
        self._flags: Flags | None = None
        self._process: VllmProcess | None = None
        self._scan_due = 0.0
        self._model: _Model | None = None
        self._nvml_task: asyncio.Future[NvmlSample | NvmlFailure] | None = None
        self._nvml: NvmlSample | None = None
        self._plans: dict[PlanRequest, Plan | str] = {}
        self._last_deployment: Mapping[str, object] = {}
        self._last_expected_note = ""
        self._start_time: float | None = None
        self._epoch = 0
        self.snapshot = self._empty_snapshot()
        self.rendered, _ = render_counted(self.snapshot)
        self.polls = 0
        self.created = self._deps.clock()
        self.last_poll_end: float | None = None

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
        page, _, _ = await asyncio.gather(
            self._poll_vllm(now), self._poll_processes(now), self._poll_nvml(now)
        )
        appended = False
        try:
            epoch = self._epoch
            observation = self._observe(now, page)
            self.history.append(observation)
            appended = True
            if self._epoch != epoch:  # a restart: the model and its limits may be new
                await self._refresh_card(now)
            deployment = self._resolve()
            await self._poll_model(now, deployment)
            snapshot = self._build(now, deployment, time.perf_counter() - started)
            rendered, limited = render_counted(snapshot)
        except Exception as e:
            # A bug, or input the core cannot take: forget this poll's observation so it
            # cannot fail every later poll too, and serve the last good snapshot with vLLM
            # marked down, so the failure shows where alerts look.
            if appended:
                self.history.drop_latest()
            self._failed(e)
            self._mark("vllm", now, ("internal", self._poll_failure or "poll failed"))
            snapshot = replace(
                self.snapshot,
                time=now,
                sources=tuple(src.state() for src in self._sources.values()),
            )
            rendered, limited = render_counted(snapshot)
        else:
            if self._poll_failure is not None:
                self._log.info("poll_recovered", error=self._poll_failure)
                self._poll_failure = None
        self._report_limits(limited)
        self.snapshot, self.rendered = snapshot, rendered
        record(self, snapshot)  # the status page's history chart (exporter/trail.py)
        self.polls += 1
        self.last_poll_end = self._deps.clock()
        return snapshot

    def _failed(self, e: Exception) -> None:
        """Log an unexpected failure once (until a poll succeeds), as one line, no traceback."""
        frame = e.__traceback__
        while frame is not None and frame.tb_next is not None:
            frame = frame.tb_next
        where = ""
        if frame is not None:
            code = frame.tb_frame.f_code
            where = f" at {Path(code.co_filename).name}:{frame.tb_lineno} in {code.co_name}"
        message = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}{where}"
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

    async def _bounded(self, job: str, fn: Callable[[], T], within: float) -> T:
        """``fn()`` in a daemon thread, waited on for at most ``within`` s (TimeoutError).

        One at a time per job: while an earlier call still runs, it is waited on again
        rather than a second one started beside it (NVML handles are not thread-safe, and
        a hung file system would otherwise collect a thread per poll).
        """
        future = self._jobs.get(job)
        if future is None or future.done():
            future = self._jobs[job] = in_daemon_thread(fn, f"kv-headroom-{job}")
        result: T = await asyncio.wait_for(asyncio.shield(future), timeout=within)
        return result

    def alive(self) -> bool:
        """Has a poll finished recently (within three intervals, at least 10 s)?"""
        limit = max(3 * self.config.poll_interval_seconds, 10.0)
        return self._deps.clock() - (self.last_poll_end or self.created) <= limit

    async def close(self) -> None:
        nvml = self._deps.nvml
        if nvml is not None:
            # Bounded, in a daemon thread: nvmlShutdown on a lost GPU can hang too.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(in_daemon_thread(nvml.close, "kv-headroom-nvml-close"), 2)

    # -- sources --------------------------------------------------------------------------

    def _mark(self, name: str, now: float, error: tuple[str, str] | None) -> None:
        """Record a source's outcome; log only when its state changes."""
        src = self._sources[name]
        if error is None:
            if not src.up:
                self._log.info(
                    "source_up",
                    source=name,
                    down_seconds=round(now - src.down_since, 1) if src.down_since else None,
                )
            src.up, src.last_success, src.error_kind, src.error = True, now, None, None
            src.down_since = None
        else:
            kind, message = error
            if kind != "not_configured":  # a choice, not a failure: count real errors only
                src.errors_total += 1
            if src.up or not src.seen or src.error_kind != kind:
                self._log.warning("source_down", source=name, kind=kind, error=message)
            if src.up or src.down_since is None:
                src.down_since = now
            src.up, src.error_kind, src.error = False, kind, message
        src.seen = True

    async def _poll_vllm(self, now: float) -> VllmPage | None:
        want_card = now >= self._card_due
        try:
            page, card, version = await gather_vllm(self._client, want_card=want_card)
        except SourceError as e:
            self._mark("vllm", now, (e.kind, str(e)))
            return None
        if want_card:
            self._card = card or self._card
            self._version = version or self._version
            self._card_due = now + CARD_REFRESH_SECONDS if card else now
        # Once when a page starts to carry problems (duplicates, bad values), once when it is
        # clean again: the page is still used, so this is a warning, not a source down.
        if page.problems and not self._page_problems:
            self._log.warning(
                "vllm_page_problems", first=page.problems[0], count=len(page.problems)
            )
        elif not page.problems and self._page_problems:
            self._log.info("vllm_page_clean")
        self._page_problems = bool(page.problems)
        self._mark("vllm", now, None)
        return page

    async def _refresh_card(self, now: float) -> None:
        results = await asyncio.gather(
            self._client.models(), self._client.version(), return_exceptions=True
        )
        card, version = results
        if isinstance(card, ModelCard):
            self._card, self._card_due = card, now + CARD_REFRESH_SECONDS
        if isinstance(version, str):
            self._version = version

    async def _poll_processes(self, now: float) -> None:
        if now < self._scan_due:
            return
        self._scan_due = now + PROCESS_SCAN_SECONDS
        find, read_flags = self._deps.find_processes, self._deps.read_flags
        proc = self.config.proc_path
        port = urlsplit(self.config.vllm_url).port or 80

        def scan() -> tuple[VllmProcess, Flags] | None:
            found = [(p, read_flags(p)) for p in find(proc)]
            # Several vLLMs on one host (not in a pod): the one serving our URL's port.
            serving = [(p, f) for p, f in found if f.values.get("port", 8000) == port]
            if serving:
                return serving[0]
            return found[0] if len(found) == 1 else None

        try:
            result = await self._bounded("scan", scan, self.config.vllm_timeout_seconds)
        except TimeoutError:
            return
        except Exception as e:  # an unreadable /proc entry is not worth a failed poll
            self._log.debug("process_scan_failed", error=f"{type(e).__name__}: {e}")
            return
        if result is None:
            self._process = self._process if self._flags else None
            return
        process, flags = result
        if self._process is None or process.pid != self._process.pid:
            self._log.info("vllm_process_found", pid=process.pid, problems=list(flags.problems))
        self._process, self._flags = process, flags

    async def _poll_nvml(self, now: float) -> None:
        reader = self._deps.nvml
        if reader is None:
            return
        if self._nvml_task is None or self._nvml_task.done():
            env = self._process.environ if self._process and self._process.environ else None
            wanted, selection = select_devices(
                self.config.nvml_devices, env if env is not None else self._deps.env
            )
            self._nvml_task = in_daemon_thread(
                lambda: reader.read(wanted, selection), "kv-headroom-nvml"
            )
        # A read still running from an earlier poll is waited on, never started twice:
        # NVML handles are not safe to use from two threads.
        try:
            result = await asyncio.wait_for(
                asyncio.shield(self._nvml_task), timeout=self.config.vllm_timeout_seconds
            )
        except TimeoutError:
            self._mark("nvml", now, ("timeout", "NVML did not answer in time"))
            self._nvml = None
            return
        if isinstance(result, NvmlFailure):
            self._mark("nvml", now, (result.kind, result.message))
            self._nvml = None
        else:
            self._mark("nvml", now, None)
            self._nvml = result

    async def _poll_model(self, now: float, deployment: Resolved) -> None:
        where = self._model_location(deployment)
        if where is None:
            self._mark("model", now, ("not_configured", "no model path: set model.path"))
            self._model = None
            return
        dtype = deployment.str_("dtype") or "auto"
        key = (where, dtype)
        if self._model is not None and self._model.key == key:
            self._mark("model", now, None)
            return
        load = self._deps.load_model

        def read() -> tuple[ModelSource, ModelArch]:
            source = load(where)
            return source, parse_config(
                source.config, source.config_path, dtype=dtype, name=source.name
            )

        try:
            # A model dir on a slow mount may take a few polls; the same read is awaited
            # again next poll rather than started twice.
            source, arch = await self._bounded(
                f"model:{where}:{dtype}", read, self.config.vllm_timeout_seconds
            )
        except TimeoutError:
            self._mark("model", now, ("timeout", f"reading {where} did not finish in time"))
            self._model = None
            return
        except InputError as e:
            self._mark("model", now, ("bad_model", str(e)))
            self._model = None
            return
        except (OSError, ValueError, RecursionError) as e:
            self._mark("model", now, ("bad_model", f"{where}: {type(e).__name__}: {e}"))
            self._model = None
            return
        self._model = _Model(key, source, arch)
        self._log.info(
            "model_loaded",
            path=source.config_path,
            model=source.name,
            attention_kind=arch.attention_kind.value,
            approximate=list(arch.approximate),
        )
        self._mark("model", now, None)

    def _model_location(self, deployment: Resolved) -> str | None:
        """``model.path``; else vLLM's ``--model`` when that path is visible here too."""
        if self.config.model_path:
            return self.config.model_path
        model = deployment.str_("model")
        if model and Path(model).exists():
            return model
        if model and "/" in model:
            env = self._process.environ if self._process else self._deps.env
            for root in _hf_caches(env):
                candidate = root / ("models--" + model.replace("/", "--"))
                if candidate.is_dir():
                    return str(candidate)
        return None

    # -- folding --------------------------------------------------------------------------

    def _observe(self, now: float, page: VllmPage | None) -> Observation:
        if page is None:
            return Observation(now, None, dict(self._totals), self._epoch)
        reasons = []
        if (
            self._start_time is not None
            and page.process_start_time is not None
            and page.process_start_time != self._start_time
        ):
            reasons.append("process_start_time_seconds changed")
        if page.process_start_time is not None:  # 0.0 is a start time too, not a missing one
            self._start_time = page.process_start_time
        for raw in page.engines:
            before = self._raw.get(raw.engine)
            if before is not None and restarted(before, raw):
                reasons.append(f"engine {raw.engine}: counters went backwards")
            if before is not None:
                changed = _capacity_labels_changed(before, raw)
                if changed:
                    # Only a restart re-sizes the cache, even one the counters do not show.
                    self._log.info("cache_config_changed", engine=raw.engine, changed=changed)
                    reasons.append(f"engine {raw.engine}: cache_config_info changed")
            self._totals[raw.engine] = advance(self._totals.get(raw.engine), before, raw)
            self._raw[raw.engine] = raw
            self._raw.move_to_end(raw.engine)
        while len(self._raw) > MAX_TRACKED_ENGINES:
            gone, _ = self._raw.popitem(last=False)
            self._totals.pop(gone, None)
        if reasons:
            self._on_restart(now, reasons)
        return Observation(now, page, dict(self._totals), self._epoch)

    def _on_restart(self, now: float, reasons: list[str]) -> None:
        # One event per restart, however many signs of it one page shows.
        self._log.info("vllm_restarted", reason="; ".join(reasons))
        self._epoch += 1
        self._card_due = self._scan_due = now  # flags and model may have changed with it

    def _resolve(self) -> Resolved:
        good = self.history.last_good()
        cache_config = None
        if good is not None and good.page is not None and good.page.engines:
            cache_config = good.page.engines[0].cache_config
        card = self._card
        cmdline: dict[str, object] = dict(self._flags.values) if self._flags else {}
        if self._flags and self._flags.model and "model" not in cmdline:
            cmdline["model"] = self._flags.model
        overrides = {k: v for k, v in asdict(self.config.deployment).items() if v is not None}
        resolved = resolve(
            cache_config=cache_config,
            max_model_len=card.max_model_len if card else None,
            version=self._version,
            served_model=card.root if card else None,
            cmdline=cmdline,
            config=overrides,
        )
        if dict(resolved.values) != self._last_deployment:
            changed = {
                k: f"{v} ({resolved.origin[k]})"
                for k, v in resolved.values.items()
                if self._last_deployment.get(k) != v
            }
            self._log.info("deployment", changed=changed)
            self._last_deployment = dict(resolved.values)
        return resolved

    def _expected(self, deployment: Resolved) -> tuple[Plan | None, str]:
        model = self._model
        if model is None:
            return None, "no model config: expected capacity needs the model's config.json"
        nvml_gpu = None
        if self._nvml is not None and self._nvml.gpus:
            first = self._nvml.gpus[0]
            nvml_gpu = (first.name, first.cuda_total_bytes)
        gpu, gpu_note = gpu_for_plan(
            nvml_gpu,
            self.config.deployment.gpu,
            deployment.int_("kv_cache_memory_bytes") is not None,
        )
        if gpu is None:
            return None, f"GPU memory {gpu_note}"
        request = plan_request(
            deployment,
            arch=model.arch,
            model_name=model.source.name,
            gpu=gpu,
            weights_bytes=model.source.weights_bytes,
            weights_source=model.source.weights_source or "estimate",
        )
        cached = self._plans.get(request)
        if cached is None:
            try:
                cached = plan(request)
            except InputError as e:
                cached = str(e)
            if len(self._plans) > 32:
                self._plans.clear()
            self._plans[request] = cached
        if isinstance(cached, str):
            return None, cached
        return cached, f"from the model config and flags; GPU {gpu_note}"

    def _build(self, now: float, deployment: Resolved, duration: float) -> Snapshot:
        expected, note = self._expected(deployment)
        if note != self._last_expected_note:
            self._log.info("expected_capacity", available=expected is not None, note=note)
            self._last_expected_note = note
        engines = engine_views(self.history, self.config.window_seconds, deployment, expected)
        per_token, per_token_source = _bytes_per_token(expected, self.history)
        gpus: tuple[Any, ...] = ()
        if self._nvml is not None:
            gpus = gpu_views(
                [
                    (g.index, g.uuid, g.name, g.cuda_total_bytes, g.total_bytes, g.used_bytes)
                    for g in self._nvml.gpus
                ],
                expected,
            )
        model = self._model
        limited: dict[str, int] = {}
        latest = self.history.latest
        if latest is not None and latest.page is not None:
            limited.update(latest.page.limited)
        if self._nvml is not None and self._nvml.left_out:
            limited["gpus"] = self._nvml.left_out
        return Snapshot(
            time=now,
            sources=tuple(s.state() for s in self._sources.values()),
            poll_duration_seconds=duration,
            deployment=deployment,
            model_name=model.source.name if model else (engines[0].model_name if engines else None),
            attention_kind=model.arch.attention_kind.value if model else None,
            kv_bytes_per_token=per_token,
            kv_bytes_per_token_source=per_token_source,
            expected=expected,
            expected_note=note,
            engines=engines,
            gpus=gpus,
            vllm_ready=self._sources["vllm"].last_success is not None,
            notes=tuple(model.arch.approximate) if model else (),
            limited=limited,
        )

    def _empty_snapshot(self) -> Snapshot:
        return Snapshot(
            time=self._deps.clock(),
            sources=tuple(s.state() for s in self._sources.values()),
            poll_duration_seconds=0.0,
            deployment=Resolved(),
            model_name=None,
            attention_kind=None,
            kv_bytes_per_token=None,
            kv_bytes_per_token_source=None,
            expected=None,
            expected_note="no poll yet",
            engines=(),
            gpus=(),
            vllm_ready=False,
        )


_CAPACITY_LABELS = ("num_gpu_blocks", "block_size", "kv_cache_memory_bytes", "cache_dtype")


def _capacity_labels_changed(before: EngineMetrics, now: EngineMetrics) -> dict[str, str]:
    """The cache_config_info labels that size the cache and differ between two reads."""
    a, b = before.cache_config or {}, now.cache_config or {}
    return {k: f"{a.get(k)} → {b.get(k)}" for k in _CAPACITY_LABELS if a.get(k) != b.get(k)}


def _bytes_per_token(expected: Plan | None, history: History) -> tuple[float | None, str | None]:
    """From the model config; else implied by vLLM's own memory ÷ tokens (no override)."""
    if expected is not None:
        return float(expected.kv_bytes_per_token), "config"
    good = history.last_good()
    if good is None or good.page is None or not good.page.engines:
        return None, None
    cc = good.page.engines[0].cache_config or {}
    memory = label_value(cc.get("kv_cache_memory_bytes"), int)
    tokens = label_value(cc.get("kv_cache_size_tokens"), int)
    override = label_value(cc.get("num_gpu_blocks_override"), int)
    if isinstance(memory, int) and isinstance(tokens, int) and tokens > 0 and override is None:
        return memory / tokens, "implied: kv_cache_memory_bytes ÷ kv_cache_size_tokens"
    return None, None


def _hf_caches(env: Mapping[str, str]) -> list[Path]:
    """Where a Hugging Face hub cache may be, as vLLM's environment says."""
    roots = []
    if env.get("HF_HUB_CACHE"):
        roots.append(Path(env["HF_HUB_CACHE"]))
    if env.get("HF_HOME"):
        roots.append(Path(env["HF_HOME"]) / "hub")
    roots.append(Path(env.get("HOME", "/root")) / ".cache" / "huggingface" / "hub")
    return roots
