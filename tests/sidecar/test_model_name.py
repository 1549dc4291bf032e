"""The sidecar's ``model`` label is the name vLLM serves, so it joins vLLM's ``model_name``."""

from __future__ import annotations

from tests.exposition import families_by_name
from tests.sidecar.conftest import TINYLLAMA, FakeVllm, MakeRig


def info_model(text: str) -> str:
    [(labels, _)] = families_by_name(text)["kv_headroom_info"]
    return labels["model"]


async def test_model_label_is_the_served_model_name(fake_vllm: FakeVllm, make_rig: MakeRig) -> None:
    # vllm serve /models/tinyllama --served-model-name chat-small
    fake_vllm.model, fake_vllm.root = "chat-small", "/models/tinyllama"
    fake_vllm.page = fake_vllm.page.replace('model_name="tinyllama"', 'model_name="chat-small"')
    rig = await make_rig(fake_vllm.url, model_path=TINYLLAMA)
    await rig.poll(2)
    assert info_model(rig.text) == "chat-small"


async def test_model_label_falls_back_to_the_pages_model_name(
    fake_vllm: FakeVllm, make_rig: MakeRig
) -> None:
    fake_vllm.models_status = 404  # a /metrics-only server, or a proxy in front of vLLM
    fake_vllm.page = fake_vllm.page.replace('model_name="tinyllama"', 'model_name="chat-small"')
    rig = await make_rig(fake_vllm.url, model_path=TINYLLAMA)
    await rig.poll(2)
    assert info_model(rig.text) == "chat-small"
