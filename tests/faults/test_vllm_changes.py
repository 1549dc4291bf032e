"""A vLLM whose answers are valid but change under the sidecar: duplicates, relabelled
cache_config_info, counters that go backwards, restarts with another model or cache size,
and label values written to break a status page or an exposition."""

from __future__ import annotations

from tests.faults.conftest import MakeSidecar, value
from tests.scripted_vllm import PAGE_FAULTS, ScriptedVllm
from tests.sidecar.conftest import fixture_page

PREEMPTED = fixture_page("vllm-0.32-cpu-preempted.txt")


async def test_duplicate_series_keep_vllm_up_and_warn_once(
    make_sidecar: MakeSidecar, scripted: ScriptedVllm
) -> None:
    sidecar = await make_sidecar(scripted.url)
    await scripted.set_fault("duplicate")
    await sidecar.poll(3)
    text = await sidecar.scrape()
    assert value(text, "kv_headroom_source_up", source="vllm") == 1
    (event,) = sidecar.named("vllm_page_problems")
    assert "duplicate series vllm:num_requests_running" in event["first"]


async def test_a_clean_page_after_duplicates_is_said_once(
    make_sidecar: MakeSidecar, scripted: ScriptedVllm
) -> None:
    sidecar = await make_sidecar(scripted.url)
    await scripted.set_fault("duplicate")
    await sidecar.poll(2)
    await scripted.set_fault(None)
    await sidecar.poll(2)
    assert len(sidecar.named("vllm_page_clean")) == 1


async def test_relabelled_cache_config_updates_capacity_and_says_what_changed(
    make_sidecar: MakeSidecar, scripted: ScriptedVllm
) -> None:
    sidecar = await make_sidecar(scripted.url)
    await sidecar.poll()
    await scripted.set_fault("relabel")
    await sidecar.poll(2)
    text = await sidecar.scrape()
    assert value(text, "kv_headroom_kv_capacity_blocks", source="observed") == 96
    (event,) = sidecar.named("cache_config_changed")
    assert event["changed"] == {"num_gpu_blocks": "48 → 96"}


async def test_relabelled_cache_config_starts_a_new_history_epoch(
    make_sidecar: MakeSidecar, scripted: ScriptedVllm
) -> None:
    sidecar = await make_sidecar(scripted.url)
    await sidecar.poll()
    await scripted.set_fault("relabel")
    await sidecar.poll()
    latest = sidecar.poller.history.latest
    assert latest is not None
    assert latest.epoch == 1


async def test_counters_going_backwards_is_one_restart_event(
    make_sidecar: MakeSidecar, scripted: ScriptedVllm
) -> None:
    sidecar = await make_sidecar(scripted.url)
    await sidecar.poll()
    await scripted.set_fault("restart")  # counters from zero and a new start time
    await sidecar.poll(2)
    assert len(sidecar.named("vllm_restarted")) == 1


async def test_preemptions_total_never_decreases_across_a_restart(
    make_sidecar: MakeSidecar, scripted: ScriptedVllm
) -> None:
    sidecar = await make_sidecar(scripted.url)
    await sidecar.poll()
    scripted.page = lambda: PREEMPTED.replace(
        'vllm:num_preemptions_total{engine="0",model_name="tinyllama"} 29.0',
        'vllm:num_preemptions_total{engine="0",model_name="tinyllama"} 31.0',
    )
    await sidecar.poll()
    seen = [value(await sidecar.scrape(), "kv_headroom_preemptions_total")]
    await scripted.set_fault("restart")
    await sidecar.poll()
    seen.append(value(await sidecar.scrape(), "kv_headroom_preemptions_total"))
    await scripted.set_fault(None)  # 31 again: counted as 31 new since the restart
    await sidecar.poll()
    seen.append(value(await sidecar.scrape(), "kv_headroom_preemptions_total"))
    assert seen == [2, 2, 33]


async def test_restart_with_another_model_and_cache_size_is_picked_up(
    make_sidecar: MakeSidecar, scripted: ScriptedVllm
) -> None:
    sidecar = await make_sidecar(scripted.url, model_path=None)
    await sidecar.poll()
    restarted = PAGE_FAULTS["restart"](PAGE_FAULTS["relabel"](PREEMPTED).decode()).decode()
    scripted.page = lambda: restarted.replace('model_name="tinyllama"', 'model_name="qwen-mini"')
    scripted.card.model = "qwen-mini"
    scripted.card.max_model_len = 4096
    await sidecar.poll()
    text = await sidecar.scrape()
    assert value(text, "kv_headroom_kv_capacity_blocks", source="observed") == 96
    assert value(text, "kv_headroom_info", model="qwen-mini") == 1
    assert value(text, "kv_headroom_deployment_flag_info", flag="max_model_len", value="4096")
    assert len(sidecar.named("vllm_restarted")) == 1


async def test_html_and_quotes_in_labels_keep_the_exposition_valid(
    make_sidecar: MakeSidecar, scripted: ScriptedVllm
) -> None:
    sidecar = await make_sidecar(scripted.url, model_path=None)
    await scripted.set_fault("html_labels")
    scripted.card.model = '<img src=x onerror="alert(1)">'
    await sidecar.poll()
    text = await sidecar.scrape()  # promtool and prometheus_client both accept it
    assert value(text, "kv_headroom_source_up", source="vllm") == 1


async def test_status_page_escapes_html_and_quotes_from_vllm(
    make_sidecar: MakeSidecar, scripted: ScriptedVllm
) -> None:
    sidecar = await make_sidecar(scripted.url, model_path=None)
    await scripted.set_fault("html_labels")
    scripted.card.model = '<img src=x onerror="alert(1)">'
    scripted.card.version = "0.32.0<b>"
    await sidecar.poll()
    resp = await sidecar.client.get("/")
    html = await resp.text()
    assert resp.status == 200
    assert "<script>" not in html
    assert "<img" not in html
    assert "<b>" not in html
    assert "&lt;script&gt;alert(&quot;kv&quot;)&lt;/script&gt;" in html


async def test_status_page_forbids_scripts_by_policy(
    make_sidecar: MakeSidecar, scripted: ScriptedVllm
) -> None:
    sidecar = await make_sidecar(scripted.url)
    await sidecar.poll()
    resp = await sidecar.client.get("/")
    assert "default-src 'none'" in resp.headers["Content-Security-Policy"]
    assert resp.headers["X-Content-Type-Options"] == "nosniff"


async def test_a_start_time_of_zero_is_a_start_time_not_a_restart_every_poll(
    make_sidecar: MakeSidecar, scripted: ScriptedVllm
) -> None:
    # The simulator reports process_start_time_seconds 0; after a restart to another
    # start time and back, that is two restarts, not one on every poll that follows.
    zero = PREEMPTED.replace(
        "process_start_time_seconds 1.79595780256e+09", "process_start_time_seconds 0.0"
    )
    scripted.page = lambda: zero
    sidecar = await make_sidecar(scripted.url)
    await sidecar.poll()
    await scripted.set_fault("restart")
    await sidecar.poll()
    await scripted.set_fault(None)
    await sidecar.poll(5)
    assert len(sidecar.named("vllm_restarted")) == 2
