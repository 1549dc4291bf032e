"""The sidecar carries a bounded amount of whatever vLLM and NVML send: reads capped in
size and time, and a cap on engines, GPUs, cache_config labels and label value length,
each reported (``kv_headroom_cardinality_limited`` and one ``limit_reached`` event)."""

from __future__ import annotations

import asyncio

import pytest

from exporter.labels import MAX_CACHE_CONFIG_LABELS, MAX_ENGINES, MAX_LABEL_VALUE_LENGTH
from exporter.poller import PollerDeps
from exporter.sources.nvml import NvmlReader
from exporter.sources.vllm import CARD
from tests.faults.conftest import MakeSidecar, check_exposition, value
from tests.scripted_vllm import JSON_FAULTS, ScriptedVllm
from tests.sidecar.conftest import fixture_page
from tests.sources.test_nvml import FakeGpu, FakeNvml

PREEMPTED = fixture_page("vllm-0.32-cpu-preempted.txt")


def with_engines(n: int) -> str:
    out = []
    for line in PREEMPTED.splitlines():
        out.append(line)
        if line.startswith("vllm:") and 'engine="0"' in line:
            out.extend(line.replace('engine="0"', f'engine="{i}"') for i in range(1, n))
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("fault", JSON_FAULTS)
async def test_a_failing_models_or_version_answer_costs_nothing_but_the_card(
    make_sidecar: MakeSidecar, scripted: ScriptedVllm, fault: str
) -> None:
    scripted.json_fault = fault
    sidecar = await make_sidecar(scripted.url)
    await asyncio.wait_for(sidecar.poll(2), timeout=30)  # bounded by the read timeout
    text = await sidecar.scrape()
    assert value(text, "kv_headroom_source_up", source="vllm") == 1
    assert sidecar.poller.readings.get(CARD) is None
    assert not sidecar.named("poll_failed")


async def test_engines_beyond_the_limit_are_left_out_and_counted(
    make_sidecar: MakeSidecar, scripted: ScriptedVllm
) -> None:
    scripted.page = lambda: with_engines(MAX_ENGINES + 6)
    sidecar = await make_sidecar(scripted.url)
    await sidecar.poll(2)
    families = check_exposition(await sidecar.scrape())
    engines = {labels["engine"] for labels, _ in families["kv_headroom_requests_running"]}
    assert len(engines) == MAX_ENGINES
    limits = families["kv_headroom_cardinality_limited"]
    limited = {labels["limit"]: v for labels, v in limits}
    assert limited["engines"] > 0
    assert limited["gpus"] == 0


async def test_a_limit_reached_is_one_event_until_it_clears(
    make_sidecar: MakeSidecar, scripted: ScriptedVllm
) -> None:
    scripted.page = lambda: with_engines(MAX_ENGINES + 6)
    sidecar = await make_sidecar(scripted.url)
    # A limit bites when an exposition leaves something out: each poll is scraped.
    for _ in range(3):
        await sidecar.poll(1)
        await sidecar.scrape()
    scripted.page = lambda: PREEMPTED
    for _ in range(2):
        await sidecar.poll(1)
        await sidecar.scrape()
    assert [e["event"] for e in sidecar.events if e["event"].startswith("limit_")] == [
        "limit_reached",
        "limit_cleared",
    ]
    assert sidecar.named("limit_reached")[0]["limit"] == "engines"


async def test_long_label_values_are_cut_and_counted(
    make_sidecar: MakeSidecar, scripted: ScriptedVllm
) -> None:
    long_name = "m" * 10_000
    scripted.page = lambda: PREEMPTED.replace('model_name="tinyllama"', f'model_name="{long_name}"')
    scripted.card.model = long_name  # a served name vLLM reports on /v1/models too
    sidecar = await make_sidecar(scripted.url, model_path=None)
    await sidecar.poll()
    families = check_exposition(await sidecar.scrape())
    longest = max(len(v) for labels, _ in families["kv_headroom_info"] for v in labels.values())
    assert longest == MAX_LABEL_VALUE_LENGTH
    assert value(await sidecar.scrape(), "kv_headroom_cardinality_limited", limit="label_values")


async def test_cache_config_with_too_many_labels_keeps_the_ones_read(
    make_sidecar: MakeSidecar, scripted: ScriptedVllm
) -> None:
    extra = ",".join(f'junk_{i}="{i}"' for i in range(500))
    scripted.page = lambda: PREEMPTED.replace(
        "vllm:cache_config_info{", "vllm:cache_config_info{" + extra + ","
    )
    sidecar = await make_sidecar(scripted.url)
    await sidecar.poll()
    text = await sidecar.scrape()
    assert value(text, "kv_headroom_kv_capacity_blocks", source="observed") == 48
    # 0.32's 36 labels besides engine, plus the 500
    left_out = 36 + 500 - MAX_CACHE_CONFIG_LABELS
    assert value(text, "kv_headroom_cardinality_limited", limit="cache_config_labels") == left_out


async def test_gpus_beyond_the_limit_are_not_read(
    make_sidecar: MakeSidecar, scripted: ScriptedVllm
) -> None:
    fake = FakeNvml(*(FakeGpu(f"GPU-{i:04d}") for i in range(70)))
    sidecar = await make_sidecar(scripted.url, deps=PollerDeps(nvml=NvmlReader(fake)))
    await sidecar.poll()
    families = check_exposition(await sidecar.scrape())
    assert len(families["kv_headroom_gpu_memory_total_bytes"]) == 64
    assert value(await sidecar.scrape(), "kv_headroom_cardinality_limited", limit="gpus") == 6


async def test_nested_json_does_not_stop_the_poll_loop(
    make_sidecar: MakeSidecar, scripted: ScriptedVllm
) -> None:
    scripted.json_fault = "nested"
    sidecar = await make_sidecar(scripted.url)
    stop = asyncio.Event()
    loop = asyncio.create_task(sidecar.poller.run(stop))
    for _ in range(100):  # bounded: until the loop has polled twice
        if sidecar.poller.polls >= 2:
            break
        await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(loop, timeout=10)
    assert sidecar.poller.polls >= 2
