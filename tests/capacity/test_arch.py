"""The config parser gives each layer the KV spec vLLM gives it."""

from __future__ import annotations

import pytest

from exporter.capacity.arch import AttentionKind, LayerKind, parse_config
from exporter.errors import InputError
from exporter.sources.model_dir import load_catalogue
from tests.conftest import fixture_config


def catalogue_config(name: str) -> dict[str, object]:
    return dict(next(m for m in load_catalogue() if m.name == name).config)


def kinds(arch_layers: tuple[object, ...]) -> list[str]:
    return [layer.kind.value for layer in arch_layers]  # type: ignore[attr-defined]


def test_llama_head_dim_falls_back_to_hidden_over_heads() -> None:
    arch = parse_config(fixture_config("meta-llama__Llama-3.1-8B-Instruct"), "llama")
    assert {layer.head_size for layer in arch.layers} == {128}
    assert {layer.num_kv_heads for layer in arch.layers} == {8}
    assert arch.attention_kind is AttentionKind.GQA


def test_null_head_dim_is_treated_as_absent() -> None:
    cfg = {**fixture_config("meta-llama__Llama-3.1-8B-Instruct"), "head_dim": None}
    assert parse_config(cfg, "x").layers[0].head_size == 128


def test_llama_3_1_8b_costs_128_kib_per_token_in_16_bit() -> None:
    arch = parse_config(fixture_config("meta-llama__Llama-3.1-8B-Instruct"), "llama")
    assert sum(layer.bytes_per_token(1, 2) for layer in arch.layers) == 131_072


def test_qwen2_sliding_window_is_off_unless_use_sliding_window() -> None:
    arch = parse_config(fixture_config("Qwen__Qwen2.5-7B-Instruct"), "qwen")
    assert set(kinds(arch.layers)) == {"full"}


def test_qwen2_use_sliding_window_slides_layers_from_max_window_layers() -> None:
    cfg = {
        **fixture_config("Qwen__Qwen2.5-7B-Instruct"),
        "use_sliding_window": True,
        "sliding_window": 4096,
        "max_window_layers": 20,
    }
    layers = parse_config(cfg, "qwen").layers
    assert kinds(layers) == ["full"] * 20 + ["sliding"] * 8


def test_gemma3_pattern_gives_52_sliding_and_10_full_layers() -> None:
    arch = parse_config(catalogue_config("google/gemma-3-27b-it"), "gemma3")
    assert kinds(arch.layers).count("sliding") == 52
    assert kinds(arch.layers).count("full") == 10
    assert kinds(arch.layers)[5] == "full"  # layer i is full when (i + 1) % 6 == 0
    assert arch.attention_kind is AttentionKind.HYBRID_SLIDING


def test_gemma3_text_config_is_read_from_a_multimodal_config() -> None:
    arch = parse_config(catalogue_config("google/gemma-3-27b-it"), "gemma3")
    assert arch.num_layers == 62
    assert {layer.window for layer in arch.layers if layer.kind is LayerKind.SLIDING} == {1024}


def test_gemma2_alternates_starting_with_sliding() -> None:
    arch = parse_config(catalogue_config("google/gemma-2-9b-it"), "gemma2")
    assert kinds(arch.layers)[:4] == ["sliding", "full", "sliding", "full"]


def test_llama4_rope_layers_are_chunked_and_every_fourth_is_full() -> None:
    arch = parse_config(catalogue_config("meta-llama/Llama-4-Scout-17B-16E-Instruct"), "l4")
    assert kinds(arch.layers).count("chunked") == 36
    assert kinds(arch.layers)[3] == "full"
    assert arch.attention_kind is AttentionKind.CHUNKED


def test_a_global_sliding_window_without_layer_types_slides_every_layer() -> None:
    arch = parse_config(catalogue_config("microsoft/Phi-3-mini-4k-instruct"), "phi3")
    assert set(kinds(arch.layers)) == {"sliding"}
    assert arch.layers[0].window == 2047
    assert arch.layers[0].head_size == 96


def test_deepseek_mla_caches_one_latent_of_576_per_layer() -> None:
    arch = parse_config(catalogue_config("deepseek-ai/DeepSeek-V2-Lite"), "dsv2")
    assert arch.attention_kind is AttentionKind.MLA
    assert sum(layer.bytes_per_token(1, 2) for layer in arch.layers) == 27 * 576 * 2


def test_mla_cache_is_not_sharded_by_tensor_parallelism() -> None:
    arch = parse_config(catalogue_config("deepseek-ai/DeepSeek-V2-Lite"), "dsv2")
    assert arch.layers[0].bytes_per_token(8, 2) == arch.layers[0].bytes_per_token(1, 2)


def test_kimi_vl_mla_ratio_matches_vllm_log() -> None:
    # vLLM's MLA spec caches one latent of kv_lora_rank + qk_rope_head_dim per layer, read
    # from Kimi-VL's text_config: 27 × (512 + 64) × 2 B = 31,104 B a token.
    cfg = {
        "model_type": "kimi_vl",
        "text_config": {
            "model_type": "deepseek_v3",
            "num_hidden_layers": 27,
            "kv_lora_rank": 512,
            "qk_rope_head_dim": 64,
            "torch_dtype": "bfloat16",
        },
    }
    arch = parse_config(cfg, "kimi")
    assert sum(layer.bytes_per_token(1, 2) for layer in arch.layers) == 31_104


def test_kv_heads_are_replicated_when_tp_exceeds_them() -> None:
    # Qwen3-Coder-30B-A3B (4 KV heads) at TP8: 1 head per GPU = 24,576 B/token (vLLM #22177).
    arch = parse_config(catalogue_config("Qwen/Qwen3-30B-A3B"), "qwen3moe")
    assert sum(layer.bytes_per_token(8, 2) for layer in arch.layers) == 24_576


def test_falcon_multi_query_keeps_one_kv_head() -> None:
    cfg = {
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "hidden_size": 512,
        "multi_query": True,
    }
    arch = parse_config(cfg, "falcon")
    assert arch.layers[0].num_kv_heads == 1
    assert arch.attention_kind is AttentionKind.MQA


def test_multi_head_attention_defaults_kv_heads_to_attention_heads() -> None:
    arch = parse_config(catalogue_config("meta-llama/Llama-2-7b-hf"), "llama2")
    assert arch.attention_kind is AttentionKind.MHA


# A four-layer Nemotron-H: three Mamba2 layers and one attention layer.
NEMOTRON_H = {
    "architectures": ["NemotronHForCausalLM"],
    "model_type": "nemotron_h",
    "num_hidden_layers": 4,
    "hybrid_override_pattern": "MM*M",
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_size": 4096,
    "mamba_num_heads": 128,
    "mamba_head_dim": 64,
    "ssm_state_size": 128,
    "n_groups": 8,
    "conv_kernel": 4,
}


def test_nemotron_h_pattern_is_hybrid_mamba_and_flagged_approximate() -> None:
    cfg = {**NEMOTRON_H, "num_hidden_layers": 8, "hybrid_override_pattern": "M-M*M-M*"}
    arch = parse_config(cfg, "nemotron")
    assert kinds(arch.layers) == ["mamba", "mamba", "full", "mamba", "mamba", "full"]
    assert arch.attention_kind is AttentionKind.HYBRID_MAMBA
    assert arch.approximate


def test_qwen3_next_interval_makes_every_fourth_layer_attention() -> None:
    cfg = {
        "model_type": "qwen3_next",
        "num_hidden_layers": 8,
        "full_attention_interval": 4,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "hidden_size": 2048,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
    }
    arch = parse_config(cfg, "qwen3next")
    assert kinds(arch.layers) == ["mamba"] * 3 + ["full"] + ["mamba"] * 3 + ["full"]
    state = arch.layers[0].state
    assert state is not None
    assert state.ssm_elems == 32 * 128 * 128


def test_float32_config_is_served_in_bfloat16_by_default() -> None:
    cfg = {**fixture_config("meta-llama__Llama-3.1-8B-Instruct"), "torch_dtype": "float32"}
    assert parse_config(cfg, "x").dtype == "bfloat16"
    assert parse_config(cfg, "x", dtype="float32").dtype == "float32"


def test_yarn_rope_scaling_extends_the_context() -> None:
    cfg = {
        **fixture_config("Qwen__Qwen2.5-7B-Instruct"),
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    }
    assert parse_config(cfg, "x").max_model_len == 131072


def test_llama3_rope_type_keeps_max_position_embeddings() -> None:
    arch = parse_config(fixture_config("meta-llama__Llama-3.1-8B-Instruct"), "llama")
    assert arch.max_model_len == 131072


def test_missing_layer_count_names_the_key() -> None:
    with pytest.raises(InputError) as e:
        parse_config({"num_attention_heads": 8, "hidden_size": 512}, "cfg.json")
    assert "cfg.json: num_hidden_layers" in str(e.value)


def test_missing_key_in_text_config_names_the_nested_key() -> None:
    with pytest.raises(InputError) as e:
        parse_config({"text_config": {"num_attention_heads": 8}}, "mm.json")
    assert "text_config.num_hidden_layers" in str(e.value)


def test_more_kv_heads_than_attention_heads_is_a_contradiction() -> None:
    cfg = {"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 16}
    with pytest.raises(InputError, match="num_key_value_heads = 16"):
        parse_config({**cfg, "hidden_size": 512}, "c.json")


def test_layer_types_must_have_one_entry_per_layer() -> None:
    cfg = {"num_hidden_layers": 3, "num_attention_heads": 8, "hidden_size": 512}
    with pytest.raises(InputError, match="one entry per layer"):
        parse_config({**cfg, "layer_types": ["full_attention"]}, "c.json")


def test_unknown_layer_type_is_rejected_not_sized_as_full() -> None:
    cfg = {"num_hidden_layers": 1, "num_attention_heads": 8, "hidden_size": 512}
    with pytest.raises(InputError, match=r"layer_types\[0\] = 'mystery'"):
        parse_config({**cfg, "layer_types": ["mystery"]}, "c.json")


def test_non_integer_layer_count_is_rejected() -> None:
    with pytest.raises(InputError, match="must be an integer"):
        parse_config({"num_hidden_layers": "32", "num_attention_heads": 8}, "c.json")
