"""vLLM's ``cache_config_info`` label set, typed once (``CacheConfig``), low in the package
so that the page parser that reads it and ``deployment`` that merges it import it without
importing each other. Pure."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MAX_VALUE", "CacheConfig", "label_value"]

# Counts past 2**53 lose integer precision in a float and no real server reaches them: the
# bound on every count read from vLLM, a sample on the page or a cache_config label.
MAX_VALUE = float(1 << 53)


def label_value(text: str | None, kind: type) -> Any:
    """A ``cache_config_info`` label (``str()`` of a Python value) as a typed value, or
    None when it is unset (``None``) or not a value of that kind."""
    if text is None or text in ("None", "", "null"):
        return None
    try:
        if kind is bool:
            return {"True": True, "False": False}.get(text)
        if kind is int:
            number = float(text)  # "128" or "128.0"; a fraction is no count of anything
            return int(number) if number.is_integer() and abs(number) <= MAX_VALUE else None
        if kind is float:
            number = float(text)
            return number if math.isfinite(number) else None
    # OverflowError: "inf" or "1e400" read as a whole number.
    except (ValueError, OverflowError):
        return None
    return text


@dataclass(frozen=True)
class CacheConfig(Mapping[str, str]):
    """vLLM's ``cache_config_info``, typed once, here. Every figure the sidecar computes
    with is a field; the raw labels stay readable as a mapping (``cc["block_size"]``), for
    display and for checks that quote what vLLM wrote."""

    labels: Mapping[str, str] = field(default_factory=dict)
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    num_gpu_blocks_override: int | None = None
    kv_cache_size_tokens: int | None = None  # vLLM's own token count (0.24+)
    kv_cache_memory_bytes: int | None = None  # the memory vLLM was given (--kv-cache-memory)
    cpu_kvcache_space_bytes: int | None = None  # the same on the V1 CPU backend 0.9.2-0.19
    cache_dtype: str | None = None
    gpu_memory_utilization: float | None = None
    enable_prefix_caching: bool | None = None
    # 0.34+: vLLM sizes the cache after warmup (vllm/config/cache.py, resolved at start-up
    # by config/vllm.py::_resolve_extensible_kv_cache; the label says True or False).
    enable_extensible_kv_cache: bool | None = None
    # A hybrid Mamba model's state dtypes as vLLM resolved them (the SSM one from the
    # checkpoint for Qwen3.5 and Nemotron-H: plan._state_dtypes); None for "auto", which
    # every model's page states and the plan assumes.
    mamba_cache_dtype: str | None = None
    mamba_ssm_cache_dtype: str | None = None

    @classmethod
    def from_labels(cls, labels: Mapping[str, str]) -> CacheConfig:
        return cls(
            labels=labels,
            block_size=label_value(labels.get("block_size"), int),
            num_gpu_blocks=label_value(labels.get("num_gpu_blocks"), int),
            num_gpu_blocks_override=label_value(labels.get("num_gpu_blocks_override"), int),
            kv_cache_size_tokens=label_value(labels.get("kv_cache_size_tokens"), int),
            kv_cache_memory_bytes=label_value(labels.get("kv_cache_memory_bytes"), int),
            cpu_kvcache_space_bytes=label_value(labels.get("cpu_kvcache_space_bytes"), int),
            cache_dtype=label_value(labels.get("cache_dtype"), str),
            gpu_memory_utilization=label_value(labels.get("gpu_memory_utilization"), float),
            enable_prefix_caching=label_value(labels.get("enable_prefix_caching"), bool),
            enable_extensible_kv_cache=label_value(labels.get("enable_extensible_kv_cache"), bool),
            mamba_cache_dtype=_unless_auto(label_value(labels.get("mamba_cache_dtype"), str)),
            mamba_ssm_cache_dtype=_unless_auto(
                label_value(labels.get("mamba_ssm_cache_dtype"), str)
            ),
        )

    def __getitem__(self, key: str) -> str:
        return self.labels[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.labels)

    def __len__(self) -> int:
        return len(self.labels)


def _unless_auto(value: str | None) -> str | None:
    return None if value == "auto" else value
