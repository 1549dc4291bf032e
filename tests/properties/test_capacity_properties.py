"""Properties of the capacity engine over generated deployments: more GPU memory or a higher
gpu_memory_utilization never means fewer blocks, nothing it reports is negative, and blocks
are the budget rounded down to whole blocks.

Flags that vLLM defaults from the GPU's size (max_num_batched_tokens, max_num_seqs) are
pinned: with them free, a bigger GPU can get a larger default batch, a larger activation
peak and fewer blocks — which is what vLLM does, not a fault of the model.
"""

from __future__ import annotations

import json
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.capacity.arch import parse_config
from exporter.capacity.gpus import GIB, Gpu
from exporter.capacity.kvcache import sequences_that_fit
from exporter.capacity.plan import Context, PlanRequest, plan
from exporter.capacity.releases import release
from tests.conftest import FIXTURES, fixture_config

ARCHS = {
    "llama-8b": parse_config(fixture_config("meta-llama__Llama-3.1-8B-Instruct"), "llama"),
    "qwen2.5-7b": parse_config(fixture_config("Qwen__Qwen2.5-7B-Instruct"), "qwen2.5"),
    "qwen3-14b": parse_config(fixture_config("Qwen__Qwen3-14B"), "qwen3"),
    "tinyllama": parse_config(
        json.loads((FIXTURES / "vllm" / "tinyllama.config.json").read_text()), "tinyllama"
    ),
}
RELEASES = ["0.8.5", "0.11.0", "0.19.0", "0.24.0", "0.32.0"]


@st.composite
def requests(draw: st.DrawFn) -> PlanRequest:
    arch = ARCHS[draw(st.sampled_from(sorted(ARCHS)))]
    return PlanRequest(
        arch=arch,
        model_name="m",
        gpu=Gpu("gen", draw(st.integers(8 * GIB, 200 * GIB)), "hopper", "generated"),
        release=release(draw(st.sampled_from(RELEASES))),
        gpu_memory_utilization=draw(st.floats(0.3, 1.0)),
        kv_cache_dtype=draw(st.sampled_from(["auto", "fp8"])),
        block_size=draw(st.sampled_from([None, 16, 32])),
        max_model_len=draw(st.sampled_from([2048, 4096, 8192])),
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        enforce_eager=draw(st.booleans()),
        contexts=(Context("c", draw(st.integers(1, 20_000))),),
    )


@settings(derandomize=True, database=None, max_examples=200, deadline=None)
@given(requests(), st.integers(0, 64 * GIB))
def test_more_gpu_memory_never_means_fewer_blocks(req: PlanRequest, more: int) -> None:
    bigger = replace(req, gpu=replace(req.gpu, total_bytes=req.gpu.total_bytes + more))
    a, b = plan(req), plan(bigger)
    assert a.cap.num_blocks <= b.cap.num_blocks
    assert a.kv_budget_bytes <= b.kv_budget_bytes


@settings(derandomize=True, database=None, max_examples=200, deadline=None)
@given(requests(), st.floats(0.0, 0.7))
def test_higher_utilization_never_means_fewer_blocks(req: PlanRequest, more: float) -> None:
    u = req.gpu_memory_utilization or 0.9
    higher = replace(req, gpu_memory_utilization=min(1.0, u + more))
    assert plan(req).cap.num_blocks <= plan(higher).cap.num_blocks


@settings(derandomize=True, database=None, max_examples=200, deadline=None)
@given(requests())
def test_nothing_reported_is_negative(req: PlanRequest) -> None:
    p = plan(req)
    assert p.cap.num_blocks >= 0
    assert p.cap.capacity_tokens >= 0
    assert p.cap.max_concurrency >= 0
    assert p.kv_bytes_per_token > 0
    assert all(n >= 0 for _, n in p.sequences)


@settings(derandomize=True, database=None, max_examples=200, deadline=None)
@given(requests())
def test_blocks_are_the_budget_rounded_down_to_whole_blocks(req: PlanRequest) -> None:
    p = plan(req)
    per_block = p.layout.stage_bytes_per_block(p.cap.tightest_stage)
    budget = max(0, p.kv_budget_bytes)
    assert p.cap.num_blocks * per_block <= budget < (p.cap.num_blocks + 1) * per_block


@settings(derandomize=True, database=None, max_examples=200, deadline=None)
@given(requests())
def test_tokens_and_sequences_fit_in_the_blocks(req: PlanRequest) -> None:
    p = plan(req)
    assert p.cap.capacity_tokens <= p.cap.num_blocks * p.block_size
    ((context, fits),) = p.sequences
    per_sequence = p.layout.blocks_per_request(max(1, context.tokens), p.in_flight_tokens)
    assert fits * per_sequence <= max(0, p.cap.num_blocks - 1)
    assert fits == sequences_that_fit(
        p.layout, p.cap.num_blocks, context.tokens, p.in_flight_tokens
    )
