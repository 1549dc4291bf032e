"""The config-only weight estimate follows each checkpoint's quantization."""

from __future__ import annotations

import json
from typing import Any

import pytest

from exporter.capacity.arch import parse_config, with_hf_quant_config
from exporter.capacity.kvcache import kv_dtype_bytes
from exporter.capacity.weights import count_params, estimate_weights_bytes, weight_bytes
from exporter.errors import InputError
from tests.conftest import FIXTURES, fixture_config


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


def test_a_token_passes_through_an_moes_active_experts_only() -> None:
    # Qwen3-30B-A3B: "A3B", about 3.3 billion parameters active per token.
    params = count_params(parse_config(fixture_config("Qwen__Qwen3-30B-A3B"), "model"))
    assert params is not None
    assert abs(params.active / 3.3e9 - 1) < 0.05


def test_a_dense_models_active_parameters_are_all_of_them() -> None:
    params = count_params(parse_config(LLAMA, "model"))
    assert params is not None
    assert params.active == params.total


def test_mla_counts_the_low_rank_projections() -> None:
    # DeepSeek-V3's FP8 checkpoint: 671B parameters, about 1 byte each (bf16 embeddings).
    assert abs(estimate(fixture_config("deepseek-ai__DeepSeek-V3")) / 671e9 - 1) < 0.03


def test_a_vision_tower_adds_its_parameters() -> None:
    vl = fixture_config("Qwen__Qwen2.5-VL-7B-Instruct")
    text_only = {k: v for k, v in vl.items() if k != "vision_config"}
    assert 0.5e9 < (estimate(vl) - estimate(text_only)) / 2 < 0.8e9


# nvidia/Llama-3.1-70B-Instruct-FP8 (ModelOpt 0.23): the quantization lives in
# hf_quant_config.json, with no quant_method; vLLM names it from quant_algo.
MODELOPT_FP8 = fixture_config("nvidia__Llama-3.1-70B-Instruct-FP8")
HF_QUANT = json.loads(
    (
        FIXTURES / "models" / "nvidia__Llama-3.1-70B-Instruct-FP8" / "hf_quant_config.json"
    ).read_text()
)


def test_modelopt_hf_quant_config_is_fp8_weights_and_an_fp8_kv_cache() -> None:
    arch = parse_config(with_hf_quant_config(MODELOPT_FP8, HF_QUANT), "model")
    assert arch.quantization is not None
    assert arch.quantization.method == "modelopt"
    assert arch.quantization.weight_bits == 8
    assert arch.quantization.kv_cache_bits == 8  # kv_cache_quant_algo FP8, read with auto
    assert kv_dtype_bytes("auto", arch.dtype, arch) == 1
    bf16 = parse_config(MODELOPT_FP8, "model")
    assert bf16.quantization is None  # config.json alone says nothing of FP8


def test_a_config_quantization_config_wins_over_hf_quant_config() -> None:
    awq = {**LLAMA, "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}}
    assert with_hf_quant_config(awq, HF_QUANT)["quantization_config"]["quant_method"] == "awq"


def test_modelopt_nvfp4_and_unknown_algorithms() -> None:
    nvfp4 = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4"}}
    arch = parse_config(with_hf_quant_config(LLAMA, nvfp4), "model")
    assert arch.quantization is not None
    assert arch.quantization.method == "modelopt_fp4"
    assert arch.quantization.weight_bits == 4.5
    assert arch.quantization.kv_cache_bits is None
    odd = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "W4A8_AWQ"}}
    with pytest.raises(InputError, match="quant_algo"):
        parse_config(with_hf_quant_config(LLAMA, odd), "model")


def test_weights_bytes_is_the_model_loading_took_figure_as_printed() -> None:
    # Llama-3.1-8B on an A100 under 0.31 printed "Model loading took 15.0 GiB memory"
    # (tests/fixtures/sizing, row 33). vLLM measures that figure around the model's
    # construction and load on each worker, so its rotary table and its TP split are in it:
    # plan subtracts it as given, at TP1 and at TP2 alike.
    from exporter.capacity.gpus import GIB
    from exporter.capacity.plan import plan
    from exporter.cli import build_parser
    from exporter.plan.cli import build_request

    def weights(*flags: str) -> int:
        model = ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "A100-SXM4-80GB"]
        release = ["--vllm-version", "0.31.0", "--weights-bytes", "15GiB"]
        args = build_parser().parse_args(["plan", *model, *release, *flags])
        return plan(build_request(args)).stages[0].weights

    assert weights() == 15 * GIB
    assert weights("--tensor-parallel-size", "2") == 15 * GIB
