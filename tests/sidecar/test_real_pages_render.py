"""The sidecar's own /metrics for the real pages of ``tests/fixtures/vllm/real/``: lint-clean
under ``promtool check metrics``, and the observed capacity is what the page says."""

from __future__ import annotations

import pytest
import structlog

from tests.exposition import families_by_name
from tests.sidecar.conftest import FakeVllm, MakeRig
from tests.sidecar.test_golden import check_metrics
from tests.sources.test_real_pages import READABLE, served

# What /v1/models would say (model, /version, max_model_len); "" and None where the source
# does not tell (the sidecar then runs without them).
SERVERS: dict[str, tuple[str, str, int | None]] = {
    "datadog-v0-0.5-opt125m.txt": ("facebook/opt-125m", "", 2048),
    "lmswitch-v1-deepseek-v4-specdecode.txt": ("deepseek-v4-flash-vision-exp-ablit-dual", "", None),
    "datadog-nvidia-nim-llama3.1-8b.txt": ("meta/llama-3.1-8b-instruct", "", None),
    "datadog-ray-serve-vllm-excerpt.txt": ("neuralmagic/Meta-Llama-3.1-70B-Instruct-FP8", "", None),
}
# kv_headroom_kv_capacity_tokens{source="observed"}: vLLM's kv_cache_size_tokens label where
# the page has one, else num_gpu_blocks x block_size (7281 x 16); none without
# cache_config_info (NIM's and the Ray excerpt's pages).
CAPACITY_TOKENS: dict[str, float | None] = {
    "datadog-v0-0.5-opt125m.txt": 116_496.0,
    "lmswitch-v1-deepseek-v4-specdecode.txt": 1_428_520.0,
    "datadog-nvidia-nim-llama3.1-8b.txt": None,
    "datadog-ray-serve-vllm-excerpt.txt": None,
}


async def exported(fake: FakeVllm, make_rig: MakeRig, name: str) -> str:
    fake.page = served(name).decode()
    fake.model, fake.version, fake.max_model_len = SERVERS[name]
    rig = await make_rig(fake.url, model_path=None)
    await rig.poll(2)
    text: str = rig.text
    return text


def test_every_readable_page_has_a_server() -> None:
    assert SERVERS.keys() == READABLE.keys() == CAPACITY_TOKENS.keys()


@pytest.mark.parametrize("name", sorted(SERVERS))
async def test_promtool_accepts_the_output_for_a_real_page(
    fake_vllm: FakeVllm, make_rig: MakeRig, name: str
) -> None:
    status, report = await check_metrics(await exported(fake_vllm, make_rig, name))
    assert status == 0, report
    assert report.strip() == "", report


@pytest.mark.parametrize("name", sorted(SERVERS))
async def test_observed_capacity_of_a_real_page(
    fake_vllm: FakeVllm, make_rig: MakeRig, name: str
) -> None:
    families = families_by_name(await exported(fake_vllm, make_rig, name))
    tokens = families.get("kv_headroom_kv_capacity_tokens", [])
    observed = [v for labels, v in tokens if labels["source"] == "observed"]
    expected = CAPACITY_TOKENS[name]
    assert observed == ([] if expected is None else [expected])


async def test_a_page_in_another_servers_names_is_said_once(
    fake_vllm: FakeVllm, make_rig: MakeRig
) -> None:
    with structlog.testing.capture_logs() as logs:
        await exported(fake_vllm, make_rig, "datadog-nvidia-nim-llama3.1-8b.txt")
    said = [e["dialect"] for e in logs if e["event"] == "vllm_page_dialect"]
    assert said == ["nim"]
