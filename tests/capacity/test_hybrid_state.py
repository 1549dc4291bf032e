"""A hybrid Mamba model's recurrent state, release by release: its dtype and how much of it
a request holds. Checked against two real vLLM 0.28.0 starts of Qwen3.5-0.8B on an A100
80GB PCIe (tests/fixtures/sizing/vllm_startup_points.csv, the Lebhoryi rows), whose logs
print the attention block vLLM chose, the blocks per request (as concurrency) and the tokens.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from exporter.capacity.arch import LayerKind, parse_config
from exporter.capacity.gpus import GIB, lookup_gpu
from exporter.capacity.kvcache import build_layout, mamba_page_bytes
from exporter.capacity.plan import Plan, PlanRequest, plan
from exporter.capacity.releases import release
from exporter.errors import InputError
from tests.capacity.test_arch import NEMOTRON_H

CONFIG = Path(__file__).parent.parent / "fixtures/sizing/configs/Qwen__Qwen3.5-0.8B/config.json"
A100_PCIE = "79.25GiB"  # "Free memory on device (78.84/79.25 GiB)" in the serve log


def qwen35(version: str = "0.28.0", **changes: object) -> PlanRequest:
    base = PlanRequest(
        arch=parse_config(json.loads(CONFIG.read_text()), str(CONFIG)),
        model_name="Qwen/Qwen3.5-0.8B",
        gpu=lookup_gpu(A100_PCIE),
        release=release(version),
        max_model_len=8192,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def mamba_blocks(p: Plan, length: int) -> set[int]:
    return {
        g.spec.blocks_per_request(length, p.in_flight_tokens)
        for g in p.layout.groups
        if g.spec.kind is LayerKind.MAMBA
    }


def test_qwen35_state_in_float32_sets_the_logged_544_token_block_under_028() -> None:
    p = plan(qwen35())
    assert p.block_size == 544  # "Setting attention block size to 544 tokens"
    (gdn, *_) = (x for x in p.request.arch.layers if x.kind is LayerKind.MAMBA)
    state = mamba_page_bytes(gdn, 1, 2, 4)  # bf16 conv state, float32 SSM state
    # "Padding mamba page size by 2.64%": the state page padded up to 544 attention tokens.
    assert round((p.layout.page_bytes / state - 1) * 100, 2) == 2.64


def test_qwen35_serve_start_prints_the_logged_tokens_and_concurrency() -> None:
    # vllm serve --max-model-len 8192 --max-num-seqs 32 --gpu-memory-utilization 0.85
    p = plan(
        qwen35(gpu_memory_utilization=0.85, max_num_seqs=32, available_kv_bytes=round(61.82 * GIB))
    )
    assert p.cap.capacity_tokens == 3_697_198
    assert round(p.cap.max_concurrency, 2) == 451.32
    assert mamba_blocks(p, 8192) == {2}  # mamba_cache_mode "align": two state blocks


def test_qwen35_offline_start_prints_the_logged_concurrency() -> None:
    # LLM(model) with the defaults: 262,144 tokens, 8,192 batched, 256 sequences, 0.92.
    p = plan(
        qwen35(
            max_model_len=262_144,
            max_num_seqs=256,
            max_num_batched_tokens=8192,
            available_kv_bytes=round(67.08 * GIB),
        )
    )
    assert round(p.cap.max_concurrency, 2) == 22.08
    # 67.08 is rounded to 0.005 GiB, a block's worth here: the logged 5,788,118 tokens are
    # 10,775 blocks where 67.08 GiB exactly holds 10,774.
    assert abs(p.cap.capacity_tokens - 5_788_118) < 544 * 262_144 / (482 + 6)


def test_qwen35_ssm_state_takes_the_checkpoints_float32_from_017() -> None:
    off = {"enable_prefix_caching": False}
    assert plan(qwen35("0.16.0", **off)).block_size == 288  # bf16 state: 274 -> 288
    assert plan(qwen35("0.17.0", **off)).block_size == 544


def test_mamba_ssm_cache_dtype_flag_overrides_the_checkpoint() -> None:
    assert plan(qwen35(mamba_ssm_cache_dtype="bfloat16")).block_size == 288


def test_kv_cache_dtype_leaves_the_recurrent_state_alone() -> None:
    # fp8 halves an attention token, not the state: the block doubles to cover the page.
    p = plan(qwen35(kv_cache_dtype="fp8"))
    assert p.block_size == 1072  # 1,085,440 state bytes over 1,024 B a token -> 1,060
    assert p.layout.page_bytes == 1072 * 1024


def test_hybrid_prefix_caching_is_off_by_default_before_026() -> None:
    assert mamba_blocks(plan(qwen35("0.25.0")), 8192) == {1}
    assert mamba_blocks(plan(qwen35("0.26.0")), 8192) == {2}
    assert mamba_blocks(plan(qwen35("0.25.0", enable_prefix_caching=True)), 8192) == {2}


@pytest.mark.parametrize(
    ("version", "mode", "blocks"),
    [
        ("0.27.1", "all", None),
        ("0.28.0", "align", 2),
        ("0.31.0", "align", 2),
        ("0.32.0", "align", 3),
    ],
)
def test_mamba2_state_blocks_per_request_follow_the_release(
    version: str, mode: str, blocks: int | None
) -> None:
    # 0.26-0.27 cache every block's state of a model that supports it ("all"); 0.28 only
    # two ("align"); 0.32's Mamba2 mixer adds a prefill checkpoint block.
    arch = parse_config(NEMOTRON_H, "nemotron")
    rel = release(version)
    assert rel.mamba_cache_mode(True, arch.architectures) == mode
    layout, block = build_layout(
        arch, release=rel, block_size=16, tp=1, pp=1, dtype_bytes=2, mamba_cache_mode=mode
    )
    held = {
        g.spec.blocks_per_request(8192, 0) for g in layout.groups if g.spec.kind is LayerKind.MAMBA
    }
    assert held == {math.ceil(8192 / block) if blocks is None else blocks}


def test_nemotron_h_state_defaults_to_float32_from_022() -> None:
    arch = parse_config(NEMOTRON_H, "nemotron")
    assert release("0.19.0").config_ssm_dtype(arch.architectures, None, None) == "float16"
    assert release("0.22.0").config_ssm_dtype(arch.architectures, None, None) == "float32"


def test_an_unknown_state_dtype_is_refused_naming_the_flag() -> None:
    with pytest.raises(InputError, match="--mamba-ssm-cache-dtype"):
        plan(qwen35(mamba_ssm_cache_dtype="fp8"))


def test_an_unknown_state_dtype_in_the_config_is_refused_naming_the_key() -> None:
    config = json.loads(CONFIG.read_text())
    config["text_config"]["mamba_ssm_dtype"] = "float64"
    with pytest.raises(InputError, match="mamba_ssm_dtype"):
        parse_config(config, "config.json")


def _gdn_note(p: Plan) -> list[str]:
    return [n for n in p.notes if n.startswith("Gated DeltaNet layers")]


def test_a_gated_deltanet_plan_says_the_profile_run_autotunes_its_kernels_off_hopper() -> None:
    # vLLM PR 36599 (0.18+): the warm-up runs inside memory_profiling on the Triton path.
    assert _gdn_note(plan(qwen35()))
    assert not _gdn_note(plan(qwen35("0.17.1")))  # no warm-up in 0.17
    assert not _gdn_note(plan(qwen35(gpu=lookup_gpu("H100-80GB"))))  # FlashInfer's kernel
