"""Gemma 4's KV cache as vLLM 0.28 builds it: KV-shared layers keep none, full-attention
layers take the 512-dim global head, and the sliding layers' blocks lengthen to match that
page. Checked against a vLLM 0.28.0 start of gemma-4-E2B-it on one L4 (xbill9/gemma4-dev,
gpu-vllm-g6-2b/benchmarks/runs/2026-08-30-first-serve-g6/REPORT.md @ 71bf5f7: "9.65 GiB of
KV = 1,076,849 tokens = 65.73× concurrency at 16 K", with --max-model-len 16384
--max-num-seqs 8 --gpu-memory-utilization 0.90 in the run's report JSON).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from exporter.capacity.arch import LayerKind, parse_config
from exporter.capacity.deploy_flags import MultimodalProfile
from exporter.capacity.gpus import GIB, lookup_gpu
from exporter.capacity.plan import PlanRequest, plan
from exporter.capacity.releases import release
from exporter.capacity.weights import count_params

CONFIG = Path(__file__).parent.parent / "fixtures/sizing/configs/google__gemma-4-E2B-it/config.json"
ARCH = parse_config(json.loads(CONFIG.read_text()), str(CONFIG))


def l4_request(kv_gib: float) -> PlanRequest:
    return PlanRequest(
        arch=ARCH,
        model_name="google/gemma-4-E2B-it",
        gpu=lookup_gpu("L4"),
        release=release("0.28.0"),
        gpu_memory_utilization=0.9,
        max_model_len=16384,
        max_num_seqs=8,
        available_kv_bytes=round(kv_gib * GIB),
    )


def test_gemma4_kv_shared_layers_keep_no_cache_and_full_layers_take_the_global_head() -> None:
    own = [x for x in ARCH.layers if not x.kv_shared]
    assert len(ARCH.layers) - len(own) == 20  # num_kv_shared_layers
    assert sorted({(x.kind.value, x.head_size) for x in own}) == [("full", 512), ("sliding", 256)]
    # 3 full layers × 512 × 2 × 2 B + 12 sliding × 256 × 2 × 2 B: the 18 KiB the report's
    # rig "carried as arithmetic"; sliding windows make vLLM's pool hold about half.
    assert sum(x.bytes_per_token(1, 2) for x in ARCH.layers) == 18_432


def test_gemma4_sliding_blocks_lengthen_to_the_full_layers_page() -> None:
    p = plan(l4_request(9.65))
    blocks = {g.spec.kind: g.spec.block_size for g in p.layout.groups}
    assert blocks == {LayerKind.FULL: 16, LayerKind.SLIDING: 32}
    assert {g.spec.page_bytes for g in p.layout.groups} == {16 * 512 * 2 * 2}
    assert len(p.layout.groups) == 5  # 3 full layers; 12 sliding in four groups of 3


def test_gemma4_e2b_on_an_l4_under_028_reaches_the_reported_concurrency() -> None:
    # The report prints 9.65 GiB to two decimals: the logged figures lie between what
    # 9.645 and 9.655 GiB give.
    low, high = plan(l4_request(9.645)), plan(l4_request(9.655))
    assert low.cap.max_concurrency <= 65.73 <= high.cap.max_concurrency
    assert low.cap.capacity_tokens <= 1_076_849 <= high.cap.capacity_tokens
    # Every sliding group holds (window − 1 + 2 × 2,048 in-flight tokens) in 32-token
    # blocks, plus one; the full group the whole 16,384.
    assert low.cap.blocks_per_request == 16384 // 16 + 4 * ((511 + 4096 + 31) // 32 + 1)


def test_gemma4_weights_count_the_per_layer_embeddings_and_the_double_wide_mlp() -> None:
    params = count_params(ARCH)
    narrow = count_params(replace(ARCH, double_wide_mlp=False, per_layer_embed_params=0))
    assert params is not None
    assert narrow is not None
    ple = 262_144 * 35 * 256  # vocab_size_per_layer_input × layers × hidden_size_per_layer_input
    assert params.embed - narrow.embed == ple
    assert params.total - narrow.total == ple + 20 * 3 * 1536 * 6144


def test_gemma4_encoder_profile_encodes_a_32_frame_video() -> None:
    # gemma4_mm.py (0.28): the video's 32 × (70 + 2 + 6) tokens outnumber an image's 280,
    # and each frame goes through the tower at 70 soft tokens × 3² patches.
    assert ARCH.vision_profile_modality == "video"
    assert ARCH.vision_item_tokens == 32 * 78
    assert ARCH.vision_profile_elems == 32 * 70 * 9 * 3072
    assert ARCH.dynamic_vision is None  # no max_pixels resizes it
    p = plan(replace(l4_request(9.65), available_kv_bytes=None))
    assert p.sources["encoder_profile"] == "1 dummy item(s) of the longest video"


def test_gemma4_with_no_video_allowed_profiles_the_largest_image() -> None:
    # --limit-mm-per-prompt '{"video": 0}': the image (280 tokens, 2,520 patches) is the
    # largest item left, and the L4's 2,048-token encoder budget takes 7 of them.
    mm = MultimodalProfile(limits=(("video", 0),))
    p = plan(replace(l4_request(9.65), available_kv_bytes=None, mm_profile=mm))
    assert p.sources["encoder_profile"] == "7 dummy item(s) of the largest image"
    none = MultimodalProfile(limits=(("video", 0), ("image", 0), ("audio", 0)))
    p = plan(replace(l4_request(9.65), available_kv_bytes=None, mm_profile=none))
    assert p.sources["encoder_profile"].startswith("none")


BIG = Path(__file__).parent.parent / "fixtures/sizing/configs/google__gemma-4-31B-it/config.json"


def test_gemma4_31b_under_026_reserves_two_batches_for_each_sliding_layer() -> None:
    # johnpfeiffer/source.johnpfeiffer.github.io@5624f9b, content/ai/b300-deepseek-0731.md:
    # gemma-4-31B-it on one B300 under 0.26.0 (V1 runner, async scheduling, 8,192 batched
    # tokens) printed 182.37 GiB and "Maximum concurrency for 16,384 tokens per request:
    # 13.25x". From 0.26 a sliding layer holds W - 1 + 2 x 8,192 tokens, here the whole
    # 16,384, so its 50 sliding layers cost what full ones do; one batch (async scheduling
    # off) would give 21.99x.
    arch = parse_config(json.loads(BIG.read_text()), str(BIG))
    request = PlanRequest(
        arch=arch,
        model_name="google/gemma-4-31B-it",
        gpu=lookup_gpu("267.69GiB"),
        release=release("0.26.0"),
        gpu_memory_utilization=0.92,
        max_model_len=16384,
        model_runner="v1",
        available_kv_bytes=round(182.37 * GIB),
    )
    assert round(plan(request).cap.max_concurrency, 2) == 13.25
    one_batch = plan(replace(request, async_scheduling=False)).cap.max_concurrency
    assert round(one_batch, 2) == 21.99
