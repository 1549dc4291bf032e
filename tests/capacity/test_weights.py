"""The config-only weight estimate follows each checkpoint's quantization."""

from __future__ import annotations

from typing import Any

from exporter.capacity.arch import parse_config
from exporter.capacity.weights import count_params, estimate_weights_bytes, weight_bytes
from tests.conftest import fixture_config


def estimate(config: dict[str, Any]) -> int:
    arch = parse_config(config, "model")
    value = estimate_weights_bytes(arch, arch.dtype, None)
    assert value is not None
    return value


def linear_bytes(config: dict[str, Any]) -> int:
    """Bytes of the decoder layers alone (the embedding and LM head stay 16-bit)."""
    arch = parse_config(config, "model")
    params = count_params(arch)
    assert params is not None
    return sum(weight_bytes(arch, params, arch.dtype, None).layers)


LLAMA = fixture_config("meta-llama__Llama-3.1-8B-Instruct")


def test_w8a8_int8_halves_the_linear_weights() -> None:
    int8 = {
        **LLAMA,
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "config_groups": {"group_0": {"weights": {"num_bits": 8, "strategy": "channel"}}},
        },
    }
    assert abs(linear_bytes(int8) / linear_bytes(LLAMA) - 0.5) < 0.001


def test_awq_4_bit_counts_its_group_scales() -> None:
    awq = {**LLAMA, "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}}
    # 4 bits plus a 16-bit scale and a 4-bit zero per 128 weights, against 16 bits.
    expected = (4 + 20 / 128) / 16
    assert abs(linear_bytes(awq) / linear_bytes(LLAMA) - expected) < 0.001


def test_gptq_reads_its_bit_width() -> None:
    gptq = {**LLAMA, "quantization_config": {"quant_method": "gptq", "bits": 8, "group_size": 128}}
    assert abs(linear_bytes(gptq) / linear_bytes(LLAMA) - (8 + 24 / 128) / 16) < 0.001


def test_fp8_checkpoint_stores_one_byte_per_linear_weight() -> None:
    fp8 = fixture_config("Qwen__Qwen3-32B-FP8")
    bf16 = fixture_config("Qwen__Qwen3-32B")
    assert abs(linear_bytes(fp8) / linear_bytes(bf16) - 0.5) < 0.001


def test_experts_only_int4_keeps_attention_in_the_model_dtype() -> None:
    # Kimi-K2.5 ignores self_attn, shared experts and dense MLPs in its int4 scheme.
    kimi = fixture_config("moonshotai__Kimi-K2.5")
    arch = parse_config(kimi, "kimi")
    assert arch.quantization is not None
    assert arch.quantization.experts_only
    assert arch.quantization.weight_bits == 4 + 16 / 32


def test_moe_counts_every_expert() -> None:
    # Qwen3-30B-A3B: about 30.5 billion parameters, 2 bytes each.
    assert abs(estimate(fixture_config("Qwen__Qwen3-30B-A3B")) / 2 / 30.5e9 - 1) < 0.02


def test_mla_counts_the_low_rank_projections() -> None:
    # DeepSeek-V3's FP8 checkpoint: 671B parameters, about 1 byte each (bf16 embeddings).
    assert abs(estimate(fixture_config("deepseek-ai__DeepSeek-V3")) / 671e9 - 1) < 0.03


def test_a_vision_tower_adds_its_parameters() -> None:
    vl = fixture_config("Qwen__Qwen2.5-VL-7B-Instruct")
    text_only = {k: v for k, v in vl.items() if k != "vision_config"}
    assert 0.5e9 < (estimate(vl) - estimate(text_only)) / 2 < 0.8e9
