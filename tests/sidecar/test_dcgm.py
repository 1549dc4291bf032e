"""The DCGM source on a real dcgm-exporter page served from 127.0.0.1: it fills the GPU
memory chain where NVML is absent, picks the pod's GPU, and is down (never the scrape)
when the exporter is unreachable or lists no GPU of this pod."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from exporter.config import load_config
from exporter.poller import PollerDeps
from exporter.serve_cli import SERVE_FLAGS
from exporter.sources.dcgm import URL, parse_gpus
from tests.exposition import families_by_name
from tests.sidecar.conftest import FakeVllm, MakeRig, Rig, unused_port

PAGE = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm" / "upcloud-uks-l40s.txt"
L40S = "GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc43"  # the page's one GPU
MIB = 1 << 20


@pytest.fixture(name="dcgm_url")
async def _dcgm_url() -> AsyncIterator[str]:
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=PAGE.read_text(), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield str(server.make_url("")).rstrip("/")
    await server.close()


async def dcgm_rig(make_rig: MakeRig, vllm: str, dcgm: str, **env: str) -> Rig:
    settings: dict[str, Any] = {"dcgm.enabled": True, "dcgm.url": dcgm}
    # No NVML (deps carry no reader): the pod has none. env: the sidecar's environment.
    rig: Rig = await make_rig(vllm, deps=PollerDeps(env=env), settings=settings)
    await rig.poll()
    return rig


def values(text: str, name: str) -> dict[str, float]:
    return {
        next(iter(labels.values()), ""): v for labels, v in families_by_name(text).get(name, [])
    }


def test_the_page_becomes_the_gpu_nvml_would_report() -> None:
    (gpu,) = parse_gpus(PAGE.read_text()).values()
    assert (gpu.index, gpu.uuid, gpu.name) == (0, L40S, "NVIDIA L40S")
    assert gpu.total_bytes == (45459 + 0 + 608) * MIB  # free + used + reserved
    assert gpu.reserved_bytes == 608 * MIB
    assert gpu.cuda_total_bytes == 45459 * MIB


async def test_dcgm_fills_the_gpu_memory_chain_where_nvml_is_absent(
    fake_vllm: FakeVllm, make_rig: MakeRig, dcgm_url: str
) -> None:
    rig = await dcgm_rig(make_rig, fake_vllm.url, dcgm_url, NVIDIA_VISIBLE_DEVICES=L40S)
    text = rig.text
    assert values(text, "kv_headroom_source_up")["dcgm"] == 1.0
    assert "nvml" not in values(text, "kv_headroom_source_up")
    # NVML's total (reserve included), as the NVML source exports it
    assert values(text, "kv_headroom_gpu_memory_total_bytes") == {"0": (45459 + 608) * MIB}
    snapshot = rig.poller.snapshot
    assert snapshot.expected is not None  # the plan now has a GPU to size from
    assert snapshot.expected.request.gpu.total_bytes == 45459 * MIB


async def test_the_pages_only_gpu_is_taken_when_nothing_names_one(
    fake_vllm: FakeVllm, make_rig: MakeRig, dcgm_url: str
) -> None:
    rig = await dcgm_rig(make_rig, fake_vllm.url, dcgm_url)
    assert values(rig.text, "kv_headroom_source_up")["dcgm"] == 1.0
    assert [g.uuid for g in rig.poller.snapshot.gpus] == [L40S]


async def test_a_page_without_the_pods_gpu_is_dcgm_down_and_the_scrape_is_served(
    fake_vllm: FakeVllm, make_rig: MakeRig, dcgm_url: str
) -> None:
    other = "GPU-00000000-0000-0000-0000-000000000000"
    rig = await dcgm_rig(make_rig, fake_vllm.url, dcgm_url, NVIDIA_VISIBLE_DEVICES=other)
    up = values(rig.text, "kv_headroom_source_up")
    assert (up["dcgm"], up["vllm"]) == (0.0, 1.0)
    state = rig.poller.snapshot.source("dcgm")
    assert state is not None
    assert state.error_kind == "unknown_device"
    assert rig.poller.snapshot.gpus == ()


async def test_an_unreachable_dcgm_exporter_is_dcgm_down_and_the_scrape_is_served(
    fake_vllm: FakeVllm, make_rig: MakeRig
) -> None:
    rig = await dcgm_rig(make_rig, fake_vllm.url, f"http://127.0.0.1:{unused_port()}")
    up = values(rig.text, "kv_headroom_source_up")
    assert (up["dcgm"], up["vllm"]) == (0.0, 1.0)
    state = rig.poller.snapshot.source("dcgm")
    assert state is not None
    assert state.error_kind == "unreachable"


def test_dcgm_is_set_by_variables_like_every_key() -> None:
    env = {"KV_HEADROOM_DCGM_ENABLED": "true", "KV_HEADROOM_DCGM_URL": "http://10.0.0.7:9400"}
    config = load_config({}, env)
    assert config.value("dcgm.enabled") is True
    assert config.get(URL) == "http://10.0.0.7:9400"


def test_dcgm_is_off_unless_enabled() -> None:
    assert load_config({}, {}).value("dcgm.enabled") is False


def test_serve_takes_the_dcgm_switch_and_url_as_flags() -> None:
    assert SERVE_FLAGS[-2:] == ("dcgm.enabled", "dcgm.url")
