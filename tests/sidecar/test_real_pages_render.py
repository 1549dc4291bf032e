"""The sidecar's own /metrics for the real pages of ``tests/fixtures/vllm/real/``: lint-clean
under ``promtool check metrics``, and the observed capacity is what the page says."""

from __future__ import annotations

import pytest

from exporter.metrics import families_by_name
from tests.sidecar.conftest import FakeVllm, MakeRig
from tests.sidecar.test_golden import check_metrics
from tests.sources.test_real_pages import READABLE, served

# What /v1/models would say (model, /version, max_model_len); "" and None where the source
# does not tell (the sidecar then runs without them).
SERVERS: dict[str, tuple[str, str, int | None]] = {
    "datadog-v0-0.5-opt125m.txt": ("facebook/opt-125m", "", 2048),
    "lmswitch-v1-deepseek-v4-specdecode.txt": ("deepseek-v4-flash-vision-exp-ablit-dual", "", None),
}
# kv_headroom_kv_capacity_tokens{source="observed"}: vLLM's kv_cache_size_tokens label where
# the page has one, else num_gpu_blocks x block_size (7281 x 16).
CAPACITY_TOKENS = {
    "datadog-v0-0.5-opt125m.txt": 116_496.0,
    "lmswitch-v1-deepseek-v4-specdecode.txt": 1_428_520.0,
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
    tokens = families["kv_headroom_kv_capacity_tokens"]
    assert [v for labels, v in tokens if labels["source"] == "observed"] == [CAPACITY_TOKENS[name]]
