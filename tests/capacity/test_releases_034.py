"""vLLM 0.34.0's sizing rules: the cache sized after warmup, blocks of 64 tokens."""

from __future__ import annotations

from dataclasses import replace

from exporter.capacity.gpus import GIB, lookup_gpu
from exporter.capacity.memory import requested_memory
from exporter.capacity.plan import CUDA_CONTEXT_BYTES, plan
from exporter.capacity.releases import release
from tests.capacity.test_releases_033 import request

LLAMA = "meta-llama__Llama-3.1-8B-Instruct"


def test_the_cache_is_what_the_device_leaves_after_warmup_less_the_margin() -> None:
    # extensible_kv_cache.py::measure_kv_cache_bytes with the utilization unset (1.0): all
    # of the device but the CUDA context and max(1 GiB, 0.75 x the transient peak), less
    # what the engine holds and the transient peak itself.
    p = plan(request(LLAMA, "H100", "0.34.0"))
    t = p.tightest
    assert p.utilization == 1.0
    margin = max(GIB, int(0.75 * t.activation))
    total = lookup_gpu("H100").total_bytes
    assert p.kv_budget_bytes == total - CUDA_CONTEXT_BYTES - margin - t.non_kv


def test_a_utilization_below_what_the_device_leaves_still_caps_the_cache() -> None:
    p = plan(request(LLAMA, "H100", "0.34.0", gpu_memory_utilization=0.9))
    t = p.tightest
    assert p.kv_budget_bytes == t.requested - t.non_kv
    assert t.requested == requested_memory(lookup_gpu("H100").total_bytes, 0.9, release("0.34.0"))


def test_without_the_extensible_cache_034_sizes_as_033_at_092() -> None:
    off = plan(request(LLAMA, "H100", "0.34.0", extensible_kv_cache=False))
    assert off.utilization == 0.92
    assert off.kv_budget_bytes == off.tightest.requested - off.tightest.non_kv
    # A set KV size or block count leaves vLLM nothing to measure: not extensible either.
    fixed = plan(request(LLAMA, "H100", "0.34.0", num_gpu_blocks_override=1000))
    assert fixed.utilization == 0.92


def test_blocks_are_64_tokens_by_default_from_034() -> None:
    assert plan(request(LLAMA, "H100", "0.34.0")).block_size == 64
    assert plan(request(LLAMA, "H100", "0.33.0")).block_size == 16
    # ROCm's dense attention prefers 16; CUTLASS MLA on Blackwell keeps 128.
    assert plan(request(LLAMA, "MI300X", "0.34.0")).block_size == 16
    mla = request("deepseek-ai__DeepSeek-V2-Lite", "B200", "0.34.0")
    assert plan(mla).block_size == 128
    assert plan(replace(mla, gpu=lookup_gpu("H100"))).block_size == 64


def test_034_holds_about_what_a_public_l40s_measurement_says_more_than_031() -> None:
    # gpu-fit v1.2.0's release notes (github.com/KiranTallapragada/gpu-fit, tag v1.2.0,
    # 2026-11-29), measured on one L40S: "vLLM 0.34 holds 8.7% (Qwen3-8B) to 16.7%
    # (Qwen3-14B) more KV tokens than 0.31". Second-hand figures (no logs), so a loose bound.
    for model, more in (("Qwen__Qwen3-8B", 0.087), ("Qwen__Qwen3-14B", 0.167)):
        old = plan(request(model, "L40S", "0.31.0")).cap.capacity_tokens
        new = plan(request(model, "L40S", "0.34.0")).cap.capacity_tokens
        assert abs(new / old - 1 - more) < 0.03, (model, new / old - 1)
