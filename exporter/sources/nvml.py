"""The ``nvml`` source: GPU memory of the GPUs vLLM sees, read by ``nvml_reader.NvmlReader``
in a daemon thread, one read at a time, into ``GPU_MEMORY``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence

from exporter.sources.base import (
    Outcome,
    Plugin,
    Readings,
    Slot,
    SourceContext,
    Stage,
    in_daemon_thread,
)
from exporter.sources.cmdline import PROCESS
from exporter.sources.nvml_reader import (
    GpuMemory,
    NvmlFailure,
    NvmlReader,
    NvmlSample,
    select_devices,
)

# The reader's records, imported from here by the snapshot, dcgm-exporter's source and tests.
__all__ = [
    "GPU_MEMORY",
    "PLUGIN",
    "GpuMemory",
    "NvmlFailure",
    "NvmlReader",
    "NvmlSample",
    "NvmlSource",
    "select_devices",
]

# The GPU memory of the GPUs vLLM runs on, for the capacity chain: NVML's, or another
# GPU source's in the same shape where NVML has none (Readings.get takes NVML's first).
GPU_MEMORY: Slot[NvmlSample] = Slot("gpu_memory")


class NvmlSource:
    """GPU memory of the GPUs vLLM sees (its CUDA_VISIBLE_DEVICES when its process is
    visible, else the sidecar's own environment, unless ``nvml.devices`` says)."""

    name = "nvml"
    stage = Stage.FIRST
    reports_health = True

    def __init__(
        self,
        reader: NvmlReader,
        *,
        devices: Sequence[str] | None,
        env: Mapping[str, str],
        within: float,
    ) -> None:
        self.reader = reader
        self._devices, self._env, self._within = devices, env, within
        self._task: asyncio.Future[NvmlSample | NvmlFailure] | None = None

    def due(self, now: float) -> bool:
        return True  # memory, every poll

    async def poll(self, now: float, readings: Readings) -> Outcome:
        if self._task is None or self._task.done():
            process = readings.get(PROCESS)
            env = process.environ if process is not None and process.environ else self._env
            wanted, selection = select_devices(self._devices, env)
            reader = self.reader
            self._task = in_daemon_thread(
                lambda: reader.read(wanted, selection), "kv-headroom-nvml"
            )
        # A read still running from an earlier poll is waited on, never started twice:
        # NVML handles are not safe to use from two threads.
        readings.put(GPU_MEMORY, self.name, None)
        try:
            result = await asyncio.wait_for(asyncio.shield(self._task), timeout=self._within)
        except TimeoutError:
            return "timeout", "NVML did not answer in time"
        if isinstance(result, NvmlFailure):
            return result.kind, result.message
        readings.put(GPU_MEMORY, self.name, result)
        return None

    async def on_restart(self, now: float, readings: Readings) -> None:
        return None

    async def close(self) -> None:
        # Bounded, in a daemon thread: nvmlShutdown on a lost GPU can hang too.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(in_daemon_thread(self.reader.close, "kv-headroom-nvml-close"), 2)


def _make(context: SourceContext) -> NvmlSource:
    # The caller's deps stay as given: the reader is the poller's own when none is.
    reader = context.deps.nvml or NvmlReader()
    devices = context.config.nvml_devices
    return NvmlSource(reader, devices=devices, env=context.deps.env, within=context.within)


# Its two settings (nvml.enabled, nvml.devices) stay Config fields, as they were before the
# registry: Config(nvml_enabled=False) is how callers and tests turn it off.
PLUGIN = Plugin("nvml", _make, enabled="nvml.enabled")
