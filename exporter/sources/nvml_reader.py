"""GPU memory from NVML (``nvidia-ml-py``, imported as ``pynvml``).

NVML's ``memory.total`` is not the total vLLM sizes its budget from. CUDA's
``cudaMemGetInfo`` total leaves out a reserve the driver and firmware keep for themselves,
so an H100 reads 81,559 MiB in NVML but 79.19 GiB (85,028,896,768 B) in CUDA. NVML's v2
memory query reports that reserve as ``reserved``; ``GpuMemory.cuda_total_bytes`` subtracts
it, and falls back to NVML's total on drivers without the v2 query. What the sidecar
exports from a sample, e.g.::

    kv_headroom_gpu_memory_total_bytes{gpu="0"} 8.5028896768e+10
    source_up{source="nvml"} 1

Every NVML problem comes back as an ``NvmlFailure`` with a stable ``kind``, so the sidecar
shows ``source_up{source="nvml"} 0`` and keeps serving; nothing here raises or logs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from exporter.labels import MAX_GPUS

# pynvml makes one NVMLError subclass per NVML_ERROR_* code; its name is the stable part.
_KINDS = {
    "NVMLError_LibraryNotFound": ("library_not_found", "libnvidia-ml.so.1 not found, cannot {}"),
    "NVMLError_DriverNotLoaded": ("driver_not_loaded", "NVIDIA driver not loaded, cannot {}"),
    "NVMLError_NoPermission": ("no_permission", "no permission to {}"),
    "NVMLError_GpuIsLost": ("gpu_lost", "GPU lost, cannot {}"),
    "NVMLError_Uninitialized": ("uninitialized", "NVML not initialised, cannot {}"),
    "NVMLError_NotSupported": ("not_supported", "cannot {}: not supported by this GPU or driver"),
    "NVMLError_Timeout": ("timeout", "timed out trying to {}"),
}
# After these the NVML session is no use: shut it down and initialise again next time.
_REINIT = frozenset(
    {
        "NVMLError_Uninitialized",
        "NVMLError_GpuIsLost",
        "NVMLError_ResetRequired",
        "NVMLError_DriverNotLoaded",
        "NVMLError_LibraryNotFound",
        "NVMLError_LibRmVersionMismatch",
    }
)
# A driver or GPU (old branch, vGPU, some MIG setups) without an optional query; pynvml
# turns a missing unversioned symbol into NVMLLibraryMismatchError, outside NVMLError.
_UNSUPPORTED = frozenset(
    {
        "NVMLError_NotSupported",
        "NVMLError_FunctionNotFound",
        "NVMLError_ArgumentVersionMismatch",
        "NVMLLibraryMismatchError",
    }
)
_NO_SUCH_DEVICE = frozenset({"NVMLError_InvalidArgument", "NVMLError_NotFound"})


@dataclass(frozen=True)
class GpuMemory:
    index: int  # NVML device index
    uuid: str
    name: str
    total_bytes: int  # NVML memory.total, reserve included
    used_bytes: int  # NVML memory.used, from the same query as total
    reserved_bytes: int | None  # v2 query's reserved; None where the driver lacks it

    @property
    def cuda_total_bytes(self) -> int:
        """The total CUDA reports to vLLM when NVML tells the reserve, else NVML's total."""
        if self.reserved_bytes is None:
            return self.total_bytes
        return self.total_bytes - self.reserved_bytes


@dataclass(frozen=True)
class NvmlSample:
    gpus: tuple[GpuMemory, ...]
    selection: str  # how the GPUs were chosen, e.g. "CUDA_VISIBLE_DEVICES=0,1 (vLLM process env)"
    left_out: int = 0  # devices beyond MAX_GPUS, not read


@dataclass(frozen=True)
class NvmlFailure:
    # library_not_found, driver_not_loaded, no_permission, gpu_lost, uninitialized,
    # not_supported, no_gpu, unknown_device, timeout, error
    kind: str
    message: str  # one line for logs


def _parse(value: str) -> tuple[str, ...] | None:
    if value.strip().lower() == "all":
        return None
    if value.strip().lower() in ("none", "void"):
        return ()
    devices: list[str] = []
    for token in (t.strip() for t in value.split(",")):
        if token.startswith("-") and token[1:].isdigit():
            break  # CUDA stops at the first invalid entry; "-1" is the idiom for "no GPU"
        if token:
            devices.append(token)
    return tuple(devices)


def select_devices(
    wanted: Sequence[str] | None, env: Mapping[str, str], env_source: str = "vLLM process env"
) -> tuple[Sequence[str] | None, str]:
    """Which devices to read (None: all, (): none), and where that choice came from.

    ``wanted`` (config) wins, then CUDA_VISIBLE_DEVICES, then NVIDIA_VISIBLE_DEVICES in
    ``env``: indices or UUIDs, comma-separated. An empty CUDA_VISIBLE_DEVICES hides every GPU
    from CUDA, so it selects none; an empty NVIDIA_VISIBLE_DEVICES means unset to the
    container toolkit. Indices are NVML's, which match CUDA's when CUDA_DEVICE_ORDER is
    PCI_BUS_ID and NVML sees the same GPUs as vLLM; UUIDs are unambiguous.
    """
    if wanted is not None:
        text = ",".join(wanted)
        return _parse(text), f"nvml.devices={text} (config)"
    for var in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
        value = env.get(var)
        if value is None or (var == "NVIDIA_VISIBLE_DEVICES" and not value.strip()):
            continue
        return _parse(value), f"{var}={value} ({env_source})"
    return None, f"all GPUs (no CUDA_VISIBLE_DEVICES or NVIDIA_VISIBLE_DEVICES in {env_source})"


class _Failed(Exception):
    def __init__(self, failure: NvmlFailure) -> None:
        super().__init__(failure.message)
        self.failure = failure


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _one_line(exc: BaseException) -> str:
    try:
        return " ".join(str(exc).split()) or type(exc).__name__
    except Exception:  # a broken __str__ must not take the sidecar down
        return type(exc).__name__


class NvmlReader:
    """Reads GPU memory through one NVML session, opened on first use, reopened after loss."""

    def __init__(self, nvml: Any = None) -> None:
        self._nvml: Any = nvml
        self._initialised = False

    def read(self, wanted: Sequence[str] | None, selection: str) -> NvmlSample | NvmlFailure:
        try:
            return self._read(wanted, selection)
        except _Failed as failed:
            return failed.failure
        except Exception as exc:  # whatever NVML or its bindings do, the sidecar keeps serving
            self.close()
            return NvmlFailure("error", f"NVML: {type(exc).__name__}: {_one_line(exc)}")

    def close(self) -> None:
        if self._initialised:
            self._initialised = False
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()

    def _read(self, wanted: Sequence[str] | None, selection: str) -> NvmlSample:
        if wanted is not None and not wanted:
            raise _Failed(NvmlFailure("no_gpu", f"NVML: no GPU selected ({selection})"))
        if self._nvml is None:
            try:
                import pynvml  # here, so a missing package is a failure result, not a crash
            except ImportError as exc:
                msg = f"NVML: Python module pynvml not importable (install nvidia-ml-py): {exc}"
                raise _Failed(NvmlFailure("library_not_found", msg)) from None
            self._nvml = pynvml
        nvml = self._nvml
        if not self._initialised:
            self._call("initialise", nvml.nvmlInit)
            self._initialised = True
        count = int(self._call("count GPUs", nvml.nvmlDeviceGetCount))
        if count == 0:
            raise _Failed(NvmlFailure("no_gpu", "NVML: no GPU visible to NVML"))
        devices = [str(i) for i in range(count)] if wanted is None else list(wanted)
        left_out = max(0, len(devices) - MAX_GPUS)
        gpus = tuple(self._gpu(device, count) for device in devices[:MAX_GPUS])
        return NvmlSample(gpus, selection, left_out)

    def _gpu(self, device: str, count: int) -> GpuMemory:
        nvml, doing = self._nvml, f"query GPU {device}"
        try:
            if device.isdigit():
                handle = nvml.nvmlDeviceGetHandleByIndex(int(device))
            else:
                handle = nvml.nvmlDeviceGetHandleByUUID(device)
        except nvml.NVMLError as err:
            if type(err).__name__ not in _NO_SUCH_DEVICE:
                raise self._failed(err, doing) from None
            msg = f"NVML: no GPU {device} among the {count} NVML sees ({type(err).__name__})"
            raise _Failed(NvmlFailure("unknown_device", msg)) from None
        memory = self._optional(doing, nvml.nvmlDeviceGetMemoryInfo, handle, nvml.nvmlMemory_v2)
        reserved = None if memory is None else int(memory.reserved)
        if memory is None:
            memory = self._call(doing, nvml.nvmlDeviceGetMemoryInfo, handle)
        return GpuMemory(
            index=int(self._call(doing, nvml.nvmlDeviceGetIndex, handle)),
            uuid=_text(self._call(doing, nvml.nvmlDeviceGetUUID, handle)),
            name=_text(self._call(doing, nvml.nvmlDeviceGetName, handle)),
            total_bytes=int(memory.total),
            used_bytes=int(memory.used),
            reserved_bytes=reserved,
        )

    def _call(self, doing: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except self._nvml.NVMLError as err:
            raise self._failed(err, doing) from None

    def _optional(self, doing: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, or None where this driver or GPU does not have the query."""
        try:
            return fn(*args)
        except Exception as exc:
            if type(exc).__name__ in _UNSUPPORTED:
                return None
            if isinstance(exc, self._nvml.NVMLError):
                raise self._failed(exc, doing) from None
            raise

    def _failed(self, err: Exception, doing: str) -> _Failed:
        name = type(err).__name__
        kind, text = _KINDS.get(name, ("error", ""))
        what = text.format(doing) if text else f"cannot {doing}: {_one_line(err)}"
        if name in _REINIT:
            self.close()
        return _Failed(NvmlFailure(kind, f"NVML: {what} ({name})"))
