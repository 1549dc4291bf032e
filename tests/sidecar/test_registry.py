"""Sources as plug-ins: the poll loop makes its sources from the registry, a source's
settings become keys, variables and flags, a slot takes the first writer that has a value,
and every source that holds something is closed."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
import structlog

from exporter.config import Config
from exporter.poller import Poller, PollerDeps
from exporter.serve_cli import SERVE_FLAGS
from exporter.settings import Spec, parse_str
from exporter.sources.base import Plugin, Readings, Slot
from exporter.sources.registry import MODULES, REGISTRY
from tests.sidecar.conftest import FakeVllm, MakeRig

ROOT = Path(__file__).resolve().parents[2]


async def test_the_poll_loop_makes_its_sources_from_the_registry_in_its_order(
    fake_vllm: FakeVllm, make_rig: MakeRig
) -> None:
    rig = await make_rig(fake_vllm.url, nvml_enabled=True)
    made = [s.name for s in rig.poller._sources]
    assert made == [p.name for p in REGISTRY if p.on(rig.poller.config)]
    assert made[:4] == ["vllm", "process", "nvml", "model"]


async def test_a_source_whose_enable_flag_is_off_is_not_made(
    fake_vllm: FakeVllm, make_rig: MakeRig
) -> None:
    rig = await make_rig(fake_vllm.url, nvml_enabled=False)
    assert "nvml" not in [s.name for s in rig.poller._sources]


def test_every_registered_module_declares_its_plugin_under_its_own_name() -> None:
    assert len(REGISTRY) == len(MODULES)
    assert len({p.name for p in REGISTRY}) == len(REGISTRY)


def test_the_poller_wires_no_source_by_hand() -> None:
    # The poll loop makes its sources only through the registry: from a source module it
    # imports nothing but the slots it reads (vLLM's page, card and version, the flags).
    tree = ast.parse((ROOT / "exporter" / "poller.py").read_text())
    from_sources = {
        (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and node.module in {f"exporter.sources.{m}" for m in MODULES}
        for alias in node.names
    }
    assert from_sources
    for module, name in from_sources:
        assert isinstance(getattr(importlib.import_module(module), name), Slot), (module, name)


def test_a_slot_gives_the_first_registered_writer_that_has_a_value() -> None:
    slot: Slot[str] = Slot("gpu")
    readings = Readings(order=("nvml", "dcgm"))
    readings.put(slot, "dcgm", "from dcgm")
    readings.put(slot, "nvml", None)  # NVML answered nothing this poll
    assert readings.get(slot) == "from dcgm"
    readings.put(slot, "nvml", "from nvml")
    assert readings.get(slot) == "from nvml"


def test_a_slot_nobody_wrote_is_none() -> None:
    assert Readings().get(Slot[int]("never")) is None


WHERE = Spec("probe.where", None, parse_str, default="here", help="where the probe looks")


def test_a_source_setting_reads_back_typed_with_its_default_when_unset() -> None:
    assert Config().get(WHERE) == "here"
    assert Config(settings={"probe.where": "there"}).get(WHERE) == "there"


def test_serve_keeps_its_own_flags_first_in_their_order() -> None:
    assert SERVE_FLAGS[:10] == (
        "vllm.url",
        "vllm.timeout",
        "web.listen_address",
        "web.config_file",
        "poll.interval",
        "poll.window",
        "model.path",
        "log.format",
        "log.level",
        "nvml.enabled",
    )


class Holder:
    """A source that holds something and fails to let it go."""

    name = "holder"
    closed = False

    async def close(self) -> None:
        Holder.closed = True
        raise OSError("the session would not close")


async def test_closing_the_poller_closes_every_source_that_holds_something(
    fake_vllm: FakeVllm, make_rig: MakeRig
) -> None:
    rig = await make_rig(fake_vllm.url)
    rig.poller._sources.insert(0, Holder())
    with structlog.testing.capture_logs() as logs:
        await rig.poller.close()
    assert Holder.closed
    assert [e["source"] for e in logs if e["event"] == "source_close_failed"] == ["holder"]


def test_a_plugin_without_an_enable_flag_is_always_on() -> None:
    plugin = Plugin("always", lambda context: pytest.fail("not made here"))
    assert plugin.on(Config(nvml_enabled=False))


def test_the_poller_leaves_the_process_scan_to_the_source_when_deps_give_none() -> None:
    deps = PollerDeps()
    Poller(Config(nvml_enabled=False), None, deps)  # type: ignore[arg-type]
    assert (deps.find_processes, deps.read_flags, deps.load_model) == (None, None, None)
