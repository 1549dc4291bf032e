"""The NVML reader: real pynvml structs and error classes behind a driver-less fake.

There is no GPU here, so the fake stands in for the driver only: every function returns what
pynvml 13 returns (``c_nvmlMemory_t``, ``c_nvmlMemory_v2_t``, process objects built from
``c_nvmlProcessInfo_v3_t``) and raises ``pynvml.NVMLError(code)``, which is the real subclass.
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass, field
from typing import Any

import pynvml
import pytest

from exporter.sources import nvml_reader as nvml_module
from exporter.sources.nvml import (
    GpuMemory,
    NvmlFailure,
    NvmlReader,
    NvmlSample,
    select_devices,
)

MIB = 1 << 20
H100_NVML_TOTAL = 81_559 * MIB  # what nvidia-smi / NVML reads on an H100 80GB HBM3
H100_CUDA_TOTAL = 85_028_896_768  # what CUDA (and so vLLM) reads on the same GPU


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    total: int = H100_NVML_TOTAL
    reserved: int = H100_NVML_TOTAL - H100_CUDA_TOTAL
    used: int = 70_000 * MIB
    processes: list[tuple[int, int]] = field(default_factory=lambda: [(4242, 69_000 * MIB)])
    v2_error: int | None = None  # NVML_ERROR_* the v2 memory query raises
    processes_error: int | None = None


class FakeNvml:
    """The slice of the pynvml module the reader uses, with the driver replaced."""

    NVMLError = pynvml.NVMLError
    nvmlMemory_v2 = pynvml.nvmlMemory_v2

    def __init__(self, *gpus: FakeGpu) -> None:
        self.gpus = list(gpus) or [FakeGpu("GPU-0000"), FakeGpu("GPU-1111")]
        self.fail: dict[str, int] = {}  # function name -> NVML_ERROR_* it raises
        self.inits = 0
        self.shutdowns = 0

    def _check(self, fn: str) -> None:
        if fn in self.fail:
            raise pynvml.NVMLError(self.fail[fn])

    def nvmlInit(self) -> None:
        self._check("nvmlInit")
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self._check("nvmlShutdown")
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._check("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeGpu:
        self._check("nvmlDeviceGetHandleByUUID")
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetIndex(self, handle: FakeGpu) -> int:
        return self.gpus.index(handle)

    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> str:
        return handle.uuid

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str:
        return handle.name

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu, version: int | None = None) -> Any:
        self._check("nvmlDeviceGetMemoryInfo")
        free = handle.total - handle.used
        if not version:
            return pynvml.c_nvmlMemory_t(total=handle.total, free=free, used=handle.used)
        if handle.v2_error is not None:
            raise pynvml.NVMLError(handle.v2_error)
        return pynvml.c_nvmlMemory_v2_t(
            version=version,
            total=handle.total,
            reserved=handle.reserved,
            free=free,
            used=handle.used,
        )

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeGpu) -> list[Any]:
        if handle.processes_error is not None:
            raise pynvml.NVMLError(handle.processes_error)
        procs = []
        for pid, used in handle.processes:
            info = pynvml.c_nvmlProcessInfo_v3_t(pid=pid, usedGpuMemory=used)
            procs.append(pynvml.nvmlStructToFriendlyObject(info))
        return procs


def read(fake: FakeNvml, wanted: list[str] | None = None) -> NvmlSample | NvmlFailure:
    return NvmlReader(fake).read(wanted, "test")


def sample(fake: FakeNvml, wanted: list[str] | None = None) -> NvmlSample:
    result = read(fake, wanted)
    assert isinstance(result, NvmlSample), result
    return result


def failure(fake: FakeNvml, wanted: list[str] | None = None) -> NvmlFailure:
    result = read(fake, wanted)
    assert isinstance(result, NvmlFailure), result
    return result


def test_reads_total_used_and_reserved() -> None:
    result = sample(FakeNvml())
    assert result.selection == "test"
    assert result.gpus[1] == GpuMemory(
        index=1,
        uuid="GPU-1111",
        name="NVIDIA H100 80GB HBM3",
        total_bytes=H100_NVML_TOTAL,
        used_bytes=70_000 * MIB,
        reserved_bytes=H100_NVML_TOTAL - H100_CUDA_TOTAL,
    )


def test_cuda_total_subtracts_reserved() -> None:
    assert sample(FakeNvml()).gpus[0].cuda_total_bytes == H100_CUDA_TOTAL


def test_cuda_total_is_nvml_total_when_reserve_unknown() -> None:
    gpu = GpuMemory(0, "GPU-0", "x", total_bytes=100, used_bytes=1, reserved_bytes=None)
    assert gpu.cuda_total_bytes == 100


@pytest.mark.parametrize(
    "code", [pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND]
)
def test_v2_memory_query_missing_falls_back_to_v1(code: int) -> None:
    gpu = sample(FakeNvml(FakeGpu("GPU-0", v2_error=code))).gpus[0]
    assert (gpu.total_bytes, gpu.used_bytes, gpu.reserved_bytes) == (
        H100_NVML_TOTAL,
        70_000 * MIB,
        None,
    )
    assert gpu.cuda_total_bytes == H100_NVML_TOTAL


def test_a_failing_process_query_cannot_take_nvml_down() -> None:
    # GPU processes cannot be matched to vLLM in a container (host PIDs), so the reader
    # does not ask for them: a driver whose process query fails still reports memory.
    fake = FakeNvml(FakeGpu("GPU-0", processes_error=pynvml.NVML_ERROR_UNKNOWN))
    assert sample(fake).gpus[0].used_bytes == 70_000 * MIB


@pytest.mark.parametrize(
    ("code", "kind", "error_class"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "library_not_found", "NVMLError_LibraryNotFound"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "driver_not_loaded", "NVMLError_DriverNotLoaded"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "no_permission", "NVMLError_NoPermission"),
        (pynvml.NVML_ERROR_GPU_IS_LOST, "gpu_lost", "NVMLError_GpuIsLost"),
        (pynvml.NVML_ERROR_NOT_SUPPORTED, "not_supported", "NVMLError_NotSupported"),
        (pynvml.NVML_ERROR_TIMEOUT, "timeout", "NVMLError_Timeout"),
        (pynvml.NVML_ERROR_UNKNOWN, "error", "NVMLError_Unknown"),
        (pynvml.NVML_ERROR_CORRUPTED_INFOROM, "error", "NVMLError_CorruptedInforom"),
    ],
)
def test_nvml_error_class_maps_to_kind(code: int, kind: str, error_class: str) -> None:
    fake = FakeNvml()
    fake.fail["nvmlDeviceGetMemoryInfo"] = code
    result = failure(fake)
    assert result.kind == kind
    assert result.message.startswith("NVML: ")
    assert result.message.endswith(f"({error_class})")
    assert "\n" not in result.message


def test_failure_message_names_what_was_being_done() -> None:
    fake = FakeNvml()
    fake.fail["nvmlDeviceGetMemoryInfo"] = pynvml.NVML_ERROR_NO_PERMISSION
    assert failure(fake).message == "NVML: no permission to query GPU 0 (NVMLError_NoPermission)"


def test_init_failure_is_a_result_naming_init() -> None:
    fake = FakeNvml()
    fake.fail["nvmlInit"] = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    assert failure(fake) == NvmlFailure(
        "driver_not_loaded",
        "NVML: NVIDIA driver not loaded, cannot initialise (NVMLError_DriverNotLoaded)",
    )


def test_recovers_on_next_call_after_init_failure() -> None:
    fake = FakeNvml()
    fake.fail["nvmlInit"] = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    reader = NvmlReader(fake)
    assert isinstance(reader.read(None, "test"), NvmlFailure)
    del fake.fail["nvmlInit"]
    assert isinstance(reader.read(None, "test"), NvmlSample)
    assert fake.inits == 1


def test_initialises_once_across_reads() -> None:
    fake = FakeNvml()
    reader = NvmlReader(fake)
    for _ in range(3):
        assert isinstance(reader.read(None, "test"), NvmlSample)
    assert (fake.inits, fake.shutdowns) == (1, 0)


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_UNINITIALIZED])
def test_lost_session_is_shut_down_and_reinitialised_next_call(code: int) -> None:
    fake = FakeNvml()
    reader = NvmlReader(fake)
    fake.fail["nvmlDeviceGetCount"] = code
    assert isinstance(reader.read(None, "test"), NvmlFailure)
    assert (fake.inits, fake.shutdowns) == (1, 1)
    del fake.fail["nvmlDeviceGetCount"]
    assert isinstance(reader.read(None, "test"), NvmlSample)
    assert fake.inits == 2


def test_permission_error_keeps_the_session() -> None:
    fake = FakeNvml()
    reader = NvmlReader(fake)
    fake.fail["nvmlDeviceGetMemoryInfo"] = pynvml.NVML_ERROR_NO_PERMISSION
    assert isinstance(reader.read(None, "test"), NvmlFailure)
    assert (fake.inits, fake.shutdowns) == (1, 0)


def test_reads_only_selected_devices_by_index_and_uuid() -> None:
    fake = FakeNvml(FakeGpu("GPU-a"), FakeGpu("GPU-b"), FakeGpu("GPU-c"))
    gpus = sample(fake, ["2", "GPU-a"]).gpus
    assert [(g.index, g.uuid) for g in gpus] == [(2, "GPU-c"), (0, "GPU-a")]


def test_unknown_index_is_unknown_device_naming_it() -> None:
    result = failure(FakeNvml(), ["7"])
    assert result.kind == "unknown_device"
    assert result.message == "NVML: no GPU 7 among the 2 NVML sees (NVMLError_InvalidArgument)"


def test_unknown_uuid_is_unknown_device_naming_it() -> None:
    result = failure(FakeNvml(), ["GPU-abc"])
    assert result.kind == "unknown_device"
    assert "GPU-abc" in result.message


def test_empty_selection_is_no_gpu_without_touching_nvml() -> None:
    fake = FakeNvml()
    fake.fail["nvmlInit"] = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    assert failure(fake, []).kind == "no_gpu"


def test_no_gpu_visible_to_nvml_is_no_gpu() -> None:
    fake = FakeNvml()
    fake.gpus = []
    assert failure(fake).kind == "no_gpu"


def test_unexpected_exception_is_an_error_result() -> None:
    def broken(handle: FakeGpu) -> str:
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")

    fake = FakeNvml()
    fake.nvmlDeviceGetName = broken  # type: ignore[method-assign]
    result = failure(fake)
    assert result.kind == "error"
    assert result.message.startswith("NVML: UnicodeDecodeError: ")


def test_missing_pynvml_module_is_library_not_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    result = NvmlReader().read(None, "test")
    assert isinstance(result, NvmlFailure)
    assert result.kind == "library_not_found"


def test_close_shuts_down_an_open_session() -> None:
    fake = FakeNvml()
    reader = NvmlReader(fake)
    reader.read(None, "test")
    reader.close()
    reader.close()
    assert fake.shutdowns == 1


def test_close_never_raises() -> None:
    fake = FakeNvml()
    reader = NvmlReader(fake)
    reader.read(None, "test")
    fake.fail["nvmlShutdown"] = pynvml.NVML_ERROR_UNINITIALIZED
    reader.close()
    NvmlReader(fake).close()  # never initialised
    NvmlReader().close()  # never even imported pynvml


def test_error_class_names_the_reader_maps_exist_in_pynvml() -> None:
    names = {
        *nvml_module._KINDS,
        *nvml_module._REINIT,
        *nvml_module._UNSUPPORTED,
        *nvml_module._NO_SUCH_DEVICE,
    }
    assert all(hasattr(pynvml, name) for name in names)


def _libnvidia_ml_loads() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(_libnvidia_ml_loads(), reason="this machine has an NVIDIA driver")
def test_real_pynvml_without_driver_gives_failure_not_exception() -> None:
    reader = NvmlReader()
    try:
        for _ in range(2):  # and again, through the init retry
            result = reader.read(None, "test")
            assert isinstance(result, NvmlFailure)
            assert result.kind in {"library_not_found", "driver_not_loaded"}
    finally:
        reader.close()


@pytest.mark.skipif(not _libnvidia_ml_loads(), reason="no NVIDIA driver on this machine")
def test_real_pynvml_with_driver_reads_every_gpu() -> None:
    reader = NvmlReader()
    try:
        result = reader.read(None, "test")
    finally:
        reader.close()
    if isinstance(result, NvmlFailure):
        assert result.kind in {"no_gpu", "no_permission"}, result
    else:
        assert all(0 < g.cuda_total_bytes <= g.total_bytes for g in result.gpus)


ENV_BOTH = {"CUDA_VISIBLE_DEVICES": "1", "NVIDIA_VISIBLE_DEVICES": "GPU-x"}


@pytest.mark.parametrize(
    ("wanted", "env", "devices", "selection"),
    [
        (["0"], ENV_BOTH, ("0",), "nvml.devices=0 (config)"),
        (None, ENV_BOTH, ("1",), "CUDA_VISIBLE_DEVICES=1 (vLLM process env)"),
        (
            None,
            {"NVIDIA_VISIBLE_DEVICES": "GPU-x"},
            ("GPU-x",),
            "NVIDIA_VISIBLE_DEVICES=GPU-x (vLLM process env)",
        ),
        (
            None,
            {"CUDA_VISIBLE_DEVICES": "0,1"},
            ("0", "1"),
            "CUDA_VISIBLE_DEVICES=0,1 (vLLM process env)",
        ),
        (None, {"CUDA_VISIBLE_DEVICES": " 0, GPU-abc "}, ("0", "GPU-abc"), None),
        (None, {"CUDA_VISIBLE_DEVICES": "2,-1,3"}, ("2",), None),
        (None, {"CUDA_VISIBLE_DEVICES": "-1"}, (), None),
        (None, {"CUDA_VISIBLE_DEVICES": ""}, (), None),
        (None, {"CUDA_VISIBLE_DEVICES": "all"}, None, None),
        (None, {"NVIDIA_VISIBLE_DEVICES": "all"}, None, None),
        (None, {"NVIDIA_VISIBLE_DEVICES": "none"}, (), None),
        (None, {"NVIDIA_VISIBLE_DEVICES": "void"}, (), None),
        (None, {"NVIDIA_VISIBLE_DEVICES": ""}, None, None),
        (["all"], {}, None, "nvml.devices=all (config)"),
        (
            None,
            {},
            None,
            "all GPUs (no CUDA_VISIBLE_DEVICES or NVIDIA_VISIBLE_DEVICES in vLLM process env)",
        ),
    ],
)
def test_select_devices_precedence_and_parsing(
    wanted: list[str] | None,
    env: dict[str, str],
    devices: tuple[str, ...] | None,
    selection: str | None,
) -> None:
    got_devices, got_selection = select_devices(wanted, env)
    assert got_devices == devices
    if selection is not None:
        assert got_selection == selection


def test_select_devices_names_the_env_source() -> None:
    _, selection = select_devices(None, {"CUDA_VISIBLE_DEVICES": "0"}, env_source="sidecar env")
    assert selection == "CUDA_VISIBLE_DEVICES=0 (sidecar env)"


def test_none_selection_reads_as_no_gpu() -> None:
    devices, selection = select_devices(None, {"NVIDIA_VISIBLE_DEVICES": "none"})
    result = NvmlReader(FakeNvml()).read(devices, selection)
    assert result == NvmlFailure(
        "no_gpu", "NVML: no GPU selected (NVIDIA_VISIBLE_DEVICES=none (vLLM process env))"
    )
