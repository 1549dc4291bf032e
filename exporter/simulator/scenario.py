"""Scenarios: a deployment and the traffic it meets, declared in YAML.

```yaml
name: ramp-to-overload
description: traffic grows until the cache cannot hold it
expect: overload            # or safe: what the alert benchmark should see
duration: 30m
seed: 7
deployment: {model: meta-llama/Llama-3.1-8B-Instruct, gpu: L4, max_model_len: 8192}
engine: {step_base: 75ms, per_prefill_token: 300us}  # optional: else from the GPU
phases:
  - duration: 10m
    rate: 0.2               # requests per second, Poisson
    rate_to: 1.5            # optional: ramps linearly to this over the phase
    prompt: {median: 800, sigma: 0.6, max: 6000}     # lognormal, capped
    generation: {median: 300, sigma: 0.7, max: 2000}
    n: 1                    # parallel sampling
    shared_prefix: {tokens: 512, groups: 4}          # optional
    burst: {count: 15, over: 3m, prompt: {median: 5000}}  # optional, from the phase start
foreign_memory: [{at: 20m, bytes: 6GiB}]             # another process on the GPU
stalls: [{at: 12m, duration: 3m}]   # the scheduler stops admitting; /health stays 200
traffic:                  # requests from a log, instead of or on top of phases
  file: traces/chat.jsonl # relative to the scenario file
  format: jsonl           # or csv; default from the file's extension
  columns: {time: timestamp, prompt: input_length, output: output_length,
            hashes: hash_ids, session: conversation_id, n: n}
  time_unit: ms           # of the time column: s, ms, us
  hash_block_tokens: 512  # tokens per prefix hash
  start: 10m              # log time after its first request
  duration: 20m           # log time replayed
  time_scale: 1.0         # log seconds → scenario seconds
  rate_scale: 0.25        # keep a quarter of the requests (seeded); > 1 adds copies
  rate_scale_to: 0.5      # optional: the scale ramps to this over the window
  loop: false             # repeat the window until the scenario ends
  at: 0s                  # when in the scenario the log starts
  jitter: 1s              # spread each request over the log's time resolution
```

or, instead of ``phases``, ``closed_loop: {concurrency: 20, requests: 40, prompt: …,
generation: …}`` — a fixed number of clients that each send the next request when their
previous one finishes. ``traffic`` may be one log or a list of them. Pure: parsing takes
the text (``with_logs`` adds the logs' records, read by the caller); sampling takes a
seeded RNG.
"""

from __future__ import annotations

import heapq
import math
import random
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import PurePath
from typing import Any

import yaml

from exporter.capacity.gpus import parse_bytes
from exporter.capacity.memory import OverheadModel
from exporter.errors import InputError
from exporter.simulator.requestlog import (
    ROLES,
    TIME_UNITS,
    LogFormat,
    LoggedRequest,
    TrafficSpec,
    window,
)

_DURATION = re.compile(
    r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?!s))?(?:(\d+(?:\.\d+)?)s)?(?:(\d+(?:\.\d+)?)ms)?(?:(\d+(?:\.\d+)?)us)?$"
)


def parse_duration(value: object, where: str, key: str) -> float:
    """``"1m30s"``, ``"500ms"``, ``"40us"`` or a number of seconds → seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION.match(value.strip())) and value.strip():
        h, mins, s, ms, us = (float(g) if g else 0.0 for g in m.groups())
        seconds = h * 3600 + mins * 60 + s + ms / 1e3 + us / 1e6
    else:
        raise InputError(where, key, value, "must be a duration like 30s, 10m, 500ms")
    if seconds < 0:
        raise InputError(where, key, value, "must not be negative")
    return seconds


@dataclass(frozen=True)
class Lengths:
    """Token counts: lognormal (median, sigma) or uniform (min..max) or a fixed value."""

    median: float | None = None
    sigma: float = 0.0
    low: int = 1
    high: int = 1_000_000

    def sample(self, rng: random.Random) -> int:
        if self.median is None:
            return rng.randint(self.low, self.high)
        value = (
            self.median * math.exp(self.sigma * rng.gauss(0.0, 1.0)) if self.sigma else self.median
        )
        return max(self.low, min(self.high, round(value)))


@dataclass(frozen=True)
class Phase:
    duration: float
    rate: float
    rate_to: float | None
    prompt: Lengths
    generation: Lengths
    n: int = 1
    prefix_tokens: int = 0
    prefix_groups: int = 0
    burst_count: int = 0
    burst_over: float = 0.0
    burst_prompt: Lengths | None = None  # the burst's own lengths, if they differ
    burst_generation: Lengths | None = None


@dataclass(frozen=True)
class ClosedLoop:
    concurrency: int
    requests: int
    prompt: Lengths
    generation: Lengths


@dataclass(frozen=True)
class TrafficLog:
    """A request log a scenario replays: where it is, how to read it, which part."""

    file: str  # as written in the scenario
    path: str  # resolved against the scenario's folder
    format: LogFormat
    spec: TrafficSpec
    hash_block_tokens: int = 512
    records: tuple[LoggedRequest, ...] | None = None  # None until read


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    expect: str  # overload | safe
    duration: float
    seed: int
    deployment: Mapping[str, Any]
    engine: Mapping[str, float]
    phases: tuple[Phase, ...] = ()
    closed_loop: ClosedLoop | None = None
    foreign_memory: tuple[tuple[float, int], ...] = ()
    source: str = ""
    traffic: tuple[TrafficLog, ...] = ()
    stalls: tuple[tuple[float, float], ...] = ()  # (from, until): admission stopped
    tags: tuple[str, ...] = field(default=())  # the scenario's classes, for the benchmark
    # Arrivals drawn in code (the benchmark's randomized family), beside phases and logs.
    requests: tuple[Arrival, ...] = field(default=(), repr=False)
    # The residuals plan sizes the engine with; None: today's (the fuzz tier pins its own).
    overhead: OverheadModel | None = field(default=None, repr=False)

    def foreign_bytes_at(self, t: float) -> int:
        current = 0
        for at, nbytes in self.foreign_memory:
            if t >= at:
                current = nbytes
        return current


@dataclass(frozen=True)
class Arrival:
    time: float
    prompt: int
    generation: int
    n: int = 1
    prefix_key: int | None = None
    prefix_len: int = 0  # tokens of the prompt another request may have cached
    cache_len: int = 0  # tokens of this request's sequence it leaves in the prefix cache
    block_hashes: tuple[int, ...] = ()  # prefix-block hashes, ``hash_tokens`` tokens each
    hash_tokens: int = 0


def arrivals(scenario: Scenario) -> Iterator[Arrival]:
    """All open-loop arrivals, in time order: the phases' and the logs'."""
    streams = [_phase_arrivals(scenario), iter(sorted(scenario.requests, key=lambda a: a.time))]
    streams += [
        log_arrivals(log, index, scenario.seed, scenario.duration)
        for index, log in enumerate(scenario.traffic)
    ]
    return heapq.merge(*streams, key=lambda a: a.time)


# Prefix-cache keys of logged requests live apart from the phases' small group keys.
_SESSION_KEYS = 1 << 40
_HASH_KEYS = 1 << 44


def log_arrivals(log: TrafficLog, index: int, seed: int, until: float) -> Iterator[Arrival]:
    """A log's requests as arrivals. With prefix hashes, requests share the blocks whose
    hashes they share. Without, a session's turn reuses what its previous turn left in
    the cache (that turn's prompt and answer) while its prompt starts with that context;
    a shorter prompt starts a new conversation."""
    if log.records is None:
        raise ValueError(f"{log.path} was not read (use with_logs)")
    sessions: dict[str, tuple[int, int, int]] = {}  # id → (key, prompt, context)
    conversations = 0
    hash_base = _HASH_KEYS * (index + 1)
    for r in window(list(log.records), log.spec, seed + index, until):
        if r.hashes:
            yield Arrival(
                r.time,
                r.prompt,
                r.output,
                r.n,
                prefix_key=hash_base,
                prefix_len=min(r.prompt, len(r.hashes) * log.hash_block_tokens),
                cache_len=min(r.prompt, len(r.hashes) * log.hash_block_tokens),
                block_hashes=tuple(hash_base + h for h in r.hashes),
                hash_tokens=log.hash_block_tokens,
            )
        elif r.session is not None:
            key, prev_prompt, context = sessions.get(r.session, (0, 0, 0))
            if key == 0 or r.prompt < prev_prompt:
                conversations += 1
                key, context = _SESSION_KEYS + conversations, 0
            sessions[r.session] = (key, r.prompt, r.prompt + r.output)
            yield Arrival(
                r.time,
                r.prompt,
                r.output,
                r.n,
                prefix_key=key,
                prefix_len=min(r.prompt, context),
                cache_len=r.prompt + r.output,
            )
        else:
            yield Arrival(r.time, r.prompt, r.output, r.n)


def _phase_arrivals(scenario: Scenario) -> Iterator[Arrival]:
    """Open-loop arrivals, in time order: Poisson within each phase (rate ramping), bursts."""
    rng = random.Random(scenario.seed)
    start = 0.0
    for index, phase in enumerate(scenario.phases):
        end = start + phase.duration
        batch: list[Arrival] = []
        burst = replace(
            phase,
            prompt=phase.burst_prompt or phase.prompt,
            generation=phase.burst_generation or phase.generation,
        )
        for b in range(phase.burst_count):
            t = start + (phase.burst_over * b / max(1, phase.burst_count))
            batch.append(_request(rng, t, burst, index))
        t = start
        while True:
            rate = phase.rate
            if phase.rate_to is not None and phase.duration > 0:
                rate = phase.rate + (phase.rate_to - phase.rate) * (t - start) / phase.duration
            if rate <= 0:
                break
            t += rng.expovariate(rate)
            if t >= end:
                break
            batch.append(_request(rng, t, phase, index))
        yield from sorted(batch, key=lambda a: a.time)
        start = end


def _request(rng: random.Random, t: float, phase: Phase, index: int) -> Arrival:
    prompt = phase.prompt.sample(rng)
    key, shared = None, 0
    if phase.prefix_groups and phase.prefix_tokens:
        key = 1_000 * (index + 1) + rng.randrange(phase.prefix_groups)
        shared = min(phase.prefix_tokens, prompt)
    return Arrival(t, prompt, phase.generation.sample(rng), phase.n, key, shared, shared)


def closed_loop_requests(scenario: Scenario) -> list[tuple[int, int]]:
    loop = scenario.closed_loop
    assert loop is not None
    rng = random.Random(scenario.seed)
    return [(loop.prompt.sample(rng), loop.generation.sample(rng)) for _ in range(loop.requests)]


# -- parsing ------------------------------------------------------------------------------

_TOP = {
    "name",
    "description",
    "expect",
    "duration",
    "seed",
    "deployment",
    "engine",
    "phases",
    "closed_loop",
    "foreign_memory",
    "traffic",
    "stalls",
    "tags",
}
_PHASE = {"duration", "rate", "rate_to", "prompt", "generation", "n", "shared_prefix", "burst"}
_ENGINE = {
    "step_base": "step_base_s",
    "per_prefill_token": "per_prefill_token_s",
    "per_kv_token": "per_kv_token_s",
}
DEPLOYMENT_KEYS = {
    "model",
    "gpu",
    "vllm_version",
    "gpu_memory_utilization",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "block_size",
    "kv_cache_dtype",
    "num_gpu_blocks_override",
    "kv_cache_memory_bytes",
    "enable_prefix_caching",
    "tensor_parallel_size",
    "weights_bytes",
}
_TRAFFIC = {
    "file",
    "format",
    "columns",
    "time_unit",
    "hash_block_tokens",
    "start",
    "duration",
    "time_scale",
    "rate_scale",
    "rate_scale_to",
    "loop",
    "at",
    "jitter",
}


def _mapping(value: object, where: str, key: str, allowed: set[str]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InputError(where, key, value, "must be a mapping")
    unknown = sorted(str(k) for k in value if k not in allowed)
    if unknown:
        raise InputError(
            where,
            f"{key}.{unknown[0]}" if key else unknown[0],
            None,
            f"unknown key; valid: {', '.join(sorted(allowed))}",
        )
    return value


def _number(value: object, where: str, key: str, *, integer: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(where, key, value, "must be a number")
    if value < 0 or (integer and not float(value).is_integer()):
        raise InputError(
            where, key, value, "must be a non-negative " + ("integer" if integer else "number")
        )
    return float(value)


def _lengths(value: object, where: str, key: str) -> Lengths:
    if isinstance(value, int) and not isinstance(value, bool):
        return Lengths(float(value), 0.0, value, value)
    m = _mapping(value, where, key, {"median", "sigma", "min", "max", "value"})
    if "value" in m:
        v = int(_number(m["value"], where, f"{key}.value", integer=True))
        return Lengths(float(v), 0.0, v, v)
    low = int(_number(m.get("min", 1), where, f"{key}.min", integer=True))
    high = int(_number(m.get("max", 1_000_000), where, f"{key}.max", integer=True))
    if low > high:
        raise InputError(where, f"{key}.min", low, f"is above {key}.max ({high})")
    median = m.get("median")
    if median is None:
        if "max" not in m:
            raise InputError(where, key, dict(m), "give median (lognormal) or min and max")
        return Lengths(None, 0.0, low, high)
    return Lengths(
        _number(median, where, f"{key}.median"),
        _number(m.get("sigma", 0.0), where, f"{key}.sigma"),
        low,
        high,
    )


def _traffic(value: object, where: str, key: str) -> TrafficLog:
    t = _mapping(value, where, key, _TRAFFIC)
    file = t.get("file")
    if not isinstance(file, str) or not file:
        raise InputError(where, f"{key}.file", file, "name the request log (CSV or JSON Lines)")
    fmt = str(t.get("format") or ("csv" if file.lower().endswith(".csv") else "jsonl"))
    if fmt not in ("csv", "jsonl"):
        raise InputError(where, f"{key}.format", fmt, "must be csv or jsonl")
    columns = dict(LogFormat().columns)
    raw_columns = _mapping(t.get("columns", {}), where, f"{key}.columns", set(ROLES))
    columns.update({str(k): str(v) for k, v in raw_columns.items()})
    unit = str(t.get("time_unit", "s"))
    if unit not in TIME_UNITS:
        raise InputError(where, f"{key}.time_unit", unit, "must be s, ms or us")
    loop = t.get("loop", False)
    if not isinstance(loop, bool):
        raise InputError(where, f"{key}.loop", loop, "must be true or false")
    time_scale = _number(t.get("time_scale", 1.0), where, f"{key}.time_scale")
    if time_scale <= 0:
        raise InputError(where, f"{key}.time_scale", time_scale, "must be above 0")
    base = PurePath(where).parent if not where.startswith("scenario:") else PurePath()
    path = file if PurePath(file).is_absolute() else str(base / file)
    hash_tokens = int(
        _number(t.get("hash_block_tokens", 512), where, f"{key}.hash_block_tokens", integer=True)
    )
    if hash_tokens < 1:
        raise InputError(where, f"{key}.hash_block_tokens", hash_tokens, "must be at least 1")
    return TrafficLog(
        file=file,
        path=path,
        format=LogFormat(fmt, columns, unit),
        spec=TrafficSpec(
            time_scale=time_scale,
            rate_scale=_number(t.get("rate_scale", 1.0), where, f"{key}.rate_scale"),
            rate_scale_to=_number(t["rate_scale_to"], where, f"{key}.rate_scale_to")
            if "rate_scale_to" in t
            else None,
            start=parse_duration(t.get("start", 0), where, f"{key}.start"),
            duration=parse_duration(t["duration"], where, f"{key}.duration")
            if "duration" in t
            else None,
            loop=loop,
            offset=parse_duration(t.get("at", 0), where, f"{key}.at"),
            jitter=parse_duration(t.get("jitter", 0), where, f"{key}.jitter"),
        ),
        hash_block_tokens=hash_tokens,
    )


def parse_scenario(text: str, where: str) -> Scenario:
    """A scenario from YAML; every problem is an InputError naming the file and key.
    Request logs are named, not read: ``with_logs`` adds their records."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise InputError(where, "", None, f"is not valid YAML{at}") from None
    top = _mapping(doc, where, "", _TOP)
    name = str(top.get("name") or where)
    expect = str(top.get("expect", "safe"))
    if expect not in ("safe", "overload"):
        raise InputError(where, "expect", expect, "must be safe or overload")
    deployment = _mapping(top.get("deployment", {}), where, "deployment", DEPLOYMENT_KEYS)
    engine_raw = _mapping(top.get("engine", {}), where, "engine", set(_ENGINE))
    engine = {_ENGINE[k]: parse_duration(v, where, f"engine.{k}") for k, v in engine_raw.items()}
    phases = []
    for i, raw in enumerate(top.get("phases") or []):
        p = _mapping(raw, where, f"phases[{i}]", _PHASE)
        key = f"phases[{i}]"
        prefix = _mapping(
            p.get("shared_prefix", {}), where, f"{key}.shared_prefix", {"tokens", "groups"}
        )
        burst = _mapping(
            p.get("burst", {}), where, f"{key}.burst", {"count", "over", "prompt", "generation"}
        )
        phases.append(
            Phase(
                duration=parse_duration(p.get("duration", 0), where, f"{key}.duration"),
                rate=_number(p.get("rate", 0.0), where, f"{key}.rate"),
                rate_to=_number(p["rate_to"], where, f"{key}.rate_to") if "rate_to" in p else None,
                prompt=_lengths(
                    p.get("prompt", {"median": 500, "sigma": 0.5}), where, f"{key}.prompt"
                ),
                generation=_lengths(
                    p.get("generation", {"median": 200, "sigma": 0.5}), where, f"{key}.generation"
                ),
                n=max(1, int(_number(p.get("n", 1), where, f"{key}.n", integer=True))),
                prefix_tokens=int(
                    _number(
                        prefix.get("tokens", 0), where, f"{key}.shared_prefix.tokens", integer=True
                    )
                ),
                prefix_groups=int(
                    _number(
                        prefix.get("groups", 0), where, f"{key}.shared_prefix.groups", integer=True
                    )
                ),
                burst_count=int(
                    _number(burst.get("count", 0), where, f"{key}.burst.count", integer=True)
                ),
                burst_over=parse_duration(burst.get("over", 0), where, f"{key}.burst.over"),
                burst_prompt=_lengths(burst["prompt"], where, f"{key}.burst.prompt")
                if "prompt" in burst
                else None,
                burst_generation=_lengths(burst["generation"], where, f"{key}.burst.generation")
                if "generation" in burst
                else None,
            )
        )
    closed = None
    if "closed_loop" in top:
        c = _mapping(
            top["closed_loop"],
            where,
            "closed_loop",
            {"concurrency", "requests", "prompt", "generation"},
        )
        closed = ClosedLoop(
            concurrency=int(
                _number(c.get("concurrency", 1), where, "closed_loop.concurrency", integer=True)
            ),
            requests=int(
                _number(c.get("requests", 1), where, "closed_loop.requests", integer=True)
            ),
            prompt=_lengths(c.get("prompt", 500), where, "closed_loop.prompt"),
            generation=_lengths(c.get("generation", 200), where, "closed_loop.generation"),
        )
    raw_traffic = top.get("traffic") or []
    if isinstance(raw_traffic, Mapping):
        raw_traffic = [raw_traffic]
    if not isinstance(raw_traffic, list):
        raise InputError(where, "traffic", raw_traffic, "must be a log or a list of logs")
    traffic = tuple(
        _traffic(raw, where, "traffic" if len(raw_traffic) == 1 else f"traffic[{i}]")
        for i, raw in enumerate(raw_traffic)
    )
    if not phases and closed is None and not traffic:
        raise InputError(where, "phases", None, "a scenario needs phases, traffic or closed_loop")
    stalls: list[tuple[float, float]] = []
    for i, raw in enumerate(top.get("stalls") or []):
        st = _mapping(raw, where, f"stalls[{i}]", {"at", "duration"})
        begin = parse_duration(st.get("at", 0), where, f"stalls[{i}].at")
        length = parse_duration(st.get("duration", 0), where, f"stalls[{i}].duration")
        stalls.append((begin, begin + length))
    tags = top.get("tags") or []
    if not isinstance(tags, list):
        raise InputError(where, "tags", tags, "must be a list of class names")
    total = sum(p.duration for p in phases)
    if "duration" not in top and traffic and not total:
        raise InputError(where, "duration", None, "a scenario that replays a log needs one")
    duration = parse_duration(top.get("duration", total or 600), where, "duration")
    foreign = []
    for i, raw in enumerate(top.get("foreign_memory") or []):
        f = _mapping(raw, where, f"foreign_memory[{i}]", {"at", "bytes"})
        size = f.get("bytes", 0)
        nbytes = (
            int(size)
            if isinstance(size, int)
            else parse_bytes(str(size), f"{where}: foreign_memory[{i}].bytes")
        )
        foreign.append((parse_duration(f.get("at", 0), where, f"foreign_memory[{i}].at"), nbytes))
    return Scenario(
        name=name,
        description=str(top.get("description", "")),
        expect=expect,
        duration=duration,
        seed=int(_number(top.get("seed", 0), where, "seed", integer=True)),
        deployment=dict(deployment),
        engine=engine,
        phases=tuple(phases),
        closed_loop=closed,
        foreign_memory=tuple(sorted(foreign)),
        source=where,
        traffic=traffic,
        stalls=tuple(sorted(stalls)),
        tags=tuple(str(t) for t in tags),
    )


def with_logs(scenario: Scenario, read: Callable[[str], str]) -> Scenario:
    """The scenario with its logs' records, each read through ``read(path)`` (which
    raises InputError when it cannot) and parsed by ``parse_request_log``."""
    from exporter.simulator.requestlog import parse_request_log

    logs = tuple(
        log
        if log.records is not None
        else replace(log, records=tuple(parse_request_log(read(log.path), log.path, log.format)))
        for log in scenario.traffic
    )
    return replace(scenario, traffic=logs)
