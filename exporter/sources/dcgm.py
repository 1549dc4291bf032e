"""GPU memory from the node's NVIDIA dcgm-exporter, for clusters that give pods no NVML.

dcgm-exporter (a DaemonSet, port 9400) serves every GPU of its node on ``/metrics``; the
framebuffer series are in MiB, one sample per GPU, e.g.::

    DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-5b4e…",modelName="NVIDIA L40S",Hostname="g"} 45459
    DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-5b4e…",modelName="NVIDIA L40S",Hostname="g"} 0
    DCGM_FI_DEV_FB_RESERVED{gpu="0",UUID="GPU-5b4e…",modelName="NVIDIA L40S",Hostname="g"} 608

DCGM's used + free + reserved is NVML's ``memory.total`` and its reserved NVML's v2
``reserved``, so each GPU becomes the NVML source's ``GpuMemory`` and fills the same slot
(``nvml.GPU_MEMORY``): the capacity chain reads it where NVML has nothing. The pod's GPUs
are picked from the page by ``dcgm.devices``, else vLLM's ``NVIDIA_VISIBLE_DEVICES`` (the
device plugin's UUIDs; its process environment when visible, else the sidecar's), else the
page's only GPU. Every failure is ``source_up{source="dcgm"} 0`` with a stable kind.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp

from exporter.labels import MAX_GPUS
from exporter.settings import (
    Spec,
    parse_bool,
    parse_devices,
    parse_url,
)
from exporter.sources.base import Outcome, Plugin, Readings, SourceContext, Stage
from exporter.sources.cmdline import PROCESS
from exporter.sources.nvml import GPU_MEMORY, GpuMemory, NvmlSample
from exporter.sources.vllm import redact

MIB = 1 << 20
# A node's page with every default counter is ~8 KiB a GPU; 16 GPUs with MIG stay far below.
MAX_PAGE_BYTES = 4 * MIB

_SAMPLE = re.compile(r"(DCGM_FI_DEV_FB_(?:FREE|USED|RESERVED))\{([^}]*)\}\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

ENABLED: Spec[bool] = Spec(
    "dcgm.enabled",
    None,
    parse_bool,
    default=False,
    help="read GPU memory from the node's dcgm-exporter (where the pod has no NVML)",
)
URL: Spec[str] = Spec(
    "dcgm.url",
    None,
    parse_url,
    redact,
    default="http://127.0.0.1:9400",
    help="dcgm-exporter's base URL, /metrics is read; on Kubernetes the node's: "
    "http://$(HOST_IP):9400",
)
DEVICES: Spec[tuple[str, ...] | None] = Spec(
    "dcgm.devices",
    None,
    parse_devices,
    help="this vLLM's GPUs on the page, UUIDs or node indices "
    "(default: NVIDIA_VISIBLE_DEVICES, else the page's only GPU)",
)


class _Down(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def parse_gpus(text: str) -> dict[str, GpuMemory]:
    """The whole GPUs on a dcgm-exporter page, by UUID. MIG instances (a ``GPU_I_ID``
    label) are left out: their memory is a slice, not the GPU vLLM sizes its budget from."""
    seen: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        if not line.startswith("DCGM_FI_DEV_FB_"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        labels = dict(_LABEL.findall(m.group(2)))
        uuid = labels.get("UUID")
        if not uuid or "GPU_I_ID" in labels:
            continue
        try:
            mib = float(m.group(3))
        except ValueError:
            continue
        gpu = seen.setdefault(uuid, {"labels": labels})
        gpu[m.group(1)] = mib
    out: dict[str, GpuMemory] = {}
    for uuid, gpu in seen.items():
        free, used = gpu.get("DCGM_FI_DEV_FB_FREE"), gpu.get("DCGM_FI_DEV_FB_USED")
        if free is None or used is None:
            continue
        reserved = gpu.get("DCGM_FI_DEV_FB_RESERVED")
        labels = gpu["labels"]
        index = labels.get("gpu", "")
        out[uuid] = GpuMemory(
            index=int(index) if index.isdigit() else -1,
            uuid=uuid,
            name=labels.get("modelName", ""),
            total_bytes=round((used + free + (reserved or 0.0)) * MIB),
            used_bytes=round(used * MIB),
            reserved_bytes=None if reserved is None else round(reserved * MIB),
        )
    return out


def wanted(
    configured: Sequence[str] | None, env: Mapping[str, str]
) -> tuple[list[str] | None, str]:
    """Which GPUs of the page are this pod's (None: the page's only one), and why."""
    if configured is not None:
        return list(configured), f"dcgm.devices={','.join(configured)} (config)"
    value = (env.get("NVIDIA_VISIBLE_DEVICES") or "").strip()
    if value and value.lower() not in ("all", "none", "void"):
        return [t.strip() for t in value.split(",") if t.strip()], f"NVIDIA_VISIBLE_DEVICES={value}"
    return None, "the page's only GPU (no dcgm.devices, no NVIDIA_VISIBLE_DEVICES)"


def select(
    gpus: Mapping[str, GpuMemory], want: list[str] | None, why: str
) -> tuple[GpuMemory, ...]:
    if not gpus:
        raise _Down("no_gpu_memory", "dcgm-exporter's page has no DCGM_FI_DEV_FB_FREE/USED")
    if want is None:
        if len(gpus) != 1:
            raise _Down(
                "ambiguous",
                f"dcgm-exporter lists {len(gpus)} GPUs and nothing says which is vLLM's: "
                "set dcgm.devices",
            )
        return tuple(gpus.values())
    by_index = {str(g.index): g for g in gpus.values()}
    picked = []
    for token in want[:MAX_GPUS]:
        gpu = gpus.get(token) or by_index.get(token)
        if gpu is None:
            listed = ", ".join(sorted(gpus))
            raise _Down("unknown_device", f"dcgm-exporter lists no GPU {token} ({why}): {listed}")
        picked.append(gpu)
    return tuple(picked)


class DcgmSource:
    """GPU memory of vLLM's GPUs from dcgm-exporter's page, over its own HTTP session."""

    name = "dcgm"
    stage = Stage.FIRST
    reports_health = True

    def __init__(
        self, *, url: str, devices: Sequence[str] | None, env: Mapping[str, str], within: float
    ) -> None:
        self._url, self._devices, self._env, self._within = url, devices, env, within
        self._session: aiohttp.ClientSession | None = None

    def due(self, now: float) -> bool:
        return True  # memory, every poll, like NVML

    async def poll(self, now: float, readings: Readings) -> Outcome:
        readings.put(GPU_MEMORY, self.name, None)
        process = readings.get(PROCESS)
        env = process.environ if process is not None and process.environ else self._env
        want, why = wanted(self._devices, env)
        try:
            text = await self._page()
            gpus = select(parse_gpus(text), want, why)
        except _Down as down:
            return down.kind, str(down)
        where = f"{why}, dcgm-exporter at {redact(self._url)}"
        readings.put(
            GPU_MEMORY, self.name, NvmlSample(gpus, where, max(0, len(want or ()) - MAX_GPUS))
        )
        return None

    async def _page(self) -> str:
        if self._session is None:  # made here: a session belongs to the running loop
            self._session = aiohttp.ClientSession()
        url = f"{self._url}/metrics"
        try:
            async with asyncio.timeout(self._within):
                async with self._session.get(url, allow_redirects=False) as resp:
                    if resp.status != 200:
                        raise _Down("http_error", f"dcgm-exporter answered HTTP {resp.status}")
                    body = await resp.content.read(MAX_PAGE_BYTES + 1)
        except TimeoutError:
            raise _Down("timeout", f"dcgm-exporter did not answer in {self._within:g}s") from None
        except aiohttp.ClientError as e:
            raise _Down("unreachable", f"dcgm-exporter: {type(e).__name__}: {e}") from None
        if len(body) > MAX_PAGE_BYTES:
            raise _Down("too_large", f"dcgm-exporter's page is over {MAX_PAGE_BYTES} bytes")
        return body.decode("utf-8", errors="replace")

    async def on_restart(self, now: float, readings: Readings) -> None:
        return None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _make(context: SourceContext) -> DcgmSource:
    config = context.config
    return DcgmSource(
        url=config.get(URL),
        devices=config.get(DEVICES),
        env=context.deps.env,
        within=context.within,
    )


PLUGIN = Plugin(
    "dcgm",
    _make,
    settings=(ENABLED, URL, DEVICES),
    enabled="dcgm.enabled",
    flags=("dcgm.enabled", "dcgm.url"),
)
