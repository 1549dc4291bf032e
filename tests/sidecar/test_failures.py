"""A failing vLLM never fails a scrape: the source shows as down, once in the log, and
comes back by itself on the next good poll."""

from __future__ import annotations

import asyncio

import structlog
from aiohttp.test_utils import TestClient, TestServer

from exporter.config import Config
from exporter.server import create_app
from exporter.snapshot import RISK_HOLD_SECONDS
from tests.exposition import families_by_name
from tests.sidecar.conftest import FakeVllm, MakeRig, fixture_page, unused_port
from tests.sources.test_real_pages import served, without_series


def value(text: str, name: str, **labels: str) -> float | None:
    for found, v in families_by_name(text).get(name, []):
        if all(found.get(k) == want for k, want in labels.items()):
            return v
    return None


def vllm_up(text: str) -> float | None:
    return value(text, "kv_headroom_source_up", source="vllm")


async def test_vllm_absent_at_start_shows_down_then_recovers(
    fake_vllm: FakeVllm, make_rig: MakeRig
) -> None:
    rig = await make_rig(f"http://127.0.0.1:{unused_port()}")
    await rig.poll()
    assert vllm_up(rig.text) == 0
    assert rig.poller.snapshot.source("vllm").error_kind == "refused"
    assert not rig.poller.snapshot.vllm_ready
    rig.poller._client._base = fake_vllm.url  # vLLM comes up where it was expected
    await rig.poll()
    assert vllm_up(rig.text) == 1
    assert rig.poller.snapshot.vllm_ready


async def test_slow_vllm_beyond_the_timeout_is_down_for_that_poll(
    fake_vllm: FakeVllm, make_rig: MakeRig
) -> None:
    rig = await make_rig(fake_vllm.url)
    fake_vllm.mode, fake_vllm.delay = "delay", 2.0
    await rig.poll()
    assert vllm_up(rig.text) == 0
    assert rig.poller.snapshot.source("vllm").error_kind == "timeout"
    fake_vllm.mode = "ok"
    await rig.poll()
    assert vllm_up(rig.text) == 1


async def test_garbage_page_is_down(fake_vllm: FakeVllm, make_rig: MakeRig) -> None:
    rig = await make_rig(fake_vllm.url)
    fake_vllm.mode = "garbage"
    await rig.poll()
    assert rig.poller.snapshot.source("vllm").error_kind == "no_vllm_metrics"


async def test_truncated_page_is_down_and_recovers(fake_vllm: FakeVllm, make_rig: MakeRig) -> None:
    rig = await make_rig(fake_vllm.url)
    full = fake_vllm.page
    fake_vllm.page = full[: full.index("vllm:kv_cache_usage_perc") + 30]
    await rig.poll()
    assert rig.poller.snapshot.source("vllm").error_kind == "incomplete"
    fake_vllm.page = full
    await rig.poll()
    assert vllm_up(rig.text) == 1


def without_cache_config(page: str, replacement: str = "") -> str:
    return "".join(
        replacement if line.startswith("vllm:cache_config_info") else line
        for line in page.splitlines(keepends=True)
    )


async def test_empty_cache_config_info_keeps_vllm_up_and_names_it_missing(
    fake_vllm: FakeVllm, make_rig: MakeRig
) -> None:
    rig = await make_rig(fake_vllm.url)
    fake_vllm.page = without_cache_config(
        fake_vllm.page, 'vllm:cache_config_info{engine="0"} 1.0\n'
    )
    await rig.poll()
    state = rig.poller.snapshot.source("vllm")
    assert state is not None
    assert state.up
    assert state.missing == ("cache_config_info",)


async def test_a_page_without_cache_config_info_is_used_for_what_it_has(
    fake_vllm: FakeVllm, make_rig: MakeRig
) -> None:
    rig = await make_rig(fake_vllm.url)
    fake_vllm.page = without_cache_config(fake_vllm.page)
    await rig.poll()
    assert vllm_up(rig.text) == 1
    assert value(rig.text, "kv_headroom_kv_usage_ratio") is not None
    assert value(rig.text, "kv_headroom_kv_capacity_blocks", source="observed") is None
    missing = families_by_name(rig.text)["kv_headroom_source_missing_info"]
    assert missing == [({"source": "vllm", "what": "cache_config_info"}, 1.0)]


async def test_an_old_page_without_running_requests_keeps_vllm_up_and_says_what_it_lacks(
    fake_vllm: FakeVllm, make_rig: MakeRig
) -> None:
    page = served("datadog-v0-0.5-opt125m.txt").decode()
    fake_vllm.page = without_series(page, "vllm:num_requests_running")
    rig = await make_rig(fake_vllm.url, model_path=None)
    await rig.poll()
    assert vllm_up(rig.text) == 1
    assert value(rig.text, "kv_headroom_kv_usage_ratio") == 0
    missing = families_by_name(rig.text)["kv_headroom_source_missing_info"]
    assert missing == [({"source": "vllm", "what": "num_requests_running"}, 1.0)]


async def test_a_missing_cache_config_info_is_logged_once_and_its_return_once(
    fake_vllm: FakeVllm, make_rig: MakeRig
) -> None:
    rig = await make_rig(fake_vllm.url)
    full = fake_vllm.page
    fake_vllm.page = without_cache_config(full)
    with structlog.testing.capture_logs() as logs:
        await rig.poll(3)
        fake_vllm.page = full
        await rig.poll(2)
    events = [e["event"] for e in logs]
    assert events.count("vllm_page_missing") == 1
    assert events.count("vllm_page_complete") == 1
    assert "kv_headroom_source_missing_info" not in families_by_name(rig.text)


async def test_http_error_is_down(fake_vllm: FakeVllm, make_rig: MakeRig) -> None:
    rig = await make_rig(fake_vllm.url)
    fake_vllm.mode = "status500"
    await rig.poll()
    assert rig.poller.snapshot.source("vllm").error_kind == "http_status"


async def test_capacity_stays_while_vllm_is_down_but_load_is_withheld(
    fake_vllm: FakeVllm, make_rig: MakeRig
) -> None:
    rig = await make_rig(fake_vllm.url)
    await rig.poll()
    fake_vllm.mode = "status500"
    await rig.poll()
    assert value(rig.text, "kv_headroom_kv_capacity_blocks", source="observed") == 48
    assert value(rig.text, "kv_headroom_kv_usage_ratio") is None
    assert value(rig.text, "kv_headroom_requests_running") is None


async def test_the_risk_and_its_gates_stand_through_a_poll_vllm_was_too_busy_to_answer(
    fake_vllm: FakeVllm, make_rig: MakeRig
) -> None:
    rig = await make_rig(fake_vllm.url)
    await rig.poll(times=3)
    before = rig.text
    assert value(before, "kv_headroom_preemption_risk") is not None
    fake_vllm.mode, fake_vllm.delay = "delay", 2.0  # beyond the rig's 0.5 s timeout
    await rig.poll(times=2)  # 4 s after the last answer
    assert vllm_up(rig.text) == 0
    assert value(rig.text, "kv_headroom_kv_usage_ratio") is None
    for name in (
        "kv_headroom_preemption_risk",
        "kv_headroom_kv_usage_max_30s_ratio",
        "kv_headroom_kv_usage_max_1m_ratio",
    ):
        assert value(rig.text, name) == value(before, name), name


async def test_the_risk_is_withheld_once_vllm_has_not_answered_for_the_hold(
    fake_vllm: FakeVllm, make_rig: MakeRig
) -> None:
    rig = await make_rig(fake_vllm.url)
    await rig.poll(times=3)
    fake_vllm.mode = "status500"
    await rig.poll(times=int(RISK_HOLD_SECONDS / 2.0) + 1)  # polls 2 s apart
    assert value(rig.text, "kv_headroom_preemption_risk") is None
    assert value(rig.text, "kv_headroom_kv_usage_max_30s_ratio") is None


async def test_restart_with_lower_counters_never_lowers_preemptions(
    fake_vllm: FakeVllm, make_rig: MakeRig
) -> None:
    rig = await make_rig(fake_vllm.url)
    await rig.poll()
    fake_vllm.page = fake_vllm.page.replace(
        'vllm:num_preemptions_total{engine="0",model_name="tinyllama"} 29.0',
        'vllm:num_preemptions_total{engine="0",model_name="tinyllama"} 35.0',
    )
    await rig.poll()
    assert value(rig.text, "kv_headroom_preemptions_total") == 6
    fake_vllm.mode = "status500"  # killed
    await rig.poll()
    fake_vllm.mode = "ok"  # restarted: counters from zero
    fake_vllm.page = fixture_page("vllm-0.32-cpu-idle.txt").replace(
        'vllm:num_preemptions_total{engine="0",model_name="tinyllama"} 0.0',
        'vllm:num_preemptions_total{engine="0",model_name="tinyllama"} 2.0',
    )
    with structlog.testing.capture_logs() as logs:
        await rig.poll()
    assert value(rig.text, "kv_headroom_preemptions_total") == 8
    assert [e["event"] for e in logs].count("vllm_restarted") >= 1


async def test_a_restart_begins_a_new_epoch_of_the_risk_models_history(
    fake_vllm: FakeVllm, make_rig: MakeRig
) -> None:
    rig = await make_rig(fake_vllm.url)
    await rig.poll(times=20)
    fake_vllm.page = fake_vllm.page.replace(
        'vllm:num_preemptions_total{engine="0",model_name="tinyllama"} 29.0',
        'vllm:num_preemptions_total{engine="0",model_name="tinyllama"} 0.0',
    )  # restarted: counters from zero
    await rig.poll()
    # The model only looks at the latest epoch: trends never span the restart.
    assert rig.poller.history.latest is not None
    assert rig.poller.history.latest.epoch == 1


async def test_a_failure_is_logged_once_not_every_poll(
    fake_vllm: FakeVllm, make_rig: MakeRig
) -> None:
    rig = await make_rig(fake_vllm.url)
    await rig.poll()
    fake_vllm.mode = "status500"
    with structlog.testing.capture_logs() as logs:
        await rig.poll(3)
        fake_vllm.mode = "ok"
        await rig.poll(2)
    events = [e["event"] for e in logs if e.get("source") == "vllm"]
    assert events == ["source_down", "source_up"]


async def test_metrics_answer_200_while_vllm_is_absent() -> None:
    config = Config(
        vllm_url=f"http://127.0.0.1:{unused_port()}",
        vllm_timeout_seconds=0.2,
        poll_interval_seconds=0.3,
        nvml_enabled=False,
    )
    async with TestClient(TestServer(create_app(config), host="127.0.0.1")) as client:
        for _ in range(50):  # bounded: until the first poll has happened
            if client.app is not None and "source_up" in (
                await (await client.get("/metrics")).text()
            ):
                break
            await asyncio.sleep(0.05)
        resp = await client.get("/metrics")
        assert resp.status == 200
        assert vllm_up(await resp.text()) == 0
        assert (await client.get("/readyz")).status == 503
        assert (await client.get("/healthz")).status == 200
