"""A scenario running on the engine: the deployment sized by the capacity engine, the
traffic fed in at its arrival times, and the GPU as NVML would show it.

The same object runs on a virtual clock (``advance_to`` as fast as Python goes: the
alert benchmark, tests) or behind the HTTP server on a real clock (``demo``).
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from exporter.capacity.arch import parse_config
from exporter.capacity.gpus import GIB, Gpu, lookup_gpu
from exporter.capacity.memory import DEFAULT_OVERHEAD
from exporter.capacity.plan import Plan, PlanRequest, plan
from exporter.capacity.releases import release
from exporter.capacity.steptime import step_times
from exporter.errors import InputError
from exporter.simulator.engine import REASONS, Engine, EngineConfig, Request
from exporter.simulator.page import cache_config_labels, render_page
from exporter.simulator.scenario import (
    Arrival,
    Scenario,
    arrivals,
    closed_loop_requests,
    parse_scenario,
    with_logs,
)
from exporter.sources.model_dir import load_model

# What vLLM's process holds on a GPU outside its budget (the CUDA context), and the
# driver's reserve that NVML counts in memory.total but CUDA does not.
CUDA_CONTEXT_BYTES = GIB // 2
NVML_RESERVE_BYTES = 466 << 20


def builtin_names() -> list[str]:
    folder = resources.files("exporter.simulator").joinpath("scenarios")
    return sorted(
        p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml")
    )


def load_scenario(name_or_path: str) -> Scenario:
    """A built-in scenario by name, or a scenario file."""
    folder = resources.files("exporter.simulator").joinpath("scenarios")
    builtin = folder.joinpath(f"{name_or_path}.yaml")
    if builtin.is_file():
        scenario = parse_scenario(builtin.read_text("utf-8"), f"scenario:{name_or_path}")
        return with_logs(scenario, lambda p: folder.joinpath(p).read_text("utf-8"))
    path = Path(name_or_path)
    if not path.is_file():
        raise InputError(
            "--scenario",
            "",
            name_or_path,
            f"neither a file nor a built-in scenario ({', '.join(builtin_names())})",
        )
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(str(path), "", None, f"cannot be read: {e.strerror}") from None
    return with_logs(parse_scenario(text, str(path)), read_log)


def read_log(path: str) -> str:
    """A request log's text; one InputError line when it cannot be read."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(path, "", None, f"cannot be read: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise InputError(path, f"byte {e.start}", None, "is not UTF-8 text") from None


@dataclass(frozen=True)
class Sizing:
    """The simulated server: what vLLM would have sized for the scenario's deployment."""

    plan: Plan
    model_name: str
    gpu: Gpu
    cache_config: dict[str, str]


def size(scenario: Scenario) -> Sizing:
    """What vLLM would size for the scenario's deployment, by ``plan`` with the scenario's
    memory-model residuals (``Scenario.overhead``; None: today's)."""
    d = scenario.deployment
    where = scenario.source or scenario.name
    model_spec = str(d.get("model", "meta-llama/Llama-3.1-8B-Instruct"))
    source = load_model(model_spec)
    arch = parse_config(source.config, source.config_path, name=source.name)
    gpu = lookup_gpu(str(d.get("gpu", "H100-80GB")))
    req = PlanRequest(
        arch=arch,
        model_name=source.name,
        gpu=gpu,
        release=release(str(d.get("vllm_version", "0.32.0")), f"{where}: deployment.vllm_version"),
        gpu_memory_utilization=d.get("gpu_memory_utilization"),
        tensor_parallel_size=int(d.get("tensor_parallel_size", 1)),
        kv_cache_dtype=str(d.get("kv_cache_dtype", "auto")),
        block_size=d.get("block_size"),
        max_model_len=d.get("max_model_len"),
        max_num_seqs=d.get("max_num_seqs"),
        max_num_batched_tokens=d.get("max_num_batched_tokens"),
        kv_cache_memory_bytes=d.get("kv_cache_memory_bytes"),
        num_gpu_blocks_override=d.get("num_gpu_blocks_override"),
        weights_bytes=int(d["weights_bytes"]) if "weights_bytes" in d else source.weights_bytes,
        weights_source="scenario"
        if "weights_bytes" in d
        else (source.weights_source or "estimate"),
        overhead=scenario.overhead or DEFAULT_OVERHEAD,
    )
    sized = plan(req)
    if sized.startup_failure is not None:
        raise InputError(
            where, "deployment", None, f"vLLM would not start: {sized.startup_failure.message}"
        )
    kv_memory = d.get("kv_cache_memory_bytes")
    labels_engine = Engine(_engine_config(scenario, sized, gpu))
    cache_config = cache_config_labels(
        labels_engine,
        cache_dtype=str(d.get("kv_cache_dtype", "auto")),
        gpu_memory_utilization=sized.utilization,
        kv_cache_memory_bytes=int(kv_memory) if kv_memory is not None else None,
        num_gpu_blocks_override=d.get("num_gpu_blocks_override"),
        kv_cache_size_tokens=sized.cap.capacity_tokens,
        kv_cache_max_concurrency=sized.cap.max_concurrency,
    )
    return Sizing(sized, source.name, gpu, cache_config)


def step_time_model(sized: Plan, gpu: Gpu) -> dict[str, float]:
    """The engine's step times for a deployment, from the GPU's datasheet (``steptime``)."""
    steps = step_times(sized, gpu)
    return {
        "step_base_s": steps.base_s,
        "per_prefill_token_s": steps.per_prefill_token_s,
        "per_kv_token_s": steps.per_kv_token_s,
    }


def _engine_config(scenario: Scenario, sized: Plan, gpu: Gpu) -> EngineConfig:
    d = scenario.deployment
    timing = {**step_time_model(sized, gpu), **scenario.engine}
    return EngineConfig(
        num_blocks=sized.cap.num_blocks,
        block_size=sized.block_size,
        max_num_seqs=sized.max_num_seqs,
        max_num_batched_tokens=sized.max_num_batched_tokens,
        max_model_len=sized.max_model_len,
        enable_prefix_caching=bool(d.get("enable_prefix_caching", True)),
        **timing,
    )


# Public for ``plan --traffic``, which runs a scenario's traffic at its own plan.
engine_config = _engine_config


def submit_arrival(engine: Engine, a: Arrival) -> None:
    """Queue one scenario arrival on the engine, at its own time."""
    engine.submit(
        a.prompt,
        a.generation,
        n=a.n,
        prefix_key=a.prefix_key,
        prefix_len=a.prefix_len,
        at=a.time,
        cache_len=a.cache_len,
        block_hashes=a.block_hashes,
        hash_tokens=a.hash_tokens,
    )


class Simulation:
    """One scenario on one engine. ``advance_to(t)`` is the only way time moves."""

    def __init__(self, scenario: Scenario, *, start_time: float = 0.0) -> None:
        scenario = with_logs(scenario, read_log)
        self.scenario = scenario
        self.sizing = size(scenario)
        self.start_time = start_time
        self.engine = Engine(_engine_config(scenario, self.sizing.plan, self.sizing.gpu), start=0.0)
        self._arrivals: Iterator[Arrival] = arrivals(scenario)
        self._next: Arrival | None = next(self._arrivals, None)
        self._stall_edges = sorted({t for stall in scenario.stalls for t in stall})
        self._closed: deque[tuple[int, int]] = deque()
        if scenario.closed_loop is not None:
            self._closed.extend(closed_loop_requests(scenario))
            for _ in range(scenario.closed_loop.concurrency):
                self._submit_closed()
            self.engine.on_finish = self._on_finish

    def _submit_closed(self) -> None:
        if self._closed:
            prompt, generation = self._closed.popleft()
            self.engine.submit(prompt, generation)

    def _on_finish(self, _req: Request) -> None:
        self._submit_closed()

    @property
    def now(self) -> float:
        """Seconds since the scenario started."""
        return self.engine.now

    @property
    def done(self) -> bool:
        idle = not self.engine.running and not self.engine.waiting
        return self.now >= self.scenario.duration or (
            idle and self._next is None and not self._closed
        )

    def advance_to(self, t: float) -> None:
        # Stall edges split the way like arrivals do: the engine sees each in time.
        for edge in self._stall_edges:
            if self.engine.now < edge <= t:
                self._advance(edge)
        self._advance(t)

    def _advance(self, t: float) -> None:
        engine = self.engine
        while self._next is not None and self._next.time <= t:
            arrival = self._next
            engine.run_until(arrival.time, next_arrival=arrival.time)
            engine.stalled = self._stalled_at(engine.now)
            submit_arrival(engine, arrival)
            self._next = next(self._arrivals, None)
        engine.run_until(t, next_arrival=self._next.time if self._next else None)
        engine.stalled = self._stalled_at(max(engine.now, t))

    def _stalled_at(self, t: float) -> bool:
        return any(a <= t < b for a, b in self.scenario.stalls)

    # -- why requests wait (the simulator's truth; vLLM does not export it) -------------

    @property
    def bottleneck(self) -> str:
        """What keeps the head of the waiting queue from being admitted, now."""
        return self.engine.reason

    def bottleneck_between(self, t0: float, t1: float) -> dict[str, float]:
        """Seconds of ``[t0, t1)`` spent under each reason (the engine's change log)."""
        changes = self.engine.reason_changes
        out = dict.fromkeys(REASONS, 0.0)
        i = max(0, bisect.bisect_right(changes, (t0, "~")) - 1)
        while i < len(changes) and changes[i][0] < t1:
            start = max(t0, changes[i][0])
            end = min(t1, changes[i + 1][0] if i + 1 < len(changes) else t1)
            if end > start:
                out[changes[i][1]] += end - start
            i += 1
        return out

    def page(self) -> str:
        return render_page(
            self.engine,
            model_name=self.sizing.model_name,
            cache_config=self.sizing.cache_config,
            start_time=self.start_time,
        )

    # -- the GPU as NVML sees it ----------------------------------------------------------

    def gpu_memory(self) -> tuple[int, int, int]:
        """(NVML total, NVML used, CUDA total) at the current time."""
        p = self.sizing.plan
        cuda_total = self.sizing.gpu.total_bytes or 80 * GIB
        vllm_bytes = (
            p.tightest.requested
            if p.request.kv_cache_memory_bytes is None
            else p.tightest.weights + p.tightest.overhead + p.kv_budget_bytes
        )
        used = vllm_bytes + CUDA_CONTEXT_BYTES + self.scenario.foreign_bytes_at(self.now)
        nvml_total = cuda_total + NVML_RESERVE_BYTES
        return nvml_total, min(used, nvml_total), cuda_total
