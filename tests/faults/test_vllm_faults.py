"""Every way vLLM's HTTP answer can fail, against the running sidecar.

For each fault: /metrics keeps answering 200 with a valid exposition, source_up for vLLM is
0 with the fault's kind, one ``source_down`` event says so (not one per poll), capacity
keeps its last known value while the load figures are withheld, and the next good poll
brings it all back with one ``source_up`` event.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.faults.conftest import MakeSidecar, Sidecar, value
from tests.scripted_vllm import ScriptedVllm

KINDS = {
    "refused": "refused",
    "reset": "reset",
    "hang": "timeout",
    "trickle": "timeout",
    "huge": "too_large",
    "huge_chunked": "too_large",
    "status_500": "http_status",
    "gzip": "encoding",
    "truncated": "incomplete",
    "cut_line": "incomplete",
    "invalid_utf8": "decode",
    "garbage": "no_vllm_metrics",
    "nan": "incomplete",
    "inf": "incomplete",
    "minus_inf": "incomplete",
    "negative": "incomplete",
    "zero_block_size": "incomplete",
}


async def faulted(make_sidecar: MakeSidecar, scripted: ScriptedVllm, fault: str) -> Sidecar:
    """A sidecar that polled vLLM once healthy and twice under ``fault``."""
    sidecar: Sidecar = await make_sidecar(scripted.url)
    await sidecar.poll()
    scripted.trickle_seconds = 0.2  # a byte every 0.2 s: the 0.5 s timeout still ends it
    await scripted.set_fault(fault)
    sidecar.forget_events()
    # Bounded: a poll that a fault could hold past its timeout fails here, not by hanging.
    await asyncio.wait_for(sidecar.poll(2), timeout=30)
    return sidecar


@pytest.mark.parametrize("fault", KINDS)
async def test_fault_shows_vllm_down_with_its_kind(
    make_sidecar: MakeSidecar, scripted: ScriptedVllm, fault: str
) -> None:
    sidecar = await faulted(make_sidecar, scripted, fault)
    text = await sidecar.scrape()
    assert value(text, "kv_headroom_source_up", source="vllm") == 0
    state = sidecar.poller.snapshot.source("vllm")
    assert state is not None
    assert state.error_kind == KINDS[fault]


@pytest.mark.parametrize("fault", KINDS)
async def test_fault_is_one_structured_event_for_two_polls(
    make_sidecar: MakeSidecar, scripted: ScriptedVllm, fault: str
) -> None:
    sidecar = await faulted(make_sidecar, scripted, fault)
    (event,) = sidecar.named("source_down", source="vllm")
    assert event["kind"] == KINDS[fault]
    assert "\n" not in event["error"]
    assert not any("exc_info" in e or "exception" in e for e in sidecar.events)
    assert not sidecar.named("poll_failed")


@pytest.mark.parametrize("fault", KINDS)
async def test_fault_keeps_capacity_and_withholds_load(
    make_sidecar: MakeSidecar, scripted: ScriptedVllm, fault: str
) -> None:
    sidecar = await faulted(make_sidecar, scripted, fault)
    text = await sidecar.scrape()
    assert value(text, "kv_headroom_kv_capacity_blocks", source="observed") == 48
    assert value(text, "kv_headroom_kv_usage_ratio") is None
    assert value(text, "kv_headroom_requests_running") is None


@pytest.mark.parametrize("fault", KINDS)
async def test_fault_recovers_on_the_next_good_poll(
    make_sidecar: MakeSidecar, scripted: ScriptedVllm, fault: str
) -> None:
    sidecar = await faulted(make_sidecar, scripted, fault)
    await scripted.set_fault(None)
    sidecar.forget_events()
    await sidecar.poll()
    text = await sidecar.scrape()
    assert value(text, "kv_headroom_source_up", source="vllm") == 1
    assert value(text, "kv_headroom_requests_running") == 0
    assert len(sidecar.named("source_up", source="vllm")) == 1
