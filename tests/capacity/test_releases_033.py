"""vLLM 0.33.0's sizing rules: GB10 defaults, Octave KV, the 16-bit KV refusal, GDN blocks."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from exporter.capacity.arch import parse_config
from exporter.capacity.gpus import lookup_gpu
from exporter.capacity.kvcache import octave_slot_bytes
from exporter.capacity.plan import PlanRequest, default_batched_tokens, plan
from exporter.capacity.releases import release
from exporter.cli import main
from exporter.errors import InputError
from tests.conftest import fixture_config


def request(model: str, gpu: str, version: str, **changes: object) -> PlanRequest:
    base = PlanRequest(
        arch=parse_config(fixture_config(model), model),
        model_name=model,
        gpu=lookup_gpu(gpu),
        release=release(version),
        max_model_len=8192,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_gb10_gets_the_small_batch_defaults_from_033() -> None:
    gb10 = lookup_gpu("DGX Spark")
    assert default_batched_tokens(gb10, release("0.33.0"), 8192) == (2048, 256)


def test_gb10_had_the_large_gpu_defaults_before_033() -> None:
    gb10 = lookup_gpu("GB10")
    assert default_batched_tokens(gb10, release("0.32.0"), 8192) == (8192, 1024)


def test_explicit_fp16_kv_on_a_bf16_model_refuses_to_start_on_033(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(
        [
            "plan",
            "--model",
            "Qwen/Qwen3-8B",
            "--vllm-version",
            "0.33.0",
            "--kv-cache-dtype",
            "float16",
            "--max-model-len",
            "8192",
            "--no-what-if",
        ]
    )
    out = capsys.readouterr().out
    assert code == 1
    assert (
        'kv_cache_dtype="float16" is incompatible with dtype="bfloat16". '
        "Please set `--kv-cache-dtype` to `auto` or `bfloat16`." in out
    )


def test_explicit_kv_dtype_equal_to_the_model_dtype_still_starts_on_033() -> None:
    result = plan(request("Qwen__Qwen3-8B", "H100", "0.33.0", kv_cache_dtype="bfloat16"))
    assert result.startup_failure is None


def test_mismatched_16_bit_kv_dtype_was_accepted_before_033() -> None:
    result = plan(request("Qwen__Qwen3-8B", "H100", "0.32.0", kv_cache_dtype="fp16"))
    assert result.startup_failure is None


def test_octave_slots_match_the_rocm_octave_layout() -> None:
    # 256-dim heads, 64 RoPE dims: K 32 + 72 B, V 128 (k3v4) or 96 B, five fp16 scales.
    assert octave_slot_bytes("octave_k3v4", 256, 64) == 248
    assert octave_slot_bytes("octave_k3v3", 256, 64) == 216
    assert octave_slot_bytes("octave_k3v3_compact", 256, 64) == 196


def test_octave_kv_sizes_qwen35_on_mi300x() -> None:
    result = plan(request("Qwen__Qwen3.5-27B", "MI300X", "0.33.0", kv_cache_dtype="octave_k3v4"))
    # 16 full-attention layers × 4 KV heads × one 248-byte slot.
    assert result.kv_bytes_per_token == 16 * 4 * 248


def test_octave_kv_is_refused_on_a_cuda_gpu() -> None:
    with pytest.raises(InputError, match="ROCM_OCTAVE"):
        plan(request("Qwen__Qwen3.5-27B", "H100", "0.33.0", kv_cache_dtype="octave_k3v3"))


def test_octave_kv_is_refused_before_033() -> None:
    with pytest.raises(InputError, match=r"new in vLLM 0\.33"):
        plan(request("Qwen__Qwen3.5-27B", "MI300X", "0.32.0", kv_cache_dtype="octave_k3v3"))


def test_gdn_hybrid_blocks_are_multiples_of_64_with_prefix_caching_on_033() -> None:
    result = plan(request("Qwen__Qwen3.5-27B", "H100", "0.33.0"))
    assert result.block_size % 64 == 0
    mamba = [g for g in result.layout.groups if g.spec.kind.value == "mamba"]
    assert {g.spec.blocks_per_request(8192, 8192) for g in mamba} == {3}


def test_gdn_hybrid_blocks_keep_the_16_token_alignment_without_prefix_caching() -> None:
    result = plan(request("Qwen__Qwen3.5-27B", "H100", "0.33.0", enable_prefix_caching=False))
    aligned = plan(request("Qwen__Qwen3.5-27B", "H100", "0.33.0"))
    assert result.block_size % 16 == 0
    assert result.block_size <= aligned.block_size


def test_033_memory_changes_move_the_budget_in_their_direction() -> None:
    # Eager, so that the forward pass's cold torch.compile does not hide the sampler's peak.
    old = plan(request("Qwen__Qwen3-8B", "H100", "0.32.0", enforce_eager=True)).stages[0]
    new = plan(request("Qwen__Qwen3-8B", "H100", "0.33.0", enforce_eager=True)).stages[0]
    assert new.activation > old.activation  # the second sampler pass
    assert new.non_torch < old.non_torch  # cuBLAS handles now in the baseline


def test_033_plans_say_the_memory_changes_are_unmeasured() -> None:
    result = plan(request("Qwen__Qwen3-8B", "H100", "0.33.0"))
    assert any("modelled in direction only" in n for n in result.notes)


def test_gb10_is_listed_with_its_unified_memory_note(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "plan",
            "--model",
            "Qwen/Qwen3-8B",
            "--gpu",
            "GB10",
            "--vllm-version",
            "0.33.0",
            "--output",
            "json",
            "--no-what-if",
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    assert doc["max_num_batched_tokens"] == 2048
    assert any("shares its memory with the CPU" in n for n in doc["notes"])
