"""Groups, blocks, the printed lines and the start-up check, as vLLM computes them."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from exporter.capacity.arch import parse_config
from exporter.capacity.kvcache import (
    build_layout,
    capacity,
    pp_partition,
    sequences_that_fit,
    startup_check,
)
from exporter.capacity.releases import TokenLine, release
from tests.capacity.test_arch import NEMOTRON_H, catalogue_config

GIB = 1 << 30
TINY = {"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32}


def layout_of(cfg: Mapping[str, object], version: str = "0.32.0", **kw: int):  # type: ignore[no-untyped-def]
    arch = parse_config(cfg, "cfg")
    opts = {"block_size": 16, "tp": 1, "pp": 1, "dtype_bytes": 2, **kw}
    return build_layout(arch, release=release(version), **opts)[0]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("layers", "pp", "sizes"),
    [(32, 2, [16, 16]), (80, 3, [27, 27, 26]), (62, 4, [15, 16, 16, 15]), (10, 4, [2, 3, 3, 2])],
)
def test_pp_partition_puts_remainder_layers_before_the_last_stage(
    layers: int, pp: int, sizes: list[int]
) -> None:
    assert [len(r) for r in pp_partition(layers, pp)] == sizes


def test_gemma3_27b_forms_seven_groups_with_eight_padding_layers() -> None:
    layout = layout_of(catalogue_config("google/gemma-3-27b-it"))
    assert layout.num_groups == 7
    assert layout.padding_layers == 8
    assert layout.stage_bytes_per_block(0) == 10 * 131_072


def test_gemma3_27b_token_line_before_0_21_divides_blocks_by_groups() -> None:
    # The real log: 15,997 blocks × 7 groups printed as 36,560 tokens.
    layout = layout_of(catalogue_config("google/gemma-3-27b-it"), "0.19.0")
    per_block = layout.stage_bytes_per_block(0)
    cap = capacity(
        layout,
        [15_997 * per_block],
        release=release("0.19.0"),
        max_model_len=131072,
        in_flight_tokens=8192,
        num_gpu_blocks_override=None,
    )
    assert cap.num_blocks == 15_997
    assert cap.token_line is TokenLine.PER_GROUP
    assert cap.capacity_tokens == 36_560


def test_llama4_scout_forms_four_groups() -> None:
    layout = layout_of(catalogue_config("meta-llama/Llama-4-Scout-17B-16E-Instruct"))
    assert layout.num_groups == 4


def test_equal_halves_form_two_groups() -> None:
    layout = layout_of(catalogue_config("openai/gpt-oss-20b"))
    assert layout.num_groups == 2
    assert layout.padding_layers == 0


def test_sliding_window_request_is_capped_at_window_plus_batch() -> None:
    layout = layout_of(catalogue_config("microsoft/Phi-3-mini-4k-instruct"))
    # cdiv(min(2047 - 1 + 2048, 4096), 16) + 1
    assert layout.blocks_per_request(4096, 2048) == 257


def test_old_releases_size_sliding_layers_as_full() -> None:
    layout = layout_of(catalogue_config("google/gemma-3-27b-it"), "0.8.5")
    assert layout.num_groups == 1
    assert layout.blocks_per_request(8192, 8192) == 512


def test_hybrid_mamba_raises_attention_block_to_cover_the_state_page() -> None:
    arch = parse_config(NEMOTRON_H, "nemotron")
    _, block = build_layout(
        arch, release=release("0.32.0"), block_size=16, tp=1, pp=1, dtype_bytes=2
    )
    attention_page = block * 8 * 256 * 2
    mamba_state = (3 * (128 * 64 + 2 * 8 * 128) + 128 * 64 * 128) * 2
    assert attention_page >= mamba_state
    assert block % 16 == 0
    assert (block - 16) * 8 * 256 * 2 < mamba_state


def test_block_pool_reserves_one_null_block() -> None:
    cfg = {
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 32,
    }
    layout = layout_of(cfg, block_size=128)
    assert sequences_that_fit(layout, 48, 2048, 2048) == 2
    assert sequences_that_fit(layout, 49, 2048, 2048) == 3


def test_startup_check_estimates_the_longest_context_that_fits() -> None:
    # Real case (vLLM recipes PR #12): 253,952 B/token, 262,144 tokens need 62.00 GiB.
    cfg = {
        "num_hidden_layers": 62,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 262144,
    }
    layout = layout_of(cfg, "0.10.0")
    failure = startup_check(
        layout,
        0,
        round(48.66 * GIB),
        release=release("0.10.0"),
        max_model_len=262144,
        in_flight_tokens=8192,
    )
    assert failure is not None
    assert failure.estimated_max_model_len == 205_728
    assert "(62.00 GiB KV cache is needed" in failure.message


def test_startup_check_passes_when_one_request_fits() -> None:
    cfg = {
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 32,
    }
    layout = layout_of(cfg, block_size=128)
    ok = startup_check(
        layout, 0, GIB, release=release("0.32.0"), max_model_len=2048, in_flight_tokens=2048
    )
    assert ok is None


def test_no_memory_at_all_is_vllms_first_startup_error() -> None:
    cfg = {
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 32,
    }
    failure = startup_check(
        layout_of(cfg), 0, -5, release=release("0.32.0"), max_model_len=2048, in_flight_tokens=1
    )
    assert failure is not None
    assert failure.message.startswith("No available memory for the cache blocks")


def test_v0_concurrency_is_tokens_over_length_unrounded() -> None:
    cfg = {
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 32,
    }
    layout = layout_of(cfg, "0.6.3")
    cap = capacity(
        layout,
        [100 * layout.stage_bytes_per_block(0)],
        release=release("0.6.3"),
        max_model_len=1000,
        in_flight_tokens=1,
        num_gpu_blocks_override=None,
    )
    assert cap.max_concurrency == pytest.approx(1.6)
    assert cap.capacity_tokens == 1600
