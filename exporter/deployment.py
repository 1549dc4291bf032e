"""Which flags the running vLLM was started with, and where each one was learnt: the one
typed ``Deployment``, resolved here and nowhere else.

In order of trust: vLLM's own ``cache_config_info`` labels, ``/v1/models`` and
``/version``; the vLLM command line (when the pod shares its process namespace); the
sidecar's ``deployment:`` config. Pure (every input is passed in) but for a drafter's
config.json, read where ``--speculative-config`` names a local path (``read_local_draft``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any, get_args, get_type_hints

from exporter.cache_config import CacheConfig
from exporter.capacity.arch import ModelArch, parse_config
from exporter.capacity.deploy_flags import deployment_flags
from exporter.capacity.gpus import CPU, Gpu, lookup_gpu
from exporter.capacity.plan import Context, PlanRequest
from exporter.capacity.releases import DEFAULT_VERSION, release
from exporter.errors import InputError
from exporter.recent import Recent

FROM_CACHE_CONFIG = "vllm cache_config_info"
FROM_MODELS = "vllm /v1/models"
FROM_VERSION = "vllm /version"
FROM_CMDLINE = "vllm command line"
FROM_CONFIG = "sidecar config"


@dataclass(frozen=True)
class Deployment:
    """The flags vLLM runs with; None = not known.

    One type for both ends: the sidecar's ``deployment:`` config is a ``Deployment`` (what
    it assumes where vLLM does not say), and ``resolve`` merges vLLM's own answers over it
    into another, with ``origin`` naming where each known value was learnt.
    """

    vllm_version: str | None = None
    model: str | None = None
    gpu: str | None = None
    max_model_len: int | None = None
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    data_parallel_size: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float | None = None
    kv_cache_dtype: str | None = None
    dtype: str | None = None
    quantization: str | None = None
    block_size: int | None = None
    enforce_eager: bool | None = None
    enable_prefix_caching: bool | None = None
    num_gpu_blocks_override: int | None = None
    kv_cache_memory_bytes: int | None = None
    weights_bytes: int | None = None
    # "installed" or "absent": FlashInfer in vLLM's environment, which no vLLM page or flag
    # says; before 0.11.1 it moves the profile run's sampler peak (memory.sampler_path).
    flashinfer: str | None = None
    # "v1" or "v2": VLLM_USE_V2_MODEL_RUNNER=0 or =1 in vLLM's environment (0.12+), which no
    # vLLM page or flag shows; vLLM reads it before its own choice (plan._v2_runner).
    model_runner: str | None = None
    # Flags that move the budget or the blocks (capacity/deploy_flags.py); the three JSON
    # flags as their JSON text.
    speculative_config: str | None = None
    enable_lora: bool | None = None
    max_loras: int | None = None
    max_lora_rank: int | None = None
    fully_sharded_loras: bool | None = None
    lora_dtype: str | None = None
    cpu_offload_gb: float | None = None
    kv_offloading_size: float | None = None
    skip_mm_profiling: bool | None = None
    limit_mm_per_prompt: str | None = None
    mm_processor_kwargs: str | None = None
    language_model_only: bool | None = None
    # 0.34's extensible KV cache (--[no-]enable-extensible-kv-cache; on by default on CUDA):
    # the cache is sized after warmup (plan.extensible_kv_cache).
    enable_extensible_kv_cache: bool | None = None
    # A hybrid Mamba model's recurrent state (--mamba-cache-dtype, --mamba-ssm-cache-dtype).
    mamba_cache_dtype: str | None = None
    mamba_ssm_cache_dtype: str | None = None
    # Where each known value came from; part of equality (a value vLLM now states is news
    # on the status page), not of the hash (a mapping has none).
    origin: Mapping[str, str] = field(
        default_factory=lambda: MappingProxyType({}), hash=False, repr=False
    )

    def items(self) -> tuple[tuple[str, object], ...]:
        """The known flags, in declaration order."""
        return tuple((k, v) for k in FLAGS if (v := getattr(self, k)) is not None)


FLAGS: tuple[str, ...] = tuple(f.name for f in fields(Deployment) if f.name != "origin")
# A flag's type, from its annotation (``X | None``): what a source offers must be one.
_KINDS: dict[str, type] = {
    key: next(t for t in get_args(hint) if t is not type(None))
    for key, hint in get_type_hints(Deployment).items()
    if key != "origin"
}


def _typed(key: str, value: object) -> object | None:
    """``value`` as the flag's type, or None where it is not one (a bool is no number)."""
    kind = _KINDS[key]
    if isinstance(value, bool):
        return value if kind is bool else None
    if kind is float and isinstance(value, int | float):
        return float(value)
    return value if isinstance(value, kind) else None


def resolve(
    *,
    cache_config: CacheConfig | None,
    max_model_len: int | None,
    version: str | None,
    served_model: str | None = None,
    cmdline: Mapping[str, object] | None,
    config: Deployment | None,
) -> Deployment:
    """Merge the sources, most trusted first; a value is taken from the first that has it
    (``cmdline`` maps flag names to values, as ``sources.cmdline`` parses them)."""
    values: dict[str, object] = {}
    origin: dict[str, str] = {}

    def offer(key: str, value: object | None, source: str) -> None:
        if value is not None and key not in values and (typed := _typed(key, value)) is not None:
            values[key] = typed
            origin[key] = source

    if cache_config is not None:
        cc = cache_config
        offer("block_size", cc.block_size, FROM_CACHE_CONFIG)
        offer("kv_cache_dtype", cc.cache_dtype, FROM_CACHE_CONFIG)
        offer("gpu_memory_utilization", cc.gpu_memory_utilization, FROM_CACHE_CONFIG)
        offer("num_gpu_blocks_override", cc.num_gpu_blocks_override, FROM_CACHE_CONFIG)
        offer("enable_prefix_caching", cc.enable_prefix_caching, FROM_CACHE_CONFIG)
        offer("enable_extensible_kv_cache", cc.enable_extensible_kv_cache, FROM_CACHE_CONFIG)
        offer("mamba_cache_dtype", cc.mamba_cache_dtype, FROM_CACHE_CONFIG)
        offer("mamba_ssm_cache_dtype", cc.mamba_ssm_cache_dtype, FROM_CACHE_CONFIG)
        offer("kv_cache_memory_bytes", cc.kv_cache_memory_bytes, FROM_CACHE_CONFIG)
        offer("kv_cache_memory_bytes", cc.cpu_kvcache_space_bytes, FROM_CACHE_CONFIG)
    offer("max_model_len", max_model_len, FROM_MODELS)
    offer("model", served_model, FROM_MODELS)
    offer("vllm_version", version, FROM_VERSION)
    if cmdline is not None:
        for key in FLAGS:
            offer(key, cmdline.get(key), FROM_CMDLINE)
    if config is not None:
        for key, value in config.items():
            offer(key, value, FROM_CONFIG)
    # Each value is of its field's type (``_typed``), which mypy cannot see through **.
    return Deployment(**values, origin=MappingProxyType(origin))  # type: ignore[arg-type]


_RESOLVED: Recent[Deployment] = Recent()


def resolved(
    *,
    cache_config: CacheConfig | None,
    max_model_len: int | None,
    version: str | None,
    served_model: str | None,
    cmdline: Mapping[str, object] | None,
    cmdline_model: str | None,
    config: Deployment,
) -> Deployment:
    """``resolve`` for one poll: the same object while every input is the same (the poll
    loop's, each poll), so what hangs off the deployment is worked out once. The command
    line's model is its positional tag where no ``--model`` flag named it."""
    key = (cache_config, max_model_len, version, served_model, cmdline, cmdline_model, config)

    def make() -> Deployment:
        flags = dict(cmdline or {})
        if cmdline_model and "model" not in flags:
            flags["model"] = cmdline_model
        return resolve(
            cache_config=cache_config,
            max_model_len=max_model_len,
            version=version,
            served_model=served_model,
            cmdline=flags,
            config=config,
        )

    return _RESOLVED.get(key, make)


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
    deployment: Deployment,
    *,
    arch: ModelArch,
    model_name: str,
    gpu: Gpu,
    weights_bytes: int | None,
    weights_source: str,
    load_draft: Callable[[str], ModelArch | None] | None = None,
    flag_fields: Mapping[str, Any] | None = None,
    available_kv_bytes: int | None = None,
    contexts: tuple[Context, ...] = (),
    async_scheduling: bool = True,
    hybrid_kv_cache_manager: bool = True,
) -> PlanRequest:
    """The deployment as ``kv-headroom plan`` sizes it: vLLM's flags mapped onto a
    ``PlanRequest`` once, for the sidecar's expected plan and for ``plan`` itself.

    ``load_draft`` reads the config of a drafter named in ``--speculative-config``; by
    default ``read_local_draft``, which finds it only at a path this process can read.
    ``flag_fields`` are the deploy flags' fields already worked out (``plan``'s, which
    refuses a flag vLLM would refuse and reads a drafter from anywhere); by default
    ``deployment_flags`` of the deployment's own flags. The rest are ``plan``'s inputs
    the sidecar does not learn; it plans with ``PlanRequest``'s defaults for them.
    """
    version = deployment.vllm_version or DEFAULT_VERSION
    try:
        rel = release(version, "vllm_version")
    except InputError:
        rel = release(DEFAULT_VERSION)
    return PlanRequest(
        arch=arch,
        model_name=model_name,
        gpu=gpu,
        release=rel,
        gpu_memory_utilization=deployment.gpu_memory_utilization,
        tensor_parallel_size=deployment.tensor_parallel_size or 1,
        pipeline_parallel_size=deployment.pipeline_parallel_size or 1,
        kv_cache_dtype=deployment.kv_cache_dtype or "auto",
        block_size=deployment.block_size,
        max_model_len=deployment.max_model_len,
        max_num_seqs=deployment.max_num_seqs,
        max_num_batched_tokens=deployment.max_num_batched_tokens,
        kv_cache_memory_bytes=deployment.kv_cache_memory_bytes,
        num_gpu_blocks_override=deployment.num_gpu_blocks_override,
        enforce_eager=bool(deployment.enforce_eager),
        quantization=deployment.quantization,
        weights_bytes=deployment.weights_bytes or weights_bytes,
        weights_source=weights_source,
        flashinfer_installed=None
        if deployment.flashinfer is None
        else deployment.flashinfer == "installed",
        model_runner="v1"
        if deployment.model_runner == "v1"
        else "v2"
        if deployment.model_runner == "v2"
        else None,
        available_kv_bytes=available_kv_bytes,
        contexts=contexts,
        async_scheduling=async_scheduling,
        hybrid_kv_cache_manager=hybrid_kv_cache_manager,
        extensible_kv_cache=deployment.enable_extensible_kv_cache,
        enable_prefix_caching=deployment.enable_prefix_caching,
        mamba_cache_dtype=deployment.mamba_cache_dtype or "auto",
        mamba_ssm_cache_dtype=deployment.mamba_ssm_cache_dtype or "auto",
        **(
            deployment_flags(
                dict(deployment.items()),
                arch,
                read_local_draft if load_draft is None else load_draft,
            )
            if flag_fields is None
            else flag_fields
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
