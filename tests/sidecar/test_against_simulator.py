"""The sidecar against the simulated vLLM: the same checks as against real pages."""

from __future__ import annotations

import asyncio
import math

from aiohttp.test_utils import TestServer

from exporter.poller import PollerDeps
from exporter.simulator.nvml import SimulatedNvml
from exporter.simulator.server import create_app
from exporter.simulator.simulation import Simulation, load_scenario
from exporter.sources.nvml import NvmlReader
from tests.exposition import families_by_name
from tests.sidecar.conftest import MakeRig
from tests.sidecar.test_golden import check_metrics


def observed_and_expected(text: str, name: str) -> dict[str, float]:
    return {labels["source"]: v for labels, v in families_by_name(text)[name]}


async def test_expected_capacity_equals_what_the_simulator_serves(make_rig: MakeRig) -> None:
    sim = Simulation(load_scenario("steady"))
    server = TestServer(create_app(sim, speed=50.0), host="127.0.0.1")
    await server.start_server()
    try:
        nvml = SimulatedNvml("NVIDIA L4", sim.gpu_memory, 1)
        rig = await make_rig(
            str(server.make_url("")).rstrip("/"),
            model_path=sim.sizing.model_name,
            deps=PollerDeps(nvml=NvmlReader(nvml)),
        )
        await asyncio.sleep(0.5)
        await rig.poll(2)
        text = rig.text
        blocks = observed_and_expected(text, "kv_headroom_kv_capacity_blocks")
        assert blocks["observed"] == sim.sizing.plan.cap.num_blocks
        assert blocks["expected"] == blocks["observed"]
        tokens = observed_and_expected(text, "kv_headroom_kv_capacity_tokens")
        assert tokens["expected"] == tokens["observed"]
        status, report = await check_metrics(text)
        assert status == 0, report
    finally:
        await server.close()


async def test_the_forecast_usage_is_the_risks_forecast_level_over_the_capacity(
    make_rig: MakeRig,
) -> None:
    # The ticket's alert reads this gauge: it must be the risk model's own forecast (the
    # level the score rests on) over the cache, exported for each engine with a risk.
    sim = Simulation(load_scenario("steady"))
    server = TestServer(create_app(sim, speed=50.0), host="127.0.0.1")
    await server.start_server()
    try:
        rig = await make_rig(str(server.make_url("")).rstrip("/"), model_path=sim.sizing.model_name)
        await asyncio.sleep(0.5)
        await rig.poll(2)
        risks = {v.engine: v for v in rig.poller.snapshot.engines if v.risk is not None}
        exported = families_by_name(rig.text)["kv_headroom_forecast_usage_ratio"]
        usage = {labels["engine"]: value for labels, value in exported}
        assert set(usage) == set(risks)
        for engine, view in risks.items():
            assert view.risk is not None
            assert view.occupancy is not None
            # The cache the model scores against: the usable slots (used + free), which
            # leave out vLLM's reserved block.
            usable = view.occupancy.used_tokens + view.occupancy.free_tokens
            assert usage[engine] > 0  # the simulator is serving: a level to forecast
            assert math.isclose(usage[engine], view.risk.level_tokens / usable)
    finally:
        await server.close()
