"""What changed in vLLM's KV sizing from release to release.

Every version-dependent rule the capacity engine applies lives here, with the release it
changed in, so that a question like "which token formula does 0.19 print?" has one answer.
Sources: vLLM's own code, https://github.com/vllm-project/vllm read at the release tags
v0.6.0 to v0.33.0 and in the 0.34.0 wheel; a rule names the file (its path in that tree) and
the release it changed in. The start-ups it is checked against are
``tests/fixtures/sizing/vllm_startup_points.csv`` (each row with its public source).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from exporter.errors import InputError

Version = tuple[int, int, int]

OLDEST_KNOWN: Version = (0, 6, 0)
NEWEST_KNOWN: Version = (0, 34, 0)
DEFAULT_VERSION = "0.32.0"

# Model classes that implement SupportsMambaPrefixCaching (vllm/model_executor/models/, 0.27.1).
ALL_MODE_ARCHITECTURES = frozenset(
    {
        "FalconH1ForCausalLM",
        "GraniteMoeHybridForCausalLM",
        "JambaForCausalLM",
        "MambaForCausalLM",
        "Mamba2ForCausalLM",
        "NemotronHForCausalLM",
        "NemotronHPuzzleForCausalLM",  # registry.py maps it to NemotronHForCausalLM
        "Zamba2ForCausalLM",
    }
)
# The Qwen3.5 classes config.py updates, and from which release: the checkpoints' own
# (ConditionalGeneration) from 0.17, the text-only ones from 0.27.
QWEN3_5_ARCHITECTURES = {
    "Qwen3_5ForConditionalGeneration": (0, 17, 0),
    "Qwen3_5MoeForConditionalGeneration": (0, 17, 0),
    "Qwen3_5ForCausalLM": (0, 27, 0),
    "Qwen3_5MoeForCausalLM": (0, 27, 0),
}
# What a hybrid Mamba model's request holds of its recurrent state (kvcache.build_layout).
MambaCacheMode = Literal["none", "align", "all"]
NEMOTRON_H_ARCHITECTURES = frozenset({"NemotronHForCausalLM", "NemotronHPuzzleForCausalLM"})

_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:[.+\-]?(?:post|rc|dev|a|b)?\d*.*)?$")


def parse_version(text: str, where: str = "--vllm-version") -> Version:
    """``"0.19.0"``, ``"v0.10.1.1"``, ``"0.11.0rc1"`` → ``(0, 19, 0)``."""
    m = _VERSION_RE.match(text.strip())
    if not m:
        raise InputError(where, "", text, "not a vLLM release; write it like 0.19.0")
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))


def format_version(v: Version) -> str:
    return f"{v[0]}.{v[1]}.{v[2]}"


class TokenLine(StrEnum):
    """How the "KV cache size: N tokens" figure is derived."""

    BLOCKS_TIMES_SIZE = "num_blocks * block_size"  # V0, V1 0.7-0.8
    PER_GROUP = "num_blocks // num_groups * block_size"  # 0.9-0.20
    CONCURRENCY_TIMES_LEN = "int(max_concurrency * max_model_len)"  # 0.21+


class ConcurrencyLine(StrEnum):
    """How "Maximum concurrency for L tokens per request: X×" is derived."""

    TOKENS_OVER_LEN = "num_blocks * block_size / max_model_len"  # V0, V1 0.7-0.8
    BLOCKS_OVER_REQUEST = "num_blocks / blocks_per_request"  # 0.9+


# ``DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES`` in vllm/config/vllm.py of each release from 0.22
# to 0.28 (read in the released wheels; 0.29 removed the list), newest first.
_V2_DEFAULT_ARCHITECTURES: tuple[tuple[tuple[int, int, int], frozenset[str]], ...] = (
    (
        (0, 28, 0),
        frozenset(
            {
                "DeepseekV2ForCausalLM",
                "DeepseekV4ForCausalLM",
                "GraniteMoeForCausalLM",
                "InklingForCausalLM",
                "InklingForConditionalGeneration",
                "KimiK3ForConditionalGeneration",
                "LongcatFlashNgramForCausalLM",
                "Qwen2MoeForCausalLM",
            }
        ),
    ),
    (
        (0, 27, 0),
        frozenset(
            {
                "DeepseekV2ForCausalLM",
                "GraniteMoeForCausalLM",
                "InklingForCausalLM",
                "InklingForConditionalGeneration",
                "KimiK3ForConditionalGeneration",
                "LongcatFlashNgramForCausalLM",
                "Qwen2MoeForCausalLM",
            }
        ),
    ),
    (
        (0, 26, 0),
        frozenset(
            {
                "DeepseekV2ForCausalLM",
                "GraniteMoeForCausalLM",
                "InklingForCausalLM",
                "InklingForConditionalGeneration",
                "LongcatFlashNgramForCausalLM",
                "Qwen2MoeForCausalLM",
            }
        ),
    ),
    (
        (0, 25, 0),
        frozenset({"DeepseekV2ForCausalLM", "Qwen2MoeForCausalLM", "GraniteMoeForCausalLM"}),
    ),
    (
        (0, 24, 0),
        frozenset(
            {
                "Qwen3ForCausalLM",
                "DeepseekV2ForCausalLM",
                "Qwen2MoeForCausalLM",
                "GraniteMoeForCausalLM",
                "LlamaForCausalLM",
                "MistralForCausalLM",
            }
        ),
    ),
    ((0, 23, 0), frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM"})),
    ((0, 22, 0), frozenset({"Qwen3ForCausalLM"})),
)


@dataclass(frozen=True)
class Release:
    """The sizing rules of one vLLM release."""

    version: Version

    @property
    def known(self) -> bool:
        return OLDEST_KNOWN <= self.version <= NEWEST_KNOWN

    @property
    def label(self) -> str:
        return format_version(self.version)

    @property
    def default_gpu_memory_utilization(self) -> float:
        # vllm/config/cache.py: 0.9 until 0.19, 0.92 from 0.20.
        return 0.92 if self.version >= (0, 20, 0) else 0.9

    @property
    def ceil_requested_memory(self) -> bool:
        # vllm/v1/worker/utils.py::request_memory (0.14+) rounds the budget up.
        return self.version >= (0, 14, 0)

    @property
    def subtracts_cudagraph_estimate(self) -> bool:
        # VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS defaults to 1 from 0.20.0.
        return self.version >= (0, 20, 0)

    @property
    def v2_estimates_cudagraphs(self) -> bool:
        # Model Runner V2's profile_cudagraph_memory (vllm/v1/worker/gpu/model_runner.py)
        # returns 0 in 0.22-0.28 ("It is TBD whether we keep this API or not") and captures
        # graphs to measure them from 0.29 (vllm/v1/worker/gpu/cudagraph_utils.py).
        return self.version >= (0, 29, 0)

    @property
    def charges_compile_transient(self) -> bool:
        # The profile run's cold torch.compile peak is counted from the era it is measured
        # in (0.24-0.31 starts); before 0.20 the fixture's printed peaks meet the counted
        # forward and sampler without it, so it is not assumed there.
        return self.version >= (0, 20, 0)

    @property
    def hybrid_kv_cache_manager(self) -> bool:
        """Sliding/chunked layers get their own groups (before: every layer sized as full)."""
        return self.version >= (0, 10, 0)

    @property
    def hybrid_group_ratio(self) -> float | None:
        """``max_num_layers < ratio * min_num_layers`` selects the larger group size.

        Not present in 0.11 and before (``None``: always the smallest type's count);
        1.25 in 0.12-0.16; 1.5 from 0.18. 0.17 is taken as 1.5 (not read).
        """
        if self.version < (0, 12, 0):
            return None
        if self.version < (0, 17, 0):
            return 1.25
        return 1.5

    @property
    def token_line(self) -> TokenLine:
        if self.version >= (0, 21, 0):
            return TokenLine.CONCURRENCY_TIMES_LEN
        if self.version >= (0, 9, 0):
            return TokenLine.PER_GROUP
        return TokenLine.BLOCKS_TIMES_SIZE

    @property
    def concurrency_line(self) -> ConcurrencyLine:
        if self.version >= (0, 9, 0):
            return ConcurrencyLine.BLOCKS_OVER_REQUEST
        return ConcurrencyLine.TOKENS_OVER_LEN

    @property
    def v1(self) -> bool:
        # V1 became the default engine in 0.8.0.
        return self.version >= (0, 8, 0)

    @property
    def rejects_mismatched_float_kv_cache(self) -> bool:
        # vllm/config/vllm.py::_reject_mismatched_float_kv_cache (0.33).
        return self.version >= (0, 33, 0)

    @property
    def octave_kv_cache(self) -> bool:
        # octave_k3v4 / octave_k3v3 / octave_k3v3_compact (ROCM_OCTAVE backend), 0.33.
        return self.version >= (0, 33, 0)

    @property
    def hybrid_prefix_caching_default(self) -> bool:
        """Prefix caching is on by default for hybrid Mamba models (0.26+).

        ``ModelConfig.is_prefix_caching_supported`` (vllm/config/model.py) returns False
        for ``attn_type == "hybrid"`` in 0.16-0.25 ("still experimental") and True from
        0.26 (read in the 0.16-0.19, 0.22-0.31 and 0.33 wheels).
        """
        return self.version >= (0, 26, 0)

    def mamba_cache_mode(
        self, prefix_caching: bool, architectures: Sequence[str]
    ) -> MambaCacheMode:
        """What a hybrid Mamba model's request holds of its state (kvcache.MambaCacheMode).

        ``MambaModelConfig.verify_and_update_config`` (model_executor/models/config.py):
        with prefix caching, 0.16-0.27 choose "all" for a model class that implements
        ``SupportsMambaPrefixCaching`` (``ALL_MODE_ARCHITECTURES``, read in 0.27.1) and
        "align" otherwise; 0.28 on choose "align". Without it, "none". Releases before
        0.16 were not read: "none".
        """
        if not prefix_caching or self.version < (0, 16, 0):
            return "none"
        if self.version < (0, 28, 0) and set(architectures) & ALL_MODE_ARCHITECTURES:
            return "all"
        return "align"

    def config_ssm_dtype(
        self, architectures: Sequence[str], mamba_ssm_dtype: str | None, nemotron: str | None
    ) -> str | None:
        """The SSM state dtype vLLM takes from the model's config when the flag is "auto".

        model_executor/models/config.py: ``Qwen3_5ForConditionalGenerationConfig`` (0.17+;
        0.16 has no Qwen3.5 entry) takes ``text_config.mamba_ssm_dtype`` (float32 in every
        Qwen3.5 checkpoint); ``NemotronHForCausalLMConfig`` takes the config's
        ``mamba_ssm_cache_dtype`` or float16 (0.16-0.19), float32 (0.22+). None: the
        model dtype, as the conv state.
        """
        names = set(architectures)
        if any(self.version >= since for a, since in QWEN3_5_ARCHITECTURES.items() if a in names):
            return mamba_ssm_dtype
        if names & NEMOTRON_H_ARCHITECTURES and self.version >= (0, 16, 0):
            return nemotron or ("float32" if self.version >= (0, 22, 0) else "float16")
        return None

    @property
    def mamba2_prefill_checkpoint(self) -> bool:
        """A Mamba2 layer exports a prefill checkpoint with prefix caching (0.32+).

        ``MambaMixer2.get_kv_cache_spec`` (model_executor/layers/mamba/mamba_mixer2.py)
        sets ``num_prefill_checkpoint_blocks=1`` with alignment 1 in 0.32 and 0.33; 0.29-0.31
        declare the field and leave it 0. In "align" mode a request then holds 3 state blocks.
        """
        return self.version >= (0, 32, 0)

    @property
    def gdn_warmup_in_profile(self) -> bool:
        """Gated DeltaNet layers autotune their Triton prefill kernels inside the profile run
        (0.18+).

        vLLM PR 36599: ``_forward_core`` calls ``_warmup_prefill_kernels`` when the profile
        run passes no attention metadata (model_executor/models/qwen3_next.py in 0.18; in
        0.28 model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py), inside
        ``memory_profiling``; 0.17.0 and 0.17.1 have no warmup. Hopper, and in 0.28
        datacenter Blackwell with 128-dim keys on CUDA 13, run FlashInfer's GDN kernel
        instead (``_resolve_gdn_prefill_backend``), which is not autotuned.
        """
        return self.version >= (0, 18, 0)

    @property
    def gdn_checkpoint_alignment(self) -> int | None:
        """Block alignment the FlashInfer GDN prefill adds with Mamba prefix caching.

        0.33 (platforms/interface.py::_align_hybrid_block_size): with mamba_cache_mode
        "align" the attention block is a multiple of lcm(kernel block, 64), and each
        request holds 2 + 1 checkpoint Mamba blocks. Earlier releases were not read.
        """
        return 64 if self.version >= (0, 33, 0) else None

    @property
    def sorting_sampler(self) -> bool:
        """The profile run's top-k/top-p goes through the sorting path (0.11.1-0.16).

        Read from vLLM's code, not fitted (no fixture row in the window prints what the
        peak is made of): on CUDA, V1's ``TopKTopPSampler`` samples sort-free through
        FlashInfer when it is present (vLLM PR 11394) until vLLM PR 26859 (merged
        2025-10-15, after 0.11.0 was tagged) turned that default off, which leaves
        ``forward_native``: ``apply_top_k_top_p_pytorch`` runs ``logits.sort`` over the
        whole vocabulary (fp32 values, int64 indices) for the profile's dummy top-k/top-p
        batch. vLLM PR 33538 (2026) replaced that sort with a Triton top-k/top-p kernel;
        0.17 as the first release without it is llm-d-planner's vLLM-version sweep
        (github.com/llm-d-incubation/llm-d-planner@8f9dbb8,
        ``accuracy/scripts/sweep-versions.yaml``: Qwen3-14B on one H100, vLLM 0.15-0.18),
        where the activation peak drops from 5.64 to 2.23 GiB between 0.16 and 0.17 at
        the same ``max_num_batched_tokens``. Before 0.11.1 V1 is sort-free only where
        FlashInfer is installed (``memory.sampler_path``): the 0.10.1.1 A100 starts that log
        "Using FlashInfer" leave room for nothing larger (dennislee22/vLLM-benchmarking).
        """
        return (0, 11, 1) <= self.version < (0, 17, 0)

    @property
    def extensible_kv_cache(self) -> bool:
        """The cache is sized after warmup by default on CUDA and ROCm (0.34).

        vllm/config/vllm.py::_resolve_extensible_kv_cache turns ``enable_extensible_kv_cache``
        on where unset unless the platform is neither CUDA nor ROCm, or
        ``--kv-cache-memory-bytes`` or ``--num-gpu-blocks-override`` is given (or elastic EP,
        a legacy-IPC or custom-pool KV connector: not modelled). Then
        vllm/v1/worker/extensible_kv_cache.py::measure_kv_cache_bytes sizes the cache from
        the memory free after warmup and CUDA-graph capture: ``min(requested − non-KV used,
        free + committed − margin) − max(T, torch reservation growth)``, the margin
        ``max(1 GiB, 0.75 T)`` (3 GiB on ROCm, ``KV_CACHE_MARGIN_FLOOR_BYTES``), ``T`` the
        largest transient peak of the profile run and the warmup steps, and
        config/cache.py::resolved_gpu_memory_utilization makes an unset utilization 1.0.
        Read in the 0.34.0 wheel against 0.33.0's."""
        return self.version >= (0, 34, 0)

    @property
    def charges_total_consumed(self) -> bool:
        """The budget charges everything the instance took since its start-up snapshot
        (0.27+): ``memory_profiling``'s ``total_consumed``, from ``cudaMemGetInfo``
        (vllm/utils/mem_utils.py, first in the 0.27.0 wheel; 0.26 charged the weights, the
        torch peak's increase and the non-torch increase). Memory torch holds past the
        weights' measurement and before the profile run now counts."""
        return self.version >= (0, 27, 0)

    @property
    def v2_profiles_encoder(self) -> bool:
        """Model Runner V2's profile run encodes dummy multimodal items (0.27+).

        ``vllm/v1/worker/gpu/model_runner.py::GPUModelRunner.profile_run`` of 0.22-0.26
        runs the dummy forward and sampler only; 0.27.1 first calls
        ``encoder_runner.profile_encoder_cache`` on the first PP rank (read in the 0.22,
        0.24-0.29 and 0.32 wheels). A multimodal model that V2 serves in 0.22-0.26 (every
        dense one from 0.25) therefore charges no encoder peak at all."""
        return self.version >= (0, 27, 0)

    @property
    def encoder_profile_pads_to_budget(self) -> bool:
        """The V1 runner's profile run copies each dummy encoder output into a zero tensor
        of the whole encoder budget's rows when it has fewer (0.11.0-0.11.2).

        ``vllm/v1/worker/gpu_model_runner.py::profile_run``: vLLM PR 25810 (merged
        2025-09-27) added ``expanded = output.new_zeros((encoder_budget, ...))`` per item
        and keeps them in ``encoder_cache["tmp"]`` through the dummy forward and sampler;
        0.12.0 pads to the modality's most tokens per item instead (vLLM PR 29386, "Fix
        overallocation in MM profiling"), which the largest image already has; 0.13.0
        stores the outputs as they are (``encoder_cache[f"tmp_{i}"] = output``)."""
        return (0, 11, 0) <= self.version < (0, 12, 0)

    def v2_model_runner(
        self, architectures: tuple[str, ...], moe: bool, quantized: bool, hybrid: bool = False
    ) -> bool:
        """vLLM runs this model with Model Runner V2 (``vllm/v1/worker/gpu/``) by default.

        ``vllm/config/vllm.py::VllmConfig.use_v2_model_runner`` and
        ``_is_default_v2_model_runner_model`` with ``VLLM_USE_V2_MODEL_RUNNER`` unset, read
        in each release's wheel: before 0.22 the env default is off. 0.22-0.24 turn it on
        for the architectures in ``DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES`` (0.22 and 0.23
        only where the model is neither MoE nor quantized). 0.25-0.27 add every dense model
        that is not hybrid (``listed or not model_config.is_moe``); 0.28 lets a listed hybrid
        in. From 0.29 the list is gone and every model on CUDA takes V2 unless it asks for a
        feature V2 lacks (``_get_v2_model_runner_unsupported_features``: some speculative
        methods, DBO micro-batching, custom logits processors; not modelled). vLLM's blog
        "From Opt-In to Default: Migrating vLLM to Model Runner V2" (2026-08-31) dates the
        same stages (Qwen3 canary, Llama and Mistral, Qwen and DeepSeek-V2 MoE, quantized,
        all dense models, all families "first tagged release ... v0.29.0"), and V2 logs
        "Using V2 Model Runner" at start-up (vllm/v1/worker/gpu_worker.py, 0.16+). Its
        profile run samples differently (``memory.sampler_path``).
        """
        if self.version >= (0, 29, 0):
            return True
        listed_names = next(
            (names for since, names in _V2_DEFAULT_ARCHITECTURES if self.version >= since), None
        )
        if listed_names is None:
            return False
        listed = bool(set(architectures) & listed_names)
        if self.version >= (0, 25, 0):
            if hybrid and not (listed and self.version >= (0, 28, 0)):
                return False
            return listed or not moe
        if not listed:
            return False
        return self.version >= (0, 24, 0) or not (moe or quantized)

    def v0_engine_on(self, gpu_family: str) -> bool:
        """The V0 engine serves this start: every release before 0.8, and 0.8-0.10 on GPUs
        below compute capability 8.0 (Volta, Turing), where ``engine/arg_utils.py`` logs
        "Compute Capability < 8.0 is not supported by the V1 Engine. Falling back to V0"
        (public start-ups under 0.8.2, 0.8.5 and 0.10.1.1 print it); 0.11 removed V0."""
        return not self.v1 or (self.version < (0, 11, 0) and gpu_family in ("volta", "turing"))

    def mxfp4_marlin_on(self, gpu_family: str) -> bool:
        """MXFP4 MoE experts load for the Marlin kernel on this GPU (weight-only FP4).

        vllm/model_executor/layers/quantization/mxfp4.py::get_mxfp4_backend: without native
        FP4 (before Blackwell) on CUDA, the Triton ``matmul_ogs`` path needs the
        ``triton_kernels`` package and compute capability 9.x-10.x; anything else takes
        Marlin. ``pip install vllm`` did not bring ``triton_kernels`` before 0.14: vLLM PR
        27370 (2025-10-22) made it a dependency, its install failures (issue 27573) kept it
        out (issue 27672, 2025-10-28: "users will have to install triton_kernels manually"),
        and a copy vendored as ``vllm/third_party/triton_kernels`` arrived in the 0.14 cycle
        (stepfun-ai/Step3-VL-10B issue 10: "vLLM >= 0.14.0rc2.dev143"). So Hopper ran
        Marlin until then: gpt-oss-120b on one H100 logs the Marlin fallback under 0.10.1
        and loads 65.97 GiB (issue 23278), and 64.38 GiB under 0.14.1 (issue 33155).
        Ampere and Ada always take Marlin (MXFP4 needs capability 8.0); ROCm and Blackwell
        do not.
        """
        if gpu_family in ("ampere", "ada"):
            return True
        return gpu_family == "hopper" and self.version < (0, 14, 0)

    @property
    def medusa_speculators(self) -> bool:
        """``--speculative-config`` takes "medusa" and "mlp_speculator" (0.32 and before).

        0.33 dropped both from ``SpeculativeMethod`` (vllm/config/speculative.py) and deleted
        ``MedusaProposer`` (vllm/v1/worker/gpu_model_runner.py), so they no longer start.
        """
        return self.version < (0, 33, 0)

    @property
    def draft_lm_head_quantization(self) -> bool:
        """``draft_lm_head_quantization`` in ``--speculative-config`` (new in 0.33): an EAGLE
        or MTP drafter gets a quantized copy of the target's LM head
        (vllm/v1/worker/gpu/spec_decode/eagle/utils.py::load_eagle_model)."""
        return self.version >= (0, 33, 0)

    @property
    def sampler_warmup_pass(self) -> bool:
        # 0.33's V2 runner runs a second, full-feature sampler pass in the profile run.
        return self.version >= (0, 33, 0)

    @property
    def cublas_in_baseline(self) -> bool:
        # 0.33 creates the cuBLAS/cuBLASLt handles before the start-up memory snapshot.
        return self.version >= (0, 33, 0)

    def in_flight_batches(
        self, pipeline_parallel_size: int, async_scheduling: bool, v2_runner: bool = False
    ) -> int:
        """``max_concurrent_batches``: how many batches of tokens a window must cover.

        Up to 0.25 a sliding window reserves ``W - 1 + max_num_batched_tokens``
        (``SlidingWindowSpec.max_memory_usage_bytes``); from 0.26 it is
        ``max_in_flight_tokens`` = batches × max_num_batched_tokens
        (vllm/v1/kv_cache_interface.py::SlidingWindowSpec.max_admission_blocks_per_request
        and vllm/config/vllm.py::VllmConfig.max_concurrent_batches, read in 0.26, 0.27.0,
        0.27.1, 0.28, 0.29, 0.32, 0.33): with async scheduling, Model Runner V2 keeps pp + 1
        batches in flight and the V1 runner 2 at pp=1; otherwise pp. (With PP the V1 runner
        turns async scheduling off by default, ``_set_default_async_scheduling``; V2 keeps
        it on.) A public 0.26 start of Gemma-4-31B (16,384 tokens, 8,192 batched, async, V1)
        printed 13.25x, what two batches in flight give its 50 sliding layers.
        """
        if self.version < (0, 26, 0):
            return 1
        if async_scheduling and v2_runner:
            return pipeline_parallel_size + 1
        if pipeline_parallel_size > 1:
            return pipeline_parallel_size
        return 2 if async_scheduling else 1


def release(text: str, where: str = "--vllm-version") -> Release:
    return Release(parse_version(text, where))
