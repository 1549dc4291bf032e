"""A GPU for the simulated server, spoken through pynvml's own structs and errors.

``SimulatedNvml`` is what ``NvmlReader`` gets in place of the ``pynvml`` module in the
demo: one device whose used memory is the simulated vLLM's footprint plus whatever
foreign process the scenario puts on the card.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pynvml


class SimulatedNvml:
    """The slice of the pynvml module NvmlReader calls, for one simulated GPU."""

    NVMLError = pynvml.NVMLError
    nvmlMemory_v2 = pynvml.nvmlMemory_v2

    def __init__(self, name: str, memory: Callable[[], tuple[int, int, int]], pid: int) -> None:
        """``memory()`` → (NVML total, NVML used, CUDA total) bytes, read at each call."""
        self._name = name
        self._memory = memory
        self._pid = pid

    def nvmlInit(self) -> None:
        return None

    def nvmlShutdown(self) -> None:
        return None

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index != 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 0

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        if uuid != self.nvmlDeviceGetUUID(0):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return 0

    def nvmlDeviceGetIndex(self, handle: int) -> int:
        return handle

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return "GPU-51301a7e-0000-4000-8000-000000000000"

    def nvmlDeviceGetName(self, handle: int) -> str:
        return self._name

    def nvmlDeviceGetMemoryInfo(self, handle: int, version: int | None = None) -> Any:
        total, used, cuda_total = self._memory()
        free = total - used
        if not version:
            return pynvml.c_nvmlMemory_t(total=total, free=free, used=used)
        return pynvml.c_nvmlMemory_v2_t(
            version=version, total=total, reserved=total - cuda_total, free=free, used=used
        )

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        _, used, _ = self._memory()
        info = pynvml.c_nvmlProcessInfo_v3_t(pid=self._pid, usedGpuMemory=used)
        return [pynvml.nvmlStructToFriendlyObject(info)]
