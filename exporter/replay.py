"""Run the sidecar's own poll pipeline against a scenario on the virtual clock.

Each poll advances the simulation to the poll's time, renders vLLM's page, and hands it
to a real ``Poller`` — parser, history, snapshot and risk model exactly as deployed —
through a client stand-in instead of HTTP. Hours of traffic take seconds; what comes
back is, per poll, what the sidecar exported and what vLLM reported — and what only the
simulator knows: why requests waited over the poll's interval (``truth``), to check the
sidecar's bottleneck gauge (``gauge``; None while the sidecar has no such gauge) against.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass

from exporter.config import Config
from exporter.deployment import Deployment
from exporter.poller import Poller, PollerDeps
from exporter.simulator.engine import Engine
from exporter.simulator.scenario import Scenario
from exporter.simulator.simulation import Simulation
from exporter.sources.records import ModelCard
from exporter.sources.vllm_page import VllmPage, parse_page


@dataclass(frozen=True)
class Tick:
    """One poll: what vLLM reported and what the sidecar made of it."""

    t: float
    usage: float  # vllm:kv_cache_usage_perc
    preemptions_counted: float  # vllm:num_preemptions_total (lags the events)
    preempted: int  # preemptions that have happened by now (the simulator knows)
    running: float
    waiting: float
    preemption_risk: float
    seconds_to_exhaustion: float
    overcommit_ratio: float
    truth: str = "none"  # the reason requests waited longest over the poll's interval
    gauge: str | None = None  # the resource the sidecar's bottleneck gauge named
    load_headroom_ratio: float | None = None  # None: no traffic to scale
    load_headroom_resource: str | None = None
    edge: float = 0.0  # the forecast occupancy over the capacity (the ticket's gauge)
    # Blocks the work vLLM has admitted or queued still needs to finish (each request at
    # its full length, as the simulator knows it; prefix sharing and releases ignored), and
    # the free blocks: once the first exceeds the second an overload is visible to anyone
    # who knew every request's length (issue 34's "earliest any rule could know").
    blocks_needed: int = 0
    blocks_free: int = 0


def gauge_resource(value: object) -> str | None:
    """The resource a bottleneck gauge names, whatever shape the sidecar gives it: a
    name, a mapping of resource to 0/1 (or to a score: the largest wins), or an object
    with a ``resource`` attribute."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        if not value:
            return None
        return str(max(value.items(), key=lambda kv: float(kv[1]))[0])
    resource = getattr(value, "resource", None)
    return None if resource is None else str(resource)


@dataclass(frozen=True)
class Replay:
    scenario: Scenario
    ticks: list[Tick]
    first_preemption_at: float | None  # when vLLM first preempted (not when it counted)
    # Request-seconds of waiting per reason over the run (the simulator's truth).
    request_seconds: Mapping[str, float] = dataclasses.field(default_factory=dict)
    # The same by the set of resources that bound at once ("compute+kv_cache").
    binding_seconds: Mapping[str, float] = dataclasses.field(default_factory=dict)


class _SimulatedClient:
    """What the poller asks of vLLM, answered by the simulation at the clock's time."""

    def __init__(self, sim: Simulation, clock: list[float]) -> None:
        self._sim, self._clock = sim, clock

    async def metrics(self) -> VllmPage:
        self._sim.advance_to(self._clock[0])
        return parse_page(self._sim.page())

    async def models(self) -> ModelCard:
        name = self._sim.sizing.model_name
        return ModelCard((name,), self._sim.sizing.plan.max_model_len, name)

    async def version(self) -> str:
        return self._sim.sizing.plan.request.release.label


def _blocks_needed(engine: Engine) -> int:
    """Blocks the running requests still need to reach their full length, and the waiting
    ones need in all (vLLM's queue, preempted requests included)."""
    bs = engine.config.block_size
    return sum(
        max(0, -(-(r.prompt_len + r.max_tokens) // bs) - r.held_blocks)
        for r in itertools.chain(engine.running, engine.waiting)
    )


async def _replay(scenario: Scenario, interval: float, after_preemption: float | None) -> Replay:
    sim = Simulation(scenario)
    clock = [0.0]
    plan = sim.sizing.plan
    config = Config(
        poll_interval_seconds=interval,
        vllm_timeout_seconds=min(1.0, interval / 2),
        nvml_enabled=False,
        model_path=sim.sizing.model_name,
        deployment=Deployment(
            max_num_seqs=plan.max_num_seqs,
            max_num_batched_tokens=plan.max_num_batched_tokens,
            gpu=sim.sizing.gpu.name,
        ),
    )
    deps = PollerDeps(clock=lambda: clock[0], find_processes=lambda _p: [])
    poller = Poller(config, _SimulatedClient(sim, clock), deps)
    ticks = []
    while clock[0] < scenario.duration:
        first = sim.engine.first_preemption_at
        if (
            after_preemption is not None
            and first is not None
            and clock[0] >= first + after_preemption
        ):
            break  # what comes after the first preemption is not what the run is judged on
        clock[0] += interval
        snap = await poller.poll_once()
        view = snap.engines[0] if snap.engines else None
        risk = view.risk if view is not None else None
        waited = sim.bottleneck_between(clock[0] - interval, clock[0])
        ticks.append(
            Tick(
                t=clock[0],
                usage=sim.engine.usage,
                preemptions_counted=sim.engine.stats.preemptions,
                preempted=sim.engine.preempted,
                running=float(len(sim.engine.running)),
                waiting=float(len(sim.engine.waiting)),
                preemption_risk=risk.preemption_risk if risk else 0.0,
                seconds_to_exhaustion=risk.seconds_to_exhaustion if risk else math.inf,
                overcommit_ratio=risk.overcommit_ratio if risk else 0.0,
                truth=max(waited.items(), key=lambda kv: kv[1])[0],
                # The lead engineer's gauge lands on EngineView later: read it if there.
                gauge=gauge_resource(getattr(view, "bottleneck", None)),
                load_headroom_ratio=view.load_headroom_ratio if view else None,
                load_headroom_resource=view.load_headroom_resource if view else None,
                edge=risk.forecast_usage if risk else 0.0,
                blocks_needed=_blocks_needed(sim.engine),
                blocks_free=sim.engine.pool.num_free,
            )
        )
    await poller.close()
    engine = sim.engine
    return Replay(
        scenario,
        ticks,
        engine.first_preemption_at,
        dict(engine.request_seconds),
        dict(engine.binding_seconds),
    )


def replay(
    scenario: Scenario, interval: float = 2.0, after_preemption: float | None = None
) -> Replay:
    """The sidecar polling a simulated vLLM every ``interval`` seconds for the scenario
    (with ``after_preemption``, only until that long after the first preemption)."""
    return asyncio.run(_replay(scenario, interval, after_preemption))
