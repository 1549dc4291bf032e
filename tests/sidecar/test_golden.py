"""The sidecar's /metrics for every real vLLM page, against committed golden files.

Volatile series (poll time, build info, timestamps) are stripped; ``UPDATE_GOLDEN=1``
rewrites the files after a deliberate change. ``promtool check metrics`` lints each.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from asyncio.subprocess import PIPE

import pytest
from prometheus_client.exposition import generate_latest

from exporter.metrics import render
from tests.exposition import ClientFamilies, families_by_name
from tests.sidecar.conftest import TINYLLAMA, FakeVllm, MakeRig, fixture_page, golden_path
from tests.sources.test_vllm_page import PAGES

VOLATILE = re.compile(
    r"^kv_headroom_(poll_duration_seconds|build_info|source_last_success_timestamp_seconds"
    r"|source_poll_duration_seconds)\b"
)


def stable(text: str) -> str:
    return "".join(line + "\n" for line in text.splitlines() if not VOLATILE.match(line))


def model_for(page: str) -> str | None:
    return TINYLLAMA if page.startswith("vllm-0.32") else None


# What /v1/models and /version said on the servers these pages came from.
SERVERS = {
    "vllm-0.32-cpu-idle.txt": ("tinyllama", "0.32.0", 2048),
    "vllm-0.32-cpu-preempted.txt": ("tinyllama", "0.32.0", 2048),
    "vllm-v0-aibrix-partial.txt": ("Qwen/Qwen2.5-Coder-1.5B-Instruct", "0.7.0", 32768),
    "vllm-v1-metal-2026.txt": ("Qwen/Qwen2.5-0.5B-Instruct", "0.26.0", 32768),
}


async def exported(fake: FakeVllm, make_rig: MakeRig, page: str, edited: str | None = None) -> str:
    """/metrics after two polls of ``page`` (``edited``: that page as a test changed it)."""
    fake.page = fixture_page(page) if edited is None else edited
    fake.model, fake.version, fake.max_model_len = SERVERS[page]
    rig = await make_rig(fake.url, model_path=model_for(page))
    await rig.poll(2)
    text: str = rig.text
    return text


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is missing: install Debian's prometheus package (.ci/run does)"
    return path


async def check_metrics(text: str) -> tuple[int | None, str]:
    """``promtool check metrics`` on an exposition: its exit status and what it said."""
    proc = await asyncio.create_subprocess_exec(
        promtool(), "check", "metrics", stdin=PIPE, stdout=PIPE, stderr=PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(text.encode()), timeout=30)
    return proc.returncode, (out + err).decode()


@pytest.mark.parametrize("page", PAGES)
async def test_metrics_match_the_golden_file(
    fake_vllm: FakeVllm, make_rig: MakeRig, page: str
) -> None:
    text = stable(await exported(fake_vllm, make_rig, page))
    golden = golden_path(page)
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(text)
    assert text == golden.read_text()


@pytest.mark.parametrize("page", PAGES)
async def test_promtool_accepts_the_output(
    fake_vllm: FakeVllm, make_rig: MakeRig, page: str
) -> None:
    status, report = await check_metrics(await exported(fake_vllm, make_rig, page))
    assert status == 0, report
    assert report.strip() == "", report  # not even a lint warning


@pytest.mark.parametrize("page", PAGES)
async def test_capacity_blocks_equal_vllms_num_gpu_blocks(
    fake_vllm: FakeVllm, make_rig: MakeRig, page: str
) -> None:
    text = await exported(fake_vllm, make_rig, page)
    cc = re.search(r'vllm:cache_config_info\{[^}]*num_gpu_blocks="(\d+)"', fixture_page(page))
    assert cc is not None
    blocks = families_by_name(text)["kv_headroom_kv_capacity_blocks"]
    observed = [v for labels, v in blocks if labels["source"] == "observed"]
    assert observed == [float(cc.group(1))]


@pytest.mark.parametrize("page", PAGES)
async def test_observed_tokens_equal_what_vllm_counts(
    fake_vllm: FakeVllm, make_rig: MakeRig, page: str
) -> None:
    text = await exported(fake_vllm, make_rig, page)
    source = fixture_page(page)
    labelled = re.search(r'kv_cache_size_tokens="(\d+)"', source)
    blocks = int(re.search(r'num_gpu_blocks="(\d+)"', source).group(1))  # type: ignore[union-attr]
    block_size = int(re.search(r'block_size="(\d+)"', source).group(1))  # type: ignore[union-attr]
    # Where the release labels it (0.24+), vLLM's own figure; else what it prints for full
    # attention (these pages are full-attention models): blocks × block size.
    expected = int(labelled.group(1)) if labelled else blocks * block_size
    tokens = families_by_name(text)["kv_headroom_kv_capacity_tokens"]
    observed = [v for labels, v in tokens if labels["source"] == "observed"]
    assert observed == [float(expected)]


async def test_expected_capacity_from_config_equals_the_observed_one(
    fake_vllm: FakeVllm, make_rig: MakeRig
) -> None:
    text = await exported(fake_vllm, make_rig, "vllm-0.32-cpu-idle.txt")
    tokens = {
        labels["source"]: v
        for labels, v in families_by_name(text)["kv_headroom_kv_capacity_tokens"]
    }
    assert tokens["expected"] == tokens["observed"] == 1_048_576


@pytest.mark.parametrize("page", PAGES)
async def test_rendering_is_byte_identical_to_prometheus_client(
    fake_vllm: FakeVllm, make_rig: MakeRig, page: str
) -> None:
    fake_vllm.page = fixture_page(page)
    fake_vllm.model, fake_vllm.version, fake_vllm.max_model_len = SERVERS[page]
    rig = await make_rig(fake_vllm.url, model_path=model_for(page))
    await rig.poll(2)
    snapshot = rig.poller.snapshot
    assert render(snapshot) == generate_latest(ClientFamilies(snapshot))
