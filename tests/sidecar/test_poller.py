"""The poll loop as a scheduler: each source guarded and timed on its own, the caller's
dependencies left as given, and a new source added by one class and one registration."""

from __future__ import annotations

import pytest
import structlog

from exporter import poller as poller_module
from exporter.config import Config
from exporter.metrics import render_counted
from exporter.poller import Poller, PollerDeps
from exporter.snapshot import Snapshot
from exporter.sources.base import Outcome, Readings, Source, Stage
from exporter.sources.records import ModelCard
from exporter.sources.vllm import VllmClient
from exporter.sources.vllm_page import VllmPage
from tests.exposition import families_by_name
from tests.sidecar.conftest import FakeVllm, MakeRig


def samples(text: str, name: str) -> dict[str, float]:
    return {labels["source"]: v for labels, v in families_by_name(text).get(name, [])}


class BrokenClient(VllmClient):
    """The real HTTP client with a bug in it: reading the page raises what no source
    error is."""

    async def metrics(self) -> VllmPage:
        raise KeyError("a bug, not a vLLM answer")


async def test_a_source_that_raises_is_that_source_down_not_a_failed_poll(
    fake_vllm: FakeVllm, make_rig: MakeRig
) -> None:
    rig = await make_rig(fake_vllm.url)
    rig.poller._sources[0]._client.__class__ = BrokenClient
    await rig.poll()  # must not raise: the loop, /healthz and the other sources go on
    state = rig.poller.snapshot.source("vllm")
    assert state is not None
    assert (state.up, state.error_kind) == (False, "internal")
    assert "KeyError" in (state.error or "")
    assert rig.poller.alive()
    assert samples(rig.text, "kv_headroom_source_up")["model"] == 1


async def test_each_source_reports_how_long_its_poll_took(
    fake_vllm: FakeVllm, make_rig: MakeRig
) -> None:
    rig = await make_rig(fake_vllm.url)
    fake_vllm.mode, fake_vllm.delay = "delay", 0.2
    await rig.poll()
    durations = samples(rig.text, "kv_headroom_source_poll_duration_seconds")
    assert set(durations) == {"vllm", "model"}
    assert durations["vllm"] >= 0.2 > durations["model"]


async def test_a_bug_while_reading_the_card_after_a_restart_is_not_swallowed(
    fake_vllm: FakeVllm, make_rig: MakeRig
) -> None:
    rig = await make_rig(fake_vllm.url)
    await rig.poll()
    broken = False

    class CardBug(VllmClient):
        async def models(self) -> ModelCard:
            if broken:
                raise TypeError("a bug while reading /v1/models")
            return await super().models()

    rig.poller._sources[0]._client.__class__ = CardBug
    broken = True
    fake_vllm.page = fake_vllm.page.replace(
        "process_start_time_seconds 1.", "process_start_time_seconds 2."
    )
    with structlog.testing.capture_logs() as logs:
        await rig.poll()
    failed = [e for e in logs if e["event"] == "poll_failed"]
    assert failed
    assert "TypeError" in failed[0]["error"]


def test_the_poller_leaves_the_callers_deps_as_given() -> None:
    deps = PollerDeps()
    config = Config(nvml_enabled=True)
    Poller(config, None, deps)  # type: ignore[arg-type]
    assert deps.nvml is None


class Heartbeat:
    """A source as a newcomer would add one: a class, and a line in ``_make_sources``."""

    name = "heartbeat"
    stage = Stage.FIRST
    reports_health = True

    def due(self, now: float) -> bool:
        return True

    async def poll(self, now: float, readings: Readings) -> Outcome:
        return None if now % 4 == 0 else ("late", "the heartbeat skipped a beat")

    async def on_restart(self, now: float, readings: Readings) -> None:
        return None


class PollerWithHeartbeat(Poller):
    def _make_sources(self) -> list[Source]:
        return [*super()._make_sources(), Heartbeat()]


@pytest.mark.parametrize(("start", "up"), [(0.0, 1.0), (2.0, 0.0)])
async def test_a_registered_source_is_polled_and_exported(
    fake_vllm: FakeVllm, make_rig: MakeRig, start: float, up: float
) -> None:
    rig = await make_rig(fake_vllm.url)
    poller = PollerWithHeartbeat(rig.poller.config, rig.poller._client, rig.poller._deps)
    rig.clock.now = 1_800_000_000.0 + start
    await poller.poll_once()
    text = poller.rendered.decode()
    assert samples(text, "kv_headroom_source_up")["heartbeat"] == up
    assert "heartbeat" in samples(text, "kv_headroom_source_poll_duration_seconds")


async def test_a_snapshot_is_rendered_once_by_the_first_scrape_that_asks(
    fake_vllm: FakeVllm, make_rig: MakeRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = await make_rig(fake_vllm.url)
    rendered: list[object] = []
    real = render_counted

    def counting(snapshot: Snapshot) -> tuple[bytes, dict[str, int]]:
        rendered.append(snapshot)
        return real(snapshot)

    monkeypatch.setattr(poller_module, "render_counted", counting)
    await rig.poll(times=3)
    assert rendered == []  # the polls left it to the scrapes
    first, second = rig.poller.rendered, rig.poller.rendered
    assert first is second
    assert rendered == [rig.poller.snapshot]


async def test_a_bug_while_rendering_serves_the_last_rendered_snapshot_with_vllm_down(
    fake_vllm: FakeVllm, make_rig: MakeRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = await make_rig(fake_vllm.url)
    await rig.poll()
    assert samples(rig.text, "kv_headroom_source_up")["vllm"] == 1
    real = render_counted
    await rig.poll()
    bad = rig.poller.snapshot

    def broken(snapshot: Snapshot) -> tuple[bytes, dict[str, int]]:
        if snapshot is bad:
            raise ZeroDivisionError("a bug in rendering")
        return real(snapshot)

    monkeypatch.setattr(poller_module, "render_counted", broken)
    with structlog.testing.capture_logs() as logs:
        text = rig.text  # the scrape is answered, not failed
    assert samples(text, "kv_headroom_source_up")["vllm"] == 0
    failed = [e["error"] for e in logs if e["event"] == "poll_failed"]
    assert failed
    assert "ZeroDivisionError" in failed[0]


class Counted(Heartbeat):
    """A source that counts its polls and is due only when told."""

    def __init__(self, due: bool | Exception) -> None:
        self.polls, self._due = 0, due

    def due(self, now: float) -> bool:
        if isinstance(self._due, Exception):
            raise self._due
        return self._due

    async def poll(self, now: float, readings: Readings) -> Outcome:
        self.polls += 1
        return None


@pytest.mark.parametrize(("due", "polls"), [(True, 1), (False, 0), (KeyError("a bug"), 1)])
async def test_a_source_is_polled_only_when_due_and_a_bug_in_due_polls_it_anyway(
    fake_vllm: FakeVllm, make_rig: MakeRig, due: bool | Exception, polls: int
) -> None:
    rig = await make_rig(fake_vllm.url)
    source = Counted(due)

    class WithCounted(Poller):
        def _make_sources(self) -> list[Source]:
            return [*super()._make_sources(), source]

    poller = WithCounted(rig.poller.config, rig.poller._client, rig.poller._deps)
    await poller.poll_once()
    assert source.polls == polls
    assert poller.snapshot.source("vllm").up  # type: ignore[union-attr]


async def test_the_deployment_is_logged_once_when_first_resolved_and_not_again_unchanged(
    fake_vllm: FakeVllm, make_rig: MakeRig
) -> None:
    rig = await make_rig(fake_vllm.url)
    with structlog.testing.capture_logs() as logs:
        await rig.poll()
        await rig.poll()
    events = [e for e in logs if e["event"] == "deployment"]
    assert len(events) == 1
    assert "block_size" in events[0]["changed"]
