"""Which flags the running vLLM was started with, and where each one was learnt.

In order of trust: vLLM's own ``cache_config_info`` labels, ``/v1/models`` and
``/version``; the vLLM command line (when the pod shares its process namespace); the
sidecar's ``deployment:`` config. Pure (every input is passed in) but for a drafter's
config.json, read where ``--speculative-config`` names a local path (``read_local_draft``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from exporter.cache_config import CacheConfig
from exporter.capacity.arch import ModelArch, parse_config
from exporter.capacity.deploy_flags import deployment_flags
from exporter.capacity.gpus import CPU, Gpu, lookup_gpu
from exporter.capacity.plan import PlanRequest
from exporter.capacity.releases import DEFAULT_VERSION, release
from exporter.errors import InputError

FROM_CACHE_CONFIG = "vllm cache_config_info"
FROM_MODELS = "vllm /v1/models"
FROM_VERSION = "vllm /version"
FROM_CMDLINE = "vllm command line"
FROM_CONFIG = "sidecar config"

FLAGS = (
    "vllm_version",
    "model",
    "max_model_len",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "max_num_seqs",
    "max_num_batched_tokens",
    "gpu_memory_utilization",
    "kv_cache_dtype",
    "dtype",
    "quantization",
    "block_size",
    "enforce_eager",
    "enable_prefix_caching",
    "num_gpu_blocks_override",
    "kv_cache_memory_bytes",
    "gpu",
    "weights_bytes",
    # Flags that move the budget or the blocks (capacity/deploy_flags.py).
    "speculative_config",
    "enable_lora",
    "max_loras",
    "max_lora_rank",
    "fully_sharded_loras",
    "lora_dtype",
    "cpu_offload_gb",
    "kv_offloading_size",
    "skip_mm_profiling",
    "limit_mm_per_prompt",
    "language_model_only",
)


@dataclass(frozen=True)
class Resolved:
    values: Mapping[str, object] = field(default_factory=dict)
    origin: Mapping[str, str] = field(default_factory=dict)

    def get(self, key: str) -> object | None:
        return self.values.get(key)

    def int_(self, key: str) -> int | None:
        v = self.values.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    def float_(self, key: str) -> float | None:
        v = self.values.get(key)
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

    def str_(self, key: str) -> str | None:
        v = self.values.get(key)
        return v if isinstance(v, str) else None

    def bool_(self, key: str) -> bool | None:
        v = self.values.get(key)
        return v if isinstance(v, bool) else None


def resolve(
    *,
    cache_config: CacheConfig | None,
    max_model_len: int | None,
    version: str | None,
    served_model: str | None = None,
    cmdline: Mapping[str, object] | None,
    config: Mapping[str, object] | None,
) -> Resolved:
    """Merge the sources, most trusted first; a value is taken from the first that has it."""
    values: dict[str, object] = {}
    origin: dict[str, str] = {}

    def offer(key: str, value: object | None, source: str) -> None:
        if value is not None and key not in values:
            values[key] = value
            origin[key] = source

    if cache_config is not None:
        cc = cache_config
        offer("block_size", cc.block_size, FROM_CACHE_CONFIG)
        offer("kv_cache_dtype", cc.cache_dtype, FROM_CACHE_CONFIG)
        offer("gpu_memory_utilization", cc.gpu_memory_utilization, FROM_CACHE_CONFIG)
        offer("num_gpu_blocks_override", cc.num_gpu_blocks_override, FROM_CACHE_CONFIG)
        offer("enable_prefix_caching", cc.enable_prefix_caching, FROM_CACHE_CONFIG)
        offer("kv_cache_memory_bytes", cc.kv_cache_memory_bytes, FROM_CACHE_CONFIG)
        offer("kv_cache_memory_bytes", cc.cpu_kvcache_space_bytes, FROM_CACHE_CONFIG)
    offer("max_model_len", max_model_len, FROM_MODELS)
    offer("model", served_model, FROM_MODELS)
    offer("vllm_version", version, FROM_VERSION)
    for source, mapping in ((FROM_CMDLINE, cmdline), (FROM_CONFIG, config)):
        for key in FLAGS:
            if mapping is not None:
                offer(key, mapping.get(key), source)
    return Resolved(values, origin)


def gpu_for_plan(
    nvml_gpu: tuple[str, int] | None, configured: str | None, budget_given: bool
) -> tuple[Gpu | None, str]:
    """The GPU the expected budget is computed for, and why.

    NVML's (name, CUDA total) first; then ``deployment.gpu``; with no GPU known but a
    budget vLLM was given (``kv_cache_memory_bytes``, the CPU backend's only mode), the
    budget needs no GPU at all.
    """
    if nvml_gpu is not None:
        name, total = nvml_gpu
        try:
            family = lookup_gpu(name).family
        except InputError:
            family = "unknown"
        return Gpu(name, total, family, "NVML (total − reserved)"), "nvml"
    if configured:
        return lookup_gpu(configured), FROM_CONFIG
    if budget_given:
        return CPU, "none needed: vLLM was given its KV memory"
    return None, "unknown: NVML unavailable and deployment.gpu not set"


def plan_request(
    deployment: Resolved,
    *,
    arch: ModelArch,
    model_name: str,
    gpu: Gpu,
    weights_bytes: int | None,
    weights_source: str,
    load_draft: Callable[[str], ModelArch | None] | None = None,
) -> PlanRequest:
    """The expected deployment, as ``kv-headroom plan`` would size it.

    ``load_draft`` reads the config of a drafter named in ``--speculative-config``; by
    default ``read_local_draft``, which finds it only at a path this process can read.
    """
    version = deployment.str_("vllm_version") or DEFAULT_VERSION
    try:
        rel = release(version, "vllm_version")
    except InputError:
        rel = release(DEFAULT_VERSION)
    return PlanRequest(
        arch=arch,
        model_name=model_name,
        gpu=gpu,
        release=rel,
        gpu_memory_utilization=deployment.float_("gpu_memory_utilization"),
        tensor_parallel_size=deployment.int_("tensor_parallel_size") or 1,
        pipeline_parallel_size=deployment.int_("pipeline_parallel_size") or 1,
        kv_cache_dtype=deployment.str_("kv_cache_dtype") or "auto",
        block_size=deployment.int_("block_size"),
        max_model_len=deployment.int_("max_model_len"),
        max_num_seqs=deployment.int_("max_num_seqs"),
        max_num_batched_tokens=deployment.int_("max_num_batched_tokens"),
        kv_cache_memory_bytes=deployment.int_("kv_cache_memory_bytes"),
        num_gpu_blocks_override=deployment.int_("num_gpu_blocks_override"),
        enforce_eager=bool(deployment.bool_("enforce_eager")),
        quantization=deployment.str_("quantization"),
        weights_bytes=deployment.int_("weights_bytes") or weights_bytes,
        weights_source=weights_source,
        **deployment_flags(
            deployment.values, arch, read_local_draft if load_draft is None else load_draft
        ),
    )


def read_local_draft(model: str) -> ModelArch | None:
    """A drafter's architecture from its ``config.json`` at ``model`` (a directory or the
    file), or None where no such file is readable: an id on the Hub is not fetched from
    inside the sidecar. The one file this module reads."""
    path = Path(model).expanduser()
    config_path = path / "config.json" if path.is_dir() else path
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
        return parse_config(config, str(config_path))
    except (OSError, ValueError, InputError):
        return None
