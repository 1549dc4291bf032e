"""NVML failing in every way pynvml can say, against the running sidecar: GPU memory
drops out (source_up{source="nvml"} 0, one event with the kind), vLLM's figures stay, and
the GPUs come back on the next good read. NVML is faked at the driver edge only: the
reader gets pynvml's own error classes, raised from a fake of the library's functions."""

from __future__ import annotations

import threading

import pynvml
import pytest

from exporter.poller import PollerDeps
from exporter.sources.nvml import NvmlReader
from tests.faults.conftest import MakeSidecar, Sidecar, value
from tests.scripted_vllm import ScriptedVllm
from tests.sources.test_nvml import FakeGpu, FakeNvml

CODES = sorted(
    (name, getattr(pynvml, name)) for name in dir(pynvml) if name.startswith("NVML_ERROR_")
)
NAMED = {
    "NVML_ERROR_GPU_IS_LOST": "gpu_lost",
    "NVML_ERROR_LIBRARY_NOT_FOUND": "library_not_found",
    "NVML_ERROR_UNINITIALIZED": "uninitialized",
    "NVML_ERROR_NO_PERMISSION": "no_permission",
    "NVML_ERROR_NOT_SUPPORTED": "not_supported",
    "NVML_ERROR_DRIVER_NOT_LOADED": "driver_not_loaded",
    "NVML_ERROR_TIMEOUT": "timeout",
}
# Every code on the memory query a poll makes; and where some happen in life as well: a
# missing library or driver at nvmlInit from the start, a lost GPU while counting.
CASES = [("nvmlDeviceGetMemoryInfo", name, code) for name, code in CODES]
CASES += [
    ("nvmlInit", "NVML_ERROR_LIBRARY_NOT_FOUND", pynvml.NVML_ERROR_LIBRARY_NOT_FOUND),
    ("nvmlInit", "NVML_ERROR_DRIVER_NOT_LOADED", pynvml.NVML_ERROR_DRIVER_NOT_LOADED),
    ("nvmlDeviceGetCount", "NVML_ERROR_GPU_IS_LOST", pynvml.NVML_ERROR_GPU_IS_LOST),
]
IDS = [f"{name}-in-{function}" for function, name, _ in CASES]


async def failing(
    make_sidecar: MakeSidecar, scripted: ScriptedVllm, function: str, code: int
) -> tuple[Sidecar, FakeNvml]:
    """A sidecar that read NVML once healthy, then twice while ``function`` raised ``code``
    (from the start for nvmlInit, which a healthy session does not call again)."""
    fake = FakeNvml(FakeGpu("GPU-0000"))
    sidecar: Sidecar = await make_sidecar(scripted.url, deps=PollerDeps(nvml=NvmlReader(fake)))
    if function != "nvmlInit":
        await sidecar.poll()
    fake.fail[function] = code
    sidecar.forget_events()
    await sidecar.poll(2)
    return sidecar, fake


@pytest.mark.parametrize(("function", "name", "code"), CASES, ids=IDS)
async def test_nvml_error_shows_nvml_down_and_vllm_up(
    make_sidecar: MakeSidecar, scripted: ScriptedVllm, function: str, name: str, code: int
) -> None:
    sidecar, _ = await failing(make_sidecar, scripted, function, code)
    text = await sidecar.scrape()
    assert value(text, "kv_headroom_source_up", source="nvml") == 0
    assert value(text, "kv_headroom_source_up", source="vllm") == 1
    assert value(text, "kv_headroom_gpu_memory_total_bytes", gpu="0") is None


@pytest.mark.parametrize(("function", "name", "code"), CASES, ids=IDS)
async def test_nvml_error_is_one_event_with_its_kind(
    make_sidecar: MakeSidecar, scripted: ScriptedVllm, function: str, name: str, code: int
) -> None:
    sidecar, _ = await failing(make_sidecar, scripted, function, code)
    (event,) = sidecar.named("source_down", source="nvml")
    assert event["kind"] == NAMED.get(name, "error")
    assert event["error"].startswith("NVML: ")


@pytest.mark.parametrize(("function", "name", "code"), CASES, ids=IDS)
async def test_nvml_recovers_on_the_next_good_read(
    make_sidecar: MakeSidecar, scripted: ScriptedVllm, function: str, name: str, code: int
) -> None:
    sidecar, fake = await failing(make_sidecar, scripted, function, code)
    del fake.fail[function]
    await sidecar.poll()
    text = await sidecar.scrape()
    assert value(text, "kv_headroom_source_up", source="nvml") == 1
    assert value(text, "kv_headroom_gpu_memory_total_bytes", gpu="0") is not None


class HangingNvml(FakeNvml):
    """The memory query blocks until released, as NVML does for a GPU that fell off the bus."""

    def __init__(self) -> None:
        super().__init__(FakeGpu("GPU-0000"))
        self.release = threading.Event()
        self.hang = False

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu, version: int | None = None) -> object:
        if self.hang:
            self.release.wait(timeout=30)  # bounded, so a failed test cannot leak forever
        return super().nvmlDeviceGetMemoryInfo(handle, version)


async def test_hung_nvml_is_a_timeout_and_the_read_is_not_started_twice(
    make_sidecar: MakeSidecar, scripted: ScriptedVllm
) -> None:
    fake = HangingNvml()
    sidecar = await make_sidecar(scripted.url, deps=PollerDeps(nvml=NvmlReader(fake)))
    await sidecar.poll()
    fake.hang = True
    await sidecar.poll(3)
    text = await sidecar.scrape()
    assert value(text, "kv_headroom_source_up", source="nvml") == 0
    assert value(text, "kv_headroom_source_up", source="vllm") == 1
    assert [e["kind"] for e in sidecar.named("source_down", source="nvml")] == ["timeout"]
    fake.hang = False
    fake.release.set()
    await sidecar.poll(2)
    assert value(await sidecar.scrape(), "kv_headroom_source_up", source="nvml") == 1
