"""The whole chain reproduces what real vLLM printed, and the figures textbooks quote."""

from __future__ import annotations

from dataclasses import replace

import pytest

from benchmarks.sizing_points import StartupPoint, load_points
from exporter.capacity.arch import parse_config
from exporter.capacity.gpus import CPU, lookup_gpu, neighbours
from exporter.capacity.plan import Context, Plan, PlanRequest, plan, what_ifs
from exporter.capacity.releases import release
from exporter.errors import InputError
from tests.conftest import FIXTURES, fixture_config

GIB = 1 << 30
POINTS = load_points()


def llama(**changes: object) -> PlanRequest:
    arch = parse_config(fixture_config("meta-llama__Llama-3.1-8B-Instruct"), "llama")
    base = PlanRequest(
        arch=arch,
        model_name="Llama-3.1-8B-Instruct",
        gpu=lookup_gpu("H100-80GB"),
        release=release("0.19.0"),
        gpu_memory_utilization=0.95,
        max_model_len=8192,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def tinyllama(**changes: object) -> PlanRequest:
    import json

    cfg = json.loads((FIXTURES / "vllm" / "tinyllama.config.json").read_text())
    base = PlanRequest(
        arch=parse_config(cfg, "tinyllama"),
        model_name="tinyllama",
        gpu=CPU,
        release=release("0.32.0"),
        max_model_len=2048,
        kv_cache_memory_bytes=GIB,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def within(actual: float, expected: float, rel: float) -> bool:
    return abs(actual - expected) <= rel * abs(expected)


@pytest.mark.parametrize("point", [p for p in POINTS if p.exact], ids=lambda p: f"row{p.row}")
def test_printed_kv_memory_reproduces_vllms_blocks_tokens_and_concurrency(
    point: StartupPoint,
) -> None:
    assert point.blocks is not None
    assert point.tokens is not None
    assert point.concurrency is not None
    result = plan(replace(point.request, available_kv_bytes=point.printed_kv_bytes))
    assert within(result.cap.num_blocks, point.blocks, 0.001)
    assert within(result.cap.capacity_tokens, point.tokens, 0.001)
    assert within(result.cap.max_concurrency, point.concurrency, 0.001)


# CPU-backend starts captured here (tests/fixtures/sizing/cpu-0.32/): the KV memory is
# VLLM_CPU_KVCACHE_SPACE GiB to the byte, and vLLM's /metrics gave its blocks and unrounded
# concurrency, so nothing but vLLM's own arithmetic stands between the inputs and the figures.
SET_MEMORY = [p for p in POINTS if p.kv_memory_set]


def test_the_fixture_has_exactness_rows_from_several_cpu_architectures() -> None:
    assert len(SET_MEMORY) >= 5
    assert {"llama", "qwen3", "gemma2", "gemma3", "deepseek_v2"} <= {p.family for p in SET_MEMORY}
    assert all(p.exact for p in SET_MEMORY)


@pytest.mark.parametrize("point", SET_MEMORY, ids=lambda p: f"row{p.row}")
def test_cpu_start_ups_blocks_tokens_and_concurrency_are_reproduced_exactly(
    point: StartupPoint,
) -> None:
    assert point.concurrency is not None
    result = plan(point.request)
    assert result.kv_budget_bytes == point.printed_kv_bytes
    assert result.cap.num_blocks == point.blocks
    assert result.cap.capacity_tokens == point.tokens
    assert result.cap.max_concurrency == pytest.approx(point.concurrency, rel=1e-12)


def test_the_cpu_backend_keeps_one_batch_in_flight_even_with_async_scheduling_asked() -> None:
    # vLLM's CPU platform turns async scheduling off, so a sliding window reserves
    # W - 1 + max_num_batched_tokens, not twice the batch (the gemma2 row: 154.57x, not 126.03x).
    assert plan(tinyllama(async_scheduling=True)).in_flight_tokens == 2048
    gpu = plan(llama(release=release("0.32.0"), async_scheduling=True))
    assert gpu.in_flight_tokens == 2 * gpu.max_num_batched_tokens


def test_model_runner_v2_keeps_one_batch_more_than_its_pipeline_stages_in_flight() -> None:
    # 0.29+ serve every model with V2, which keeps async scheduling on with PP and then
    # has pp + 1 batches in flight (VllmConfig.max_concurrent_batches); V1 had pp.
    v2 = plan(llama(release=release("0.32.0"), pipeline_parallel_size=2, async_scheduling=True))
    assert v2.in_flight_tokens == 3 * v2.max_num_batched_tokens
    assert release("0.28.0").in_flight_batches(2, async_scheduling=True, v2_runner=False) == 2


# Single-worker starts whose figures are not exact only because of the GiB's rounding.
ROUNDED = [p for p in POINTS if not p.exact and p.blocks and p.tp == p.pp == 1]


def printed_bracket(point: StartupPoint) -> tuple[Plan, Plan]:
    """Plans from the smallest and the largest KV memory that prints as the row's two-decimal
    GiB: vLLM's own figures lie between theirs."""
    low, high = (
        plan(replace(point.request, available_kv_bytes=round(point.printed_kv_bytes + d * GIB)))
        for d in (-0.005, 0.005)
    )
    return low, high


@pytest.mark.parametrize("point", ROUNDED, ids=lambda p: f"row{p.row}")
def test_printed_kv_memory_to_two_decimals_brackets_vllms_blocks(point: StartupPoint) -> None:
    # vLLM prints GiB to two decimals; the blocks it counted lie between the counts for
    # the smallest and largest figure that prints the same.
    assert point.blocks is not None
    low, high = printed_bracket(point)
    assert low.cap.num_blocks <= point.blocks <= high.cap.num_blocks


# Single-worker GPU starts that print tokens but no block count (most releases from 0.11).
ROUNDED_TOKENS = [
    p
    for p in POINTS
    if not p.exact and not p.blocks and p.tokens and p.tp == p.pp == 1 and not p.kv_memory_set
]


@pytest.mark.parametrize("point", ROUNDED_TOKENS, ids=lambda p: f"row{p.row}")
def test_printed_kv_memory_to_two_decimals_brackets_vllms_token_count(point: StartupPoint) -> None:
    # The same bracket on the "GPU KV cache size: N tokens" line: it follows the blocks,
    # the groups and each group's reservation per request (a sliding window's in-flight
    # batches among them: Gemma-4-31B under 0.26 prints 217,116, not the 360,000 of one).
    assert point.tokens is not None
    low, high = printed_bracket(point)
    assert low.cap.capacity_tokens <= point.tokens <= high.cap.capacity_tokens


def test_pipeline_parallel_blocks_come_from_the_tightest_stage() -> None:
    result = plan(llama(pipeline_parallel_size=2))
    assert result.cap.tightest_stage == 1  # the last stage samples and holds the LM head
    assert result.stage_available[1] < result.stage_available[0]


def test_cpu_tinyllama_with_1_gib_has_8192_blocks_and_1048576_tokens() -> None:
    result = plan(tinyllama())
    assert result.block_size == 128
    assert result.cap.num_blocks == 8192
    assert result.cap.capacity_tokens == 1_048_576


def test_cpu_tinyllama_with_48_block_override_has_6144_tokens_at_3x() -> None:
    result = plan(tinyllama(num_gpu_blocks_override=48))
    assert result.cap.capacity_tokens == 6144
    assert f"{result.cap.max_concurrency:.2f}" == "3.00"


def test_textbook_llama_8b_fp16_costs_128_kib_per_token_and_250_mib_per_2000() -> None:
    result = plan(llama())
    assert result.kv_bytes_per_token == 131_072
    assert result.kv_bytes_per_token * 2000 == 250 * 1024 * 1024


def test_textbook_80_gb_at_0_9_leaves_about_52_gb_and_200_sequences() -> None:
    # The textbook's own inputs: an 80 GB card, 16 GB of weights; vLLM's overheads on top.
    result = plan(
        llama(
            gpu=lookup_gpu("80GB"),
            weights_bytes=16 * 10**9,
            gpu_memory_utilization=0.9,
            release=release("0.32.0"),
            contexts=(Context("2000", 2000), Context("8000", 8000)),
        )
    )
    assert within(result.kv_budget_bytes, 52e9, 0.05)
    seqs = {c.label: n for c, n in result.sequences}
    assert within(seqs["2000"], 200, 0.05)
    assert within(seqs["8000"], 50, 0.05)


def test_fp8_kv_cache_doubles_blocks_and_sequences() -> None:
    ctx = (Context("2000", 2000),)
    auto = plan(llama(contexts=ctx))
    fp8 = plan(llama(contexts=ctx, kv_cache_dtype="fp8"))
    assert fp8.kv_bytes_per_token * 2 == auto.kv_bytes_per_token
    assert fp8.cap.num_blocks in (2 * auto.cap.num_blocks, 2 * auto.cap.num_blocks + 1)
    assert fp8.sequences[0][1] >= 2 * auto.sequences[0][1]


def test_tp4_quarters_per_gpu_bytes_per_token_of_an_8_kv_head_model() -> None:
    assert plan(llama(tensor_parallel_size=4)).kv_bytes_per_token * 4 == 131_072


def test_weight_quantization_frees_memory_but_keeps_kv_bytes_per_token() -> None:
    bf16 = plan(llama())
    fp8_weights = plan(llama(quantization="fp8"))
    assert fp8_weights.kv_bytes_per_token == bf16.kv_bytes_per_token
    assert fp8_weights.tightest.weights < bf16.tightest.weights
    assert fp8_weights.kv_budget_bytes > bf16.kv_budget_bytes


def test_kv_cache_memory_bytes_ignores_utilization() -> None:
    a = plan(llama(kv_cache_memory_bytes=10 * GIB, gpu_memory_utilization=0.5))
    b = plan(llama(kv_cache_memory_bytes=10 * GIB, gpu_memory_utilization=0.9))
    assert a.kv_budget_bytes == b.kv_budget_bytes == 10 * GIB


def test_default_utilization_follows_the_release() -> None:
    assert plan(llama(gpu_memory_utilization=None)).utilization == 0.9
    assert plan(llama(gpu_memory_utilization=None, release=release("0.20.0"))).utilization == 0.92


def test_cuda_graph_estimate_is_subtracted_from_0_20_unless_eager() -> None:
    assert plan(llama(release=release("0.19.0"))).tightest.cuda_graph == 0
    assert plan(llama(release=release("0.20.0"))).tightest.cuda_graph > 0
    assert plan(llama(release=release("0.20.0"), enforce_eager=True)).tightest.cuda_graph == 0


def test_a_context_longer_than_memory_holds_reports_vllms_startup_failure() -> None:
    result = plan(llama(max_model_len=131072, kv_cache_memory_bytes=8 * GIB))
    assert result.startup_failure is not None
    assert 0 < result.startup_failure.estimated_max_model_len < 131072


def test_tp_that_does_not_divide_attention_heads_is_rejected() -> None:
    with pytest.raises(InputError, match="must divide the model's 32 attention heads"):
        plan(llama(tensor_parallel_size=3))


@pytest.mark.parametrize("util", [0.0, -0.1, 1.01])
def test_utilization_outside_zero_one_is_rejected(util: float) -> None:
    with pytest.raises(InputError, match=r"must be in \(0, 1\]"):
        plan(llama(gpu_memory_utilization=util))


def test_cpu_without_kv_memory_asks_for_it() -> None:
    with pytest.raises(InputError, match="--kv-cache-memory-bytes"):
        plan(tinyllama(kv_cache_memory_bytes=None))


def test_what_ifs_answer_fp8_utilization_tp_and_shorter_context() -> None:
    labels = [w.label for w in what_ifs(plan(llama()))]
    assert labels[0].startswith("FP8 KV cache")
    assert any("--gpu-memory-utilization 1" in label for label in labels)
    assert any("--tensor-parallel-size 2" in label for label in labels)
    assert any("--max-model-len 4096" in label for label in labels)


def test_what_ifs_halve_and_double_the_max_num_seqs_in_force() -> None:
    # 0.16 on the V1 runner: its profile run sorts the logits of max_num_seqs dummy
    # requests, which outweighs the forward pass on an L4 (0.32's V2 runner samples the
    # dummy logits in place, so there the cap moves no block).
    base = plan(llama(gpu=lookup_gpu("L4"), release=release("0.16.0"), max_num_seqs=256))
    rows = {w.label: w.plan for w in what_ifs(base)}
    half, double = rows["--max-num-seqs 128"], rows["--max-num-seqs 512"]
    assert half is not None
    assert double is not None
    # A larger batch cap reserves more for the sampler: fewer blocks.
    assert half.cap.num_blocks > base.cap.num_blocks > double.cap.num_blocks


def test_what_ifs_compare_the_gpu_one_memory_class_down_and_up() -> None:
    labels = [w.label for w in what_ifs(plan(llama()))]
    assert "--gpu L40S" in labels
    assert "--gpu H200-141GB" in labels


def test_the_next_gpu_up_skips_gpus_of_the_same_memory_class() -> None:
    # An A10G's neighbours by memory are the L4 and the A10 (22 GiB all three): the
    # question a planner asks is the 48 GB class.
    assert neighbours(lookup_gpu("A10G")) == (None, lookup_gpu("L40S"))
    assert neighbours(lookup_gpu("MI300X")) == (None, lookup_gpu("MI325X"))
    assert neighbours(CPU) == (None, None)


def test_no_other_gpu_is_offered_when_the_kv_memory_is_given() -> None:
    labels = [w.label for w in what_ifs(plan(llama(kv_cache_memory_bytes=20 * GIB)))]
    assert not [label for label in labels if label.startswith("--gpu")]


def test_what_ifs_keep_the_offset_of_a_printed_budget() -> None:
    given = plan(llama(available_kv_bytes=50 * GIB))
    fp8 = next(w for w in what_ifs(given) if w.label.startswith("FP8"))
    assert fp8.plan is not None
    assert fp8.plan.kv_budget_bytes == 50 * GIB


def test_model_runner_v2s_sampling_state_is_charged_from_027_on_its_last_stage() -> None:
    # GPUModelRunner.load_model builds the sampler after "Model loading took" is measured:
    # PenaltiesState's output_bin_counts (requests × vocabulary, int32), its prompt_bin_mask
    # and the grammar bitmask (requests × ⌈vocabulary ÷ 32⌉, int32), and the logit-bias and
    # bad-words states (4,353 int32 a request). 0.27's total_consumed is the first to see it.
    per_request = 128_256 * 4 + 2 * 4_008 * 4 + 4_353 * 4
    v2 = plan(llama(release=release("0.27.1"), max_num_seqs=256, model_runner="v2"))
    assert v2.stages[0].sampler_state == 256 * per_request
    assert v2.stages[0].non_torch > v2.stages[0].sampler_state  # part of non-torch memory
    before = plan(llama(release=release("0.26.0"), max_num_seqs=256, model_runner="v2"))
    assert before.stages[0].sampler_state == 0
    v1 = plan(llama(release=release("0.27.1"), max_num_seqs=256, model_runner="v1"))
    assert v1.stages[0].sampler_state == 0
    staged = plan(
        llama(
            release=release("0.27.1"), max_num_seqs=256, pipeline_parallel_size=2, model_runner="v2"
        )
    )
    assert [s.sampler_state for s in staged.stages] == [0, 256 * per_request]
