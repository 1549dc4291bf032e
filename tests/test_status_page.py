"""The status page ``/``: the headline first, the sidecar's own history as a picture (and as
text for a terminal browser), then the capacity chain, with every differing pair explained.

Driven by the demo's own stack in-process: the simulated vLLM on 127.0.0.1, the sidecar's
poller on a clock the test moves, so a few simulated minutes take a second or two.
"""

from __future__ import annotations

import base64
import contextlib
import math
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from exporter.config import Config
from exporter.demo_cli import sidecar_config, sidecar_deps
from exporter.poller import Poller
from exporter.risk.model import (
    ALERT_THRESHOLD,
    ALERT_USAGE,
    WARNING_CERTAIN,
    WARNING_THRESHOLD,
    WARNING_USAGE,
)
from exporter.simulator.server import create_app as simulator_app
from exporter.simulator.simulation import Simulation, load_scenario
from exporter.snapshot import Snapshot
from exporter.snapshot import empty as snapshot_empty
from exporter.sources.vllm import VllmClient
from exporter.status import alerts_row, status_page
from exporter.trail import Trail

START = 1_800_000_000.0


@dataclass
class Stack:
    sim: Simulation
    poller: Poller
    config: Config
    now: float = START

    async def run(self, seconds: float, every: float = 2.0) -> Snapshot:
        end = self.now + seconds
        while self.now < end:
            self.now += every
            self.sim.advance_to(self.now - START)
            await self.poller.poll_once()
        return self.poller.snapshot

    def page(self) -> str:
        return status_page(self.poller.snapshot, self.config, self.poller.trail)


@contextlib.asynccontextmanager
async def demo_stack(scenario: str = "demo") -> AsyncIterator[Stack]:
    """The demo's simulated vLLM and the sidecar's poller against it, on a clock the
    caller moves (the demo screen's tests use it too)."""
    sim = Simulation(load_scenario(scenario), start_time=START)
    # The simulation is moved by the test, not by the server's wall-clock task.
    server = TestServer(simulator_app(sim, clock=lambda: 0.0), host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    config = sidecar_config(sim, url, "127.0.0.1", 0, 2.0)
    stack = Stack(sim, None, config)  # type: ignore[arg-type]
    deps = sidecar_deps(sim, clock=lambda: stack.now)
    async with aiohttp.ClientSession() as session:
        client = VllmClient(session, url, timeout_seconds=1.0, max_bytes=config.vllm_max_page_bytes)
        stack.poller = Poller(config, client, deps)
        try:
            yield stack
        finally:
            await stack.poller.close()
            await server.close()


@pytest.fixture(name="demo")
async def _demo() -> AsyncIterator[Callable[[str], Awaitable[Stack]]]:
    async with contextlib.AsyncExitStack() as stacks:

        async def make(scenario: str = "demo") -> Stack:
            return await stacks.enter_async_context(demo_stack(scenario))

        yield make


async def test_the_page_leads_with_risk_forecast_exhaustion_headroom_limit_and_last_preemption(
    demo: Callable[[str], Awaitable[Stack]],
) -> None:
    stack = await demo("demo")
    await stack.run(240)
    html = stack.page()
    order = [
        "preemption risk</th>",
        "<th>forecast</th>",
        "<th>load headroom</th>",
        "<th>time to exhaustion</th>",
        "<th>headroom</th>",
        "<th>limited by</th>",
        "<th>last preemption</th>",
        "data:image/svg+xml",
        "capacity chain</h2>",
    ]
    positions = [html.index(label) for label in order]
    assert positions == sorted(positions)
    assert re.search(r"<td class=big>\d\.\d\d</td>", html)  # the score itself, up front


def _cell(html: str, row: str) -> str:
    m = re.search(rf"<th>{row}</th><td>([^<]*)</td>", html)
    assert m, f"no {row} row"
    return m.group(1)


async def test_the_forecast_usage_the_risk_rests_on_is_shown_beside_it(
    demo: Callable[[str], Awaitable[Stack]],
) -> None:
    stack = await demo("demo")
    snap = await stack.run(240)
    risk = snap.engines[0].risk
    assert risk is not None
    assert _cell(stack.page(), "forecast") == f"{risk.forecast_usage:.2f} of the cache"


async def test_the_risk_is_explained_with_how_often_this_engine_preempted_after_such_scores(
    demo: Callable[[str], Awaitable[Stack]],
) -> None:
    stack = await demo("demo")
    snap = await stack.run(240)
    probability = snap.engines[0].preemption_probability
    assert probability is not None
    assert f"followed by a preemption within 3 min {probability:.1%} of the time" in stack.page()


async def test_a_forecast_that_never_reaches_the_top_reads_not_on_this_trend(
    demo: Callable[[str], Awaitable[Stack]],
) -> None:
    # A minute in, with no trend yet (it waits for two minutes of history), the forecast
    # level stays well below the cache: the sidecar exports +Inf.
    stack = await demo("demo")
    snap = await stack.run(58)
    risk = snap.engines[0].risk
    assert risk is not None
    assert math.isinf(risk.seconds_to_exhaustion)
    assert _cell(stack.page(), "time to exhaustion") == "not on this trend"


async def test_a_forecast_that_crosses_the_top_gives_the_seconds_until_it_does(
    demo: Callable[[str], Awaitable[Stack]],
) -> None:
    # Two minutes in, the ramp's trend carries the forecast over the cache.
    stack = await demo("demo")
    snap = await stack.run(128)
    risk = snap.engines[0].risk
    assert risk is not None
    assert risk.forecast_usage > 1
    assert _cell(stack.page(), "time to exhaustion") == f"in {risk.seconds_to_exhaustion:,.0f} s"


async def test_the_load_headroom_says_how_much_traffic_fits_and_what_gives_out_first(
    demo: Callable[[str], Awaitable[Stack]],
) -> None:
    stack = await demo("demo")
    snap = await stack.run(240)
    ratio = snap.engines[0].load_headroom_ratio
    assert ratio is not None
    row = re.search(r"<th>load headroom</th><td>([^<]*)</td><td>([^<]*)</td>", stack.page())
    assert row
    assert row.group(1).startswith(f"{ratio:.2f}× today")
    assert row.group(1).endswith(f"{snap.engines[0].load_headroom_resource} gives out first")
    assert "below 1: add replicas" in row.group(2)


async def test_the_last_preemption_is_dated_once_vllm_has_preempted(
    demo: Callable[[str], Awaitable[Stack]],
) -> None:
    stack = await demo("demo")
    snap = await stack.run(300)
    assert snap.engines[0].preemptions_total > 0
    assert re.search(r"<th>last preemption</th><td>\d+ (s|min) ago</td>", stack.page())


async def test_the_history_chart_is_an_svg_carried_in_the_page_with_nothing_fetched_or_run(
    demo: Callable[[str], Awaitable[Stack]],
) -> None:
    stack = await demo("demo")
    await stack.run(120)
    html = stack.page()
    data = re.search(r"url\(data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)\)", html)
    assert data
    svg = base64.b64decode(data.group(1)).decode()
    assert svg.startswith("<svg")
    assert svg.count("<path") >= 4  # capacity, used tokens, risk, running (waiting may be 0)
    assert "<script" not in html
    assert "<script" not in svg
    assert not re.search(r"""(src|href)=["']?https?:""", html)  # no CDN, no remote font


async def test_a_terminal_browser_gets_the_history_as_text(
    demo: Callable[[str], Awaitable[Stack]],
) -> None:
    stack = await demo("demo")
    await stack.run(120)
    text = re.search(r"<pre class=text-chart>(.*?)</pre>", stack.page(), re.S)
    assert text
    lines = text.group(1).splitlines()
    assert [line.split()[0] for line in lines[1:]] == ["KV", "risk", "running", "waiting"]
    assert any(ch in lines[1] for ch in "▂▃▄▅▆▇█")


async def test_the_gpu_totals_of_the_chain_and_the_gpu_table_are_explained(
    demo: Callable[[str], Awaitable[Stack]],
) -> None:
    stack = await demo("demo")
    await stack.run(4)
    html = stack.page()
    assert "in the GPU table and" in html
    assert "the driver keeps for itself" in html


async def test_the_demo_gpu_holds_no_foreign_memory_of_its_own_making(
    demo: Callable[[str], Awaitable[Stack]],
) -> None:
    stack = await demo("demo")
    snap = await stack.run(4)
    assert [g.foreign_bytes for g in snap.gpus] == [0]


async def test_the_bottleneck_and_its_evidence_are_shown(
    demo: Callable[[str], Awaitable[Stack]],
) -> None:
    stack = await demo("demo")
    snap = await stack.run(10)
    view = replace(
        snap.engines[0], bottleneck="kv_cache", bottleneck_evidence="3 waiting, 0 free blocks"
    )
    html = status_page(replace(snap, engines=(view,)), stack.config, Trail())
    assert "<th>limited by</th><td>kv_cache</td><td>3 waiting, 0 free blocks</td>" in html


async def test_a_source_that_answers_without_a_part_is_up_and_names_the_part(
    demo: Callable[[str], Awaitable[Stack]],
) -> None:
    stack = await demo("demo")
    snap = await stack.run(4)
    sources = tuple(
        replace(s, missing=("cache_config_info",)) if s.name == "vllm" else s for s in snap.sources
    )
    html = status_page(replace(snap, sources=sources), stack.config, Trail())
    assert "<tr><th>vllm</th><td>up, partial</td><td>missing: cache_config_info</td></tr>" in html
    assert "vllm answers without cache_config_info" in html


def test_the_page_says_it_is_waiting_before_vllm_has_answered() -> None:
    html = status_page(_empty_snapshot(), Config(), Trail())
    assert "waiting for vLLM to answer /metrics" in html
    assert "image/svg" not in html


def _empty_snapshot() -> Snapshot:
    return snapshot_empty(START, ())


def test_the_alerts_row_says_the_page_is_armed_only_with_the_score_and_the_usage_peak_above() -> (
    None
):
    assert alerts_row(ALERT_THRESHOLD + 0.005, ALERT_USAGE + 0.05)[1].startswith("page armed")
    assert alerts_row(ALERT_THRESHOLD + 0.005, ALERT_USAGE - 0.05, WARNING_USAGE + 0.05)[
        1
    ].startswith("warning armed")
    assert alerts_row(0.2, ALERT_USAGE + 0.1, ALERT_USAGE + 0.1)[1].startswith("quiet")


def test_the_alerts_row_arms_the_warning_below_its_usage_gate_only_for_a_near_certain_score() -> (
    None
):
    below = WARNING_USAGE - 0.2
    assert alerts_row(WARNING_CERTAIN + 0.0005, below, below)[1].startswith("warning armed")
    held = alerts_row(WARNING_THRESHOLD + 0.3, below, below)[1]
    assert held.startswith("quiet: the score is above")


async def test_the_alerts_row_goes_quiet_then_warning_then_page_before_the_demos_first_preemption(
    demo: Callable[[str], Awaitable[Stack]],
) -> None:
    stack = await demo("demo")
    states: list[str] = []
    while True:
        snap = await stack.run(10)
        html = stack.page()
        m = re.search(r"<th>alerts</th><td>(page armed|warning armed|quiet)", html)
        if m and (not states or states[-1] != m.group(1)):
            states.append(m.group(1))
        if snap.engines[0].preemptions_total > 0 or stack.now - START > 600:
            break
    assert html.index("preemption risk</th>") < html.index("<th>alerts</th>")
    assert states == ["quiet", "warning armed", "page armed"]
