"""The profile-run peak follows what drives it: logits copies, vision towers, MX scales."""

from __future__ import annotations

from dataclasses import replace

from benchmarks.sizing_points import family_of
from exporter.capacity.arch import parse_config
from exporter.capacity.gpus import lookup_gpu
from exporter.capacity.memory import (
    ActivationInputs,
    OverheadModel,
    activation_peaks,
    forward_bytes,
)
from exporter.capacity.plan import PlanRequest, plan
from exporter.capacity.releases import release
from exporter.capacity.weights import (
    estimate_weights_bytes,
    rotary_cache_bytes,
    stage_weight_bytes,
)
from tests.conftest import fixture_config

GIB = 1 << 30


def peak(config: dict[str, object], max_num_seqs: int | None = None) -> int:
    req = PlanRequest(
        arch=parse_config(config, "model"),
        model_name="model",
        gpu=lookup_gpu("H100"),
        release=release("0.19.0"),
        max_model_len=8192,
        max_num_seqs=max_num_seqs,
    )
    return plan(req).stages[0].activation


def test_logit_soft_capping_stays_below_the_sampler_peak() -> None:
    # compute_logits holds three bf16 copies while capping (6 B an entry) and frees them
    # before the sampler's ~15 B an entry: the cap never sets the profile peak.
    gemma2 = fixture_config("google__gemma-2-9b-it")
    uncapped = {**gemma2, "final_logit_softcapping": None}
    assert peak(gemma2) == peak(uncapped)


def test_soft_capped_logits_hold_three_model_dtype_copies() -> None:
    # With the sampler's own buffers taken out, the logits phase is what is left.
    bare = OverheadModel(sampler_kernel_bytes=0.0, sampler_dtype_bytes=0.0)  # 0.17+ path
    inputs = ActivationInputs(
        max_num_batched_tokens=8192,
        max_num_seqs=1024,
        intermediate_size=0,
        hidden_size=3584,
        vocab_size=256_000,
        dtype_bytes=2,
        tp=1,
        pp=1,
    )
    capped = activation_peaks(replace(inputs, logits_softcap=True), release("0.19.0"), bare)
    plain = activation_peaks(inputs, release("0.19.0"), bare)
    assert capped == (3 * 2 * 1024 * 256_000,)
    assert plain == (2 * 1024 * 256_000,)


def test_a_vision_towers_encoder_profile_can_set_the_peak() -> None:
    vl = fixture_config("Qwen__Qwen2.5-VL-7B-Instruct")
    text_only = {k: v for k, v in vl.items() if k != "vision_config"}
    # The largest image through the vision tower's MLP, counted like the LM's forward; with
    # 64 sequences the sampler no longer hides it (phases peak one at a time).
    arch = parse_config(vl, "model")
    encoder = OverheadModel().encoder_bytes * arch.vision_profile_elems * 2
    assert peak(vl, 64) > peak(text_only, 64)
    assert peak(vl, 64) == int(encoder)


def test_mxfp4_weights_carry_16_bit_scales_before_blackwell() -> None:
    arch = parse_config(fixture_config("openai__gpt-oss-120b"), "gpt-oss")
    hopper = estimate_weights_bytes(arch, arch.dtype, None, native_fp4=False)
    blackwell = estimate_weights_bytes(arch, arch.dtype, None, native_fp4=True)
    assert hopper is not None
    assert blackwell is not None
    # vLLM loaded 64.38 GiB on one H100 (0.14.1, issue 33155); 60.7 GiB is 4.25 bits.
    assert abs(hopper / GIB - 64.38) < 0.5
    assert blackwell < hopper


def test_mxfp4_experts_load_padded_for_marlin() -> None:
    arch = parse_config(fixture_config("openai__gpt-oss-120b"), "gpt-oss")
    one = estimate_weights_bytes(arch, arch.dtype, None, native_fp4=False, marlin_tp=1)
    four = estimate_weights_bytes(arch, arch.dtype, None, native_fp4=False, marlin_tp=4)
    assert one is not None
    assert four is not None
    # Marlin pads each partition's expert width to 128 and the hidden size to 256: one H100
    # under 0.10.1 loaded 65.97 GiB (issue 23278), each of four A100s under 0.10.1.1 17.22
    # GiB (tests/fixtures/sizing, dennislee22/vLLM-benchmarking).
    assert abs(one / GIB - 65.97) < 0.2
    per_gpu = stage_weight_bytes(
        arch, four, tp=4, pp=1, dtype=arch.dtype, quantization=None, marlin_tp=4
    )[0]
    assert abs(per_gpu / GIB - 17.22) < 0.15


def test_hopper_takes_marlin_until_pip_vllm_brings_triton_kernels() -> None:
    arch = parse_config(fixture_config("openai__gpt-oss-120b"), "gpt-oss")
    req = PlanRequest(arch=arch, model_name="g", gpu=lookup_gpu("H100"), release=release("0.11.0"))
    marlin = plan(req).stages[0].weights
    triton = plan(replace(req, release=release("0.14.1"))).stages[0].weights
    on_a100 = plan(replace(req, gpu=lookup_gpu("A100-80GB"), release=release("0.19.0")))
    assert marlin > triton
    assert on_a100.stages[0].weights == marlin  # Ampere has no Triton MXFP4 path


def test_every_gpu_holds_the_rotary_table_beside_its_weights() -> None:
    arch = parse_config(fixture_config("meta-llama__Llama-3.1-8B-Instruct"), "llama")
    # 131,072 positions × 128 rotary dims × 2 B: what issue 10517's printed 14.99 GiB holds
    # beyond the 14.958 GiB of parameters.
    assert rotary_cache_bytes(arch) == 131072 * 128 * 2
    checkpoint = estimate_weights_bytes(arch, arch.dtype, None)
    assert checkpoint is not None
    req = PlanRequest(
        arch=arch,
        model_name="m",
        gpu=lookup_gpu("H100"),
        release=release("0.19.0"),
        tensor_parallel_size=2,
    )
    # Not sharded: each of the two GPUs holds the whole table.
    assert plan(req).stages[0].weights == checkpoint // 2 + 131072 * 128 * 2


def test_plan_uses_the_gpus_fp4_support_for_the_weights() -> None:
    arch = parse_config(fixture_config("openai__gpt-oss-120b"), "gpt-oss")
    req = PlanRequest(arch=arch, model_name="g", gpu=lookup_gpu("H100"), release=release("0.19.0"))
    on_b200 = plan(replace(req, gpu=lookup_gpu("B200"))).stages[0].weights
    assert plan(req).stages[0].weights > on_b200


def test_moe_and_vision_variants_share_their_family() -> None:
    assert family_of("qwen3_moe") == "qwen3"
    assert family_of("qwen3_vl_moe_text") == "qwen3"
    assert family_of("llama") == "llama"


def test_weight_estimate_matches_a_published_checkpoint() -> None:
    # google/gemma-2-9b-it's safetensors index: total_size 18,483,411,968 B (tied LM head).
    arch = parse_config(fixture_config("google__gemma-2-9b-it"), "gemma2")
    estimate = estimate_weights_bytes(arch, arch.dtype, None)
    assert estimate is not None
    assert abs(estimate - 18_483_411_968) < 0.001 * 18_483_411_968


def test_with_flashinfer_installed_the_sampler_sorts_only_from_0_11_1_to_0_16() -> None:
    # vLLM PR 26859 turned FlashInfer's sort-free sampler off by default after 0.11.0,
    # leaving the PyTorch path that sorts the logits; 0.17 no longer sorts them.
    inputs = ActivationInputs(
        flashinfer_installed=True,
        max_num_batched_tokens=8192,
        max_num_seqs=1024,
        intermediate_size=0,
        hidden_size=4096,
        vocab_size=151_936,
        dtype_bytes=2,
        tp=1,
        pp=1,
    )
    model = OverheadModel()
    sampler = {
        v: activation_peaks(inputs, release(v), model)[0]
        for v in ("0.11.0", "0.11.1", "0.16.0", "0.17.0")
    }
    entries = 1024 * 151_936
    assert sampler["0.11.1"] == sampler["0.16.0"] == int((model.sampler_sort_bytes + 2) * entries)
    # Sort-free on either side, through different code: FlashInfer's sampler up to 0.11.0,
    # the top-k/top-p kernel from 0.17, each with its own refit coefficient.
    assert sampler["0.11.0"] == int((model.sampler_fixed_bytes + 2) * entries)
    assert sampler["0.17.0"] == int((model.sampler_kernel_bytes + 2) * entries)


def test_a_turing_gpu_under_0_8_to_0_10_samples_through_v0s_sorting_path() -> None:
    # vLLM 0.8-0.10 fall back to the V0 engine below compute capability 8.0, and V0's
    # sampler sorts the logits even with FlashInfer installed; 0.11 has no V0 left.
    inputs = ActivationInputs(
        flashinfer_installed=True,
        max_num_batched_tokens=2048,
        max_num_seqs=256,
        intermediate_size=0,
        hidden_size=2048,
        vocab_size=151_936,
        dtype_bytes=2,
        tp=1,
        pp=1,
    )
    model = OverheadModel()
    sorting = int((model.sampler_sort_bytes + 2) * 256 * 151_936)

    def peak(version: str, family: str) -> int:
        rel = release(version)
        return activation_peaks(replace(inputs, v0_engine=rel.v0_engine_on(family)), rel, model)[0]

    assert peak("0.8.5", "turing") == peak("0.10.1", "volta") == sorting
    assert peak("0.10.1", "ampere") != sorting
    assert peak("0.11.0", "turing") != sorting


def test_before_0_11_1_v1_sorts_unless_flashinfer_is_installed() -> None:
    # pip install vllm did not bring FlashInfer until vLLM PR 26443 (after 0.11.0); without
    # it V1 falls back to the PyTorch-native path, which sorts the logits.
    inputs = ActivationInputs(
        max_num_batched_tokens=2048,
        max_num_seqs=256,
        intermediate_size=0,
        hidden_size=3584,
        vocab_size=152_064,
        dtype_bytes=2,
        tp=1,
        pp=1,
    )
    model = OverheadModel()
    entries = 256 * 152_064
    pip_default = activation_peaks(inputs, release("0.10.1"), model)[0]
    installed = activation_peaks(
        replace(inputs, flashinfer_installed=True), release("0.10.1"), model
    )
    assert pip_default == int((model.sampler_sort_bytes + 2) * entries)
    assert installed == (int((model.sampler_fixed_bytes + 2) * entries),)


def test_model_runner_v2_samples_the_dummy_logits_as_they_are() -> None:
    # V2's _dummy_sampler_run (vllm/v1/worker/gpu/model_runner.py) samples requests the
    # sampler never registered: top_k stays the vocabulary, top_p 1.0, so nothing filters
    # and 0.26+ copies nothing; 0.22-0.25 copied the logits to fp32 first.
    inputs = ActivationInputs(
        v2_runner=True,
        max_num_batched_tokens=8192,
        max_num_seqs=1024,
        intermediate_size=0,
        hidden_size=0,
        vocab_size=151_936,
        dtype_bytes=2,
        tp=1,
        pp=1,
    )
    entries = 1024 * 151_936
    assert activation_peaks(inputs, release("0.31.0"))[0] == 2 * entries
    assert activation_peaks(inputs, release("0.24.0"))[0] == (2 + 4) * entries


def test_model_runner_v2_is_the_default_by_each_releases_own_rule() -> None:
    # vllm/config/vllm.py::use_v2_model_runner with VLLM_USE_V2_MODEL_RUNNER unset.
    def v2(version: str, arch: str, moe: bool = False, hybrid: bool = False) -> bool:
        return release(version).v2_model_runner((arch,), moe=moe, quantized=False, hybrid=hybrid)

    assert not v2("0.21.0", "Qwen3ForCausalLM")  # the env default is off
    assert v2("0.22.0", "Qwen3ForCausalLM")  # the first listed architecture
    assert not v2("0.24.0", "Gemma2ForCausalLM")  # not listed
    assert v2("0.25.0", "Gemma2ForCausalLM")  # every dense model from 0.25
    assert not v2("0.28.0", "Qwen3MoeForCausalLM", moe=True)  # an MoE model must be listed
    assert v2("0.28.0", "Qwen2MoeForCausalLM", moe=True)
    assert not v2("0.28.0", "Qwen3NextForCausalLM", moe=True, hybrid=True)
    assert v2("0.29.0", "Qwen3MoeForCausalLM", moe=True)  # the list is gone


def test_the_triton_kernel_filters_only_from_eight_requests() -> None:
    # apply_top_k_top_p (vllm/v1/sample/ops/topk_topp_sampler.py, 0.17+) takes the Triton
    # kernel from 8 rows; fewer are sorted by apply_top_k_top_p_pytorch.
    inputs = ActivationInputs(
        max_num_batched_tokens=8192,
        max_num_seqs=4,
        intermediate_size=0,
        hidden_size=0,
        vocab_size=151_936,
        dtype_bytes=2,
        tp=1,
        pp=1,
    )
    model = OverheadModel()
    four = activation_peaks(inputs, release("0.19.0"), model)[0]
    eight = activation_peaks(replace(inputs, max_num_seqs=8), release("0.19.0"), model)[0]
    assert four == int((model.sampler_sort_bytes + 2) * 4 * 151_936)
    assert eight == int((model.sampler_kernel_bytes + 2) * 8 * 151_936)


def test_the_sampler_counts_meet_the_0_16_and_0_17_peaks_llm_d_measured() -> None:
    # llm-d-planner@8f9dbb8 (accuracy/scripts/sweep-versions.yaml): Qwen3-14B on one H100,
    # vLLM's defaults (8,192 batched tokens, 1,024 sequences), activation peak 5.64 GiB
    # under 0.16 (sorting) and 2.23 GiB under 0.17 (the Triton kernel). The counts, with
    # nothing fitted, land within 10 %.
    qwen3_14b = fixture_config("Qwen__Qwen3-14B")

    def counted(version: str) -> float:
        req = PlanRequest(
            arch=parse_config(qwen3_14b, "model"),
            model_name="Qwen/Qwen3-14B",
            gpu=lookup_gpu("H100"),
            release=release(version),
        )
        return plan(req).stages[0].activation / GIB

    assert abs(counted("0.16.0") - 5.64) / 5.64 < 0.10
    assert abs(counted("0.17.0") - 2.23) / 2.23 < 0.10


def test_the_forward_count_meets_issue_10517s_printed_peak() -> None:
    # vLLM issue 10517: Llama-3.1-8B on an RTX 3090 under 0.6.4 (V0, no chunked prefill, so
    # the profile batch is max_model_len = 20,000 tokens) printed peak_torch_memory 17.06
    # GiB with 14.99 GiB of weights: 2.07 GiB of forward pass. Counted, not fitted.
    llama = parse_config(fixture_config("meta-llama__Llama-3.1-8B-Instruct"), "model")
    inputs = ActivationInputs(
        max_num_batched_tokens=20_000,
        max_num_seqs=256,
        intermediate_size=llama.intermediate_size or 0,
        hidden_size=llama.hidden_size or 0,
        vocab_size=llama.vocab_size or 0,
        dtype_bytes=2,
        tp=1,
        pp=1,
    )
    assert abs(forward_bytes(inputs) / GIB - 2.07) / 2.07 < 0.01


def test_the_plan_names_the_sampler_path_its_activation_assumes() -> None:
    # The path moves the row by GiBs; a start-up log says which one ran (Model Runner V2
    # logs "Using V2 Model Runner"), so the row names it for the reader to compare.
    qwen3_14b = parse_config(fixture_config("Qwen__Qwen3-14B"), "model")

    def source(version: str) -> str:
        req = PlanRequest(
            arch=qwen3_14b,
            model_name="Qwen/Qwen3-14B",
            gpu=lookup_gpu("H100"),
            release=release(version),
        )
        return plan(req).sources["activation"]

    assert source("0.16.0").endswith("sampler: sorting top-k/top-p)")
    assert source("0.19.0").endswith("sampler: Triton top-k/top-p)")
    assert source("0.31.0").endswith("sampler: Model Runner V2, in place)")


def vl_plan(model: str, version: str, *, eager: bool = False) -> tuple[int, str]:
    """Gemma 3's first-stage peak on one H100 at vLLM's defaults, and its encoder source."""
    req = PlanRequest(
        arch=parse_config(fixture_config(model), "model"),
        model_name="model",
        gpu=lookup_gpu("H100"),
        release=release(version),
        max_model_len=32_768,
        enforce_eager=eager,
    )
    out = plan(req)
    return out.stages[0].activation, out.sources["encoder_profile"]


def test_the_encoder_outputs_stay_allocated_under_the_forward_and_the_sampler() -> None:
    # profile_run keeps the dummy outputs in its encoder cache until the sampler is done.
    inputs = ActivationInputs(
        max_num_batched_tokens=2048,
        max_num_seqs=256,
        intermediate_size=6144,
        hidden_size=2048,
        vocab_size=151_936,
        dtype_bytes=2,
        tp=4,
        pp=1,
        encoder_elems=1000,
    )
    alone = activation_peaks(inputs, release("0.11.0"))[0]
    held = activation_peaks(replace(inputs, encoder_held_bytes=GIB), release("0.11.0"))[0]
    assert held == alone + GIB


def test_qwen3_vl_returns_its_deepstack_levels_with_each_image_token() -> None:
    arch = parse_config(fixture_config("Qwen__Qwen3-VL-8B-Instruct"), "model")
    # out_hidden_size 4,096 and three deepstack levels, concatenated (qwen3_vl.py).
    assert arch.vision_output_width == 4096 * 4
    # The largest image's 65,536 patches of 3 channels x 16 x 16 pixels x 2 frames.
    assert arch.vision_input_elems == 65_536 * 3 * 16 * 16 * 2


def test_vllm_0_11_pads_each_dummy_image_to_the_encoder_budget() -> None:
    # 32 images of 256 tokens, each copied into 8,192 rows of 5,376 bf16: +2.7 GiB held.
    padded, said = vl_plan("google__gemma-3-27b-it", "0.11.0")
    assert "each padded to the 8,192-token budget" in said
    arch = parse_config(fixture_config("google__gemma-3-27b-it"), "model")
    rows = 32 * 8192 + 256  # the padded copies, and the last output as the encoder gave it
    held = (rows * 5376 + 32 * arch.vision_input_elems) * 2
    assert arch.vocab_size is not None
    sampler = (36 + 2) * 1024 * arch.vocab_size  # sorting: 0.11.0 pip installs no FlashInfer
    assert padded == held + sampler


def test_model_runner_v2_profiles_no_encoder_before_0_27() -> None:
    # 0.25-0.26 serve every dense model with V2, whose profile_run skips the encoder. Eager,
    # so that the cold-compile residual riding on the forward pass does not hide the encoder.
    before, said = vl_plan("google__gemma-3-27b-it", "0.26.0", eager=True)
    after, _ = vl_plan("google__gemma-3-27b-it", "0.27.1", eager=True)
    assert said.startswith("none (Model Runner V2 profiles no encoder before 0.27")
    assert after - before > 2 * GIB
