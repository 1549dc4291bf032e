"""The per-GPU memory budget vLLM leaves for the KV cache, and a model of what it subtracts.

vLLM (vllm/v1/worker/gpu_worker.py::determine_available_memory):

    requested = ceil(total × gpu_memory_utilization)          # plain product before 0.14
    available = requested − weights − activation peak − non-torch [− CUDA-graph estimate]

``total`` is the device memory CUDA reports; what was already in use when the worker took
its start-up snapshot (the CUDA context, from 0.11 NCCL) is not charged. From 0.34 the cache
is sized after warmup by default (the extensible KV cache,
vllm/v1/worker/extensible_kv_cache.py::measure_kv_cache_bytes): the utilization defaults to
1.0 and the device caps the ceiling, ``min(requested, total − context − max(1 GiB, 0.75 ×
activation peak))`` (``StageMemory.device_cap``; a 3 GiB floor on ROCm). The weights are
known or estimated (weights.py). The other three terms are measured by vLLM during its
profile run; this module models them:

* **activation peak** — the profile run pushes ``max_num_batched_tokens`` tokens through
  the model (peak ``F``, set by the MLP width) and, on the last PP stage, samples one
  token for each of ``min(max_num_seqs, max_num_batched_tokens)`` dummy requests over the
  full vocabulary (peak ``S``, set by requests × vocabulary; with top-k/top-p on the V1
  runner and V0, without on Model Runner V2). The two do
  not overlap, so a single stage peaks at ``max(F, S)``; a last PP stage also keeps the
  hidden-state and residual buffers it receives from the previous stage.
  ``S`` is the model-dtype logits plus what the sampler holds at its peak, per (dummy
  request × vocabulary entry), counted from vLLM's code of the path the start takes
  (``sampler_path``, ``sampler_bytes``; nothing here is fitted): the V1 runner's dummy
  requests ask for top-k and top-p, so sorting (V0 always, V1 0.11.1-0.16, and before 0.11.1
  without FlashInfer) holds 36 B beyond the logits, FlashInfer's sampler (V1 before 0.11.1)
  and 0.17's Triton kernel 12 B; Model Runner V2 (``Release.v2_model_runner``: listed
  architectures from 0.22, every dense model from 0.25, every model from 0.29) samples the
  dummy logits in place, 0 B (4 B in
  0.22-0.25, which copied them to fp32). The counts meet the measurements:
  llm-d-planner's Qwen3-14B on one H100 (1,024 × 151,936 entries) peaked at 5.64 GiB under
  0.16 and 2.23 GiB under 0.17, the counts say 5.51 and 2.03 GiB; the fixture starts that
  print their peak give 36.4-37.2 B (sorting) and 11.6-11.8 B (FlashInfer). The 0.17+
  coefficient this replaces (29.79 B, fitted by 962cba7 to five starts of 0.19-0.31) had
  absorbed the CUDA-graph estimate below, which does not scale with the vocabulary, and
  starts that 0.25+ runs on V2, whose sampler adds nothing.

  ``F = tokens × dtype bytes × (3 × intermediate / TP + 3 × hidden)``, counted from the
  eager decoder layer (vllm/model_executor/models/llama.py, ``LlamaMLP.forward`` and
  ``LlamaDecoderLayer.forward``, the same shape in the other dense and MoE models): the MLP
  keeps ``gate_up`` (2 × intermediate) alive while ``act_fn``'s output (1 ×) goes through
  ``down_proj``, whose output (hidden) sits beside the layer's input and the residual
  stream (2 × hidden); the RMS norms work in place. Not fitted: it meets the V0 starts whose
  forward pass sets the printed peak, vLLM issue 10517 (Llama-3.1-8B on an RTX 3090, 20,000
  and 29,000 profile tokens: 3.88 and 3.86 B per token × intermediate × dtype byte
  printed, 3.86 counted) and Qwen2.5-7B on an RTX 3090 under 0.6.6 (8,192 tokens: 3.77
  printed, 3.57 counted). It replaces a slope fitted to those three rows of two families.
  The encoder profile pushes the largest item of the modality with the most tokens (the
  largest image; Gemma 4's 32-frame video) through the vision tower, counted the same
  way at SigLIP's shape (intermediate 4,304, hidden 1,152: 3.80 B per patch × MLP width ×
  dtype byte; Gemma-3-27B's vision profile on an H100 then comes to 4.00 GiB, where a
  recent release's log printed a 3.99 GiB torch peak increase, per issue 35). Its outputs
  stay in the encoder cache under the dummy forward and the sampler (with the V1 runner
  the dummy pixel values too, and in 0.11 each output padded to the encoder budget), so
  a multimodal first stage peaks at ``max(E, held + max(F, S))``; Model Runner V2 before
  0.27 profiles no encoder (``plan._encoder_profile``, ``Release.v2_profiles_encoder``).
* **non-torch memory** — allocations outside PyTorch after the snapshot, by release era
  (``non_torch_*_by_era``), each the mean of the fixture rows of that era that print it.
  V0 has two accountings. Up to 0.6.4 the worker charged everything on the device that
  PyTorch had not allocated (``mem_get_info`` used less ``allocated_bytes.all.current``,
  the "Memory profiling results: ... non_torch_memory=" line), the process's CUDA
  context included: 0.35 GiB (issue 10517's RTX 3090 starts under 0.6.4, twice). vLLM PR
  10511 (merged 2024-12-16, in 0.6.5) measures only the growth over a baseline taken when
  the worker initialises the device (vLLM issue 12059 describes that baseline), which
  leaves the context out: 0.10 GiB (Qwen2.5-7B under 0.6.6). The context is about 300 MiB
  with CUDA's lazy module loading (PyTorch issue 107667, NVIDIA's ptrblck; llama.cpp PR
  20595 gives 120-550 MB by GPU). With TP > 1 each V0 era adds 1.79 GiB per GPU: the TP2
  − TP1 difference of the non-torch figures vLLM PR 10511 printed for Llama-3-8B on an
  H100 under 0.6.x, whose accounting still held NCCL's buffers; no fixture row measures
  it. Releases before 0.6.4 (their worker charged the drop in free memory since device
  start-up) are not read and take 0.6.4's figures. 0.8-0.26: 0.11 GiB on one GPU (Llama-3.2-3B
  under 0.8.2: 0.05; Qwen2.5-7B-AWQ under 0.26: 0.06; Llama-3.1-8B on an A40 under 0.26: 0.08;
  Gemma-4-31B on a B300 under 0.26: 0.25) and 0.19 GiB per GPU with TP > 1 (printed: Qwen3-235B
  TP8 under 0.10.2, 0.21; Qwen3-30B-A3B TP4 under 0.8.5, 0.20 twice; and what printed weights, KV
  memory and the modelled peak leave of the ceiling in the TP starts that print no breakdown:
  Qwen2-7B TP2 under 0.10.1.1, 0.16, 0.17 and 0.17; gpt-oss-120b TP4 under 0.10.1.1, 0.19) — the
  V0 comm-buffer figure does not carry over. From 0.27.0
  (``memory_profiling`` in vllm/utils/mem_utils.py and ``determine_available_memory``
  in vllm/v1/worker/gpu_worker.py, read in the 0.26.0, 0.27.0 and 0.27.1 wheels: 0.26
  still prints "for weight, ... for non-torch memory") vLLM charges
  everything the instance took since the snapshot (``total_consumed``, from
  ``cudaMemGetInfo``), so memory PyTorch keeps reserved past the weights counts too. Model
  Runner V2's sampling state is part of it and is counted from the code
  (``sampler_state_bytes``: max_num_seqs × the vocabulary in int32, and more); the
  residual is 0.31 GiB on one GPU, the mean of the "consumed memory" less the weights and
  that state of the seven 0.27+ starts that print both, three families (Llama-3.1-8B on an
  A100 under 0.31: 15.26 − 15.0 − 0.13 = 0.13; Qwen3-14B and -AWQ on an L40S under 0.29:
  0.11, 0.13, and 0.19 with 512 sequences, whose 0.51 printed holds 0.32 of state; Qwen3-8B
  and Qwen3-1.7B on an RTX 4090 under 0.27.1: 0.11 and 4.11 − 3.22 − 0.16 = 0.73;
  gpt-oss-20b, MXFP4 through Marlin, on the V1 runner, which keeps no such state, on an L40
  under 0.28: 14.48 − 13.7 = 0.78). Without the 1.7B and gpt-oss-20b the five agree to
  0.11-0.19. 0.57 GiB per GPU with TP > 1, from the three 0.27+ TP starts, all on one box
  of RTX PRO 6000 cards without NVLink under 0.27.1: Qwen3-235B-A22B-FP8 TP4 (V1) prints
  56.89 − 55.19 = 1.70, the same deployment with expert parallelism leaves 0.63 and
  Qwen3-32B TP2 −0.62 (its counted peak is too high at TP2: below), a residual with no more
  evidence than that. A PP stage's worker accounts like one GPU's.
* **CUDA-graph estimate** — subtracted from 0.20 unless ``--enforce-eager``
  (``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` defaults to 1 from 0.20), and not on Model
  Runner V2 before 0.29: its ``profile_cudagraph_memory`` (vllm/v1/worker/gpu/
  model_runner.py, 0.22-0.28) returns 0 ("It is TBD whether we keep this API or not"),
  so those starts print no "CUDA graph memory profiling is enabled" line and their budget
  is the ceiling less weights, peak and non-torch memory to the hundredth (Llama-3.1-8B on
  an A40 under 0.26: 39.99 − 15.0 − 1.01 − 0.08 = 23.90); from 0.29 V2 captures graphs to
  measure them (vllm/v1/worker/gpu/cudagraph_utils.py). vLLM measures it by capturing
  graphs, so it is not computable from a config: 0.575 GiB, the median of the eight
  printed estimates of tests/fixtures/sizing/cudagraph_estimates.csv that came off the
  budget (0.08-1.56 GiB; Gemma-4-31B's 0.76 and gpt-oss-20b's 0.30 are start-up rows too),
  not refit. The V1 runner's
  ``GPUModelRunner.profile_cudagraph_memory`` (vllm/v1/worker/gpu_model_runner.py, 0.18+)
  charges the largest first capture plus, per mode, (graphs - 1) x the second capture, so
  the estimate follows the graphs ``max_num_seqs`` makes it capture
  (vllm/config/vllm.py::_set_cudagraph_sizes); a per-layer-and-graph count fitted to the
  printed estimates failed issue 35's out-of-era bar (docs/plan.md), so the median stays.
* **cold torch.compile** — from 0.20 unless ``--enforce-eager`` (which sets
  ``compilation_config.mode`` to NONE: vllm/config/vllm.py, 0.29), the first call of the
  ``support_torch_compile`` model (vllm/compilation/decorators.py, ``__call__``) runs
  inside ``profile_run``, inside ``memory_profiling``, whose peak statistics are reset on
  entry (vllm/utils/mem_utils.py, 0.26; from 0.27 the same high-water mark is charged as
  ``transient_peak_headroom``): on an empty compile cache Dynamo, Inductor's compile and
  autotuning (vllm/config/compilation.py, 0.29, turns on ``combo_kernels`` and
  ``benchmark_combo_kernel``) and the AOT artifact's save are charged as activation. It
  peaks in the forward pass, so it rides on ``F``, not on the sampler's peak. No code
  sizes it: a residual, 0.83 GiB per worker (every TP rank and PP stage compiles and tunes
  its own kernels), the mean of the twelve one-GPU 0.20+ starts that print their weights and
  have no vision tower, four families (GiB: Qwen3-14B and -AWQ on an L40S under 0.28: 1.13,
  1.15; under 0.29: 1.07, 1.12, and 0.58 with 512 sequences and 8,192 batched tokens;
  Qwen3-8B and Qwen3-1.7B on an RTX 4090 under 0.27.1: 0.78, 0.91; gpt-oss-20b on an L40
  under 0.28: 0.96; Llama-3.1-8B under 0.26 on an A40: 0.73, under 0.31 on an A100: 0.44;
  Qwen2.5-7B-AWQ on an RTX 4080 under 0.26: 0.73; Qwen2.5-7B on an RTX 4090 under 0.24:
  0.41), each read from the KV memory, refit by ``benchmarks/plan_accuracy.py``.
  One figure rather than one per layer × MLP width ÷ TP (the form until stop 53): the
  transient does not grow with the model. Qwen3-1.7B's (0.91 GiB) is about Qwen3-14B's
  (1.1) at a quarter of its layers × width; Qwen3-32B, at 2.4 times the 14B's, leaves none
  at TP2 and PP2 and 1.5 GiB in its refused one-GPU start on an RTX PRO 6000 under 0.27.1
  (3.86 GiB charged beyond the weights: 3.18 counted with this figure, 5.42 with the
  per-layer one, which charges it 3.1 GiB).
  It depends on the compile cache's state, not only on the config:
  vLLM issues 54122 and 54383 (PRs 54209, 54479, open) report warm restarts getting back
  0.47 GiB per GPU (Qwen3-32B-AWQ TP2, 0.28) and more, so the residual describes cold
  starts (a warm restart keeps up to about that much more KV memory than planned).

``benchmarks/plan_accuracy.py`` measures the error of the whole model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from exporter.capacity.gpus import GIB
from exporter.capacity.releases import Release


@dataclass(frozen=True)
class OverheadModel:
    """The calibrated coefficients of the model above (bytes; see the module docstring)."""

    # The forward pass's live activations per batched token, in intermediate-wide and
    # hidden-wide copies (see the module docstring; counted, not fitted).
    forward_mlp_copies: float = 3.0
    forward_hidden_copies: float = 3.0
    # The vision tower's per (patch × MLP width × dtype byte), the same count at SigLIP's
    # shape: 3 + 3 × 1,152 / 4,304.
    encoder_bytes: float = 3.0 + 3.0 * 1152 / 4304
    # The sampler's bytes per (dummy request × vocabulary entry) beyond the model-dtype
    # logits, by the path the start takes (``sampler_path``). Each is counted from the
    # tensors vLLM's code of that path holds at its peak (see ``sampler_bytes``); none is
    # fitted to a start-up.
    sampler_sort_bytes: float = 36.0  # sorting: fp32 copy 4, sort out 12, sort temporaries 20
    sampler_fixed_bytes: float = 12.0  # FlashInfer (V1 before 0.11.1): fp32 copy, mask, probs
    sampler_kernel_bytes: float = 12.0  # Triton kernel (V1 0.17+): fp32 copy, probs, noise
    sampler_v2_bytes: float = 0.0  # Model Runner V2: the logits are sampled as they are
    sampler_v2_copy_bytes: float = 4.0  # ... but 0.22-0.25 copy them to fp32 first
    sampler_dtype_bytes: float = 1.0  # ... plus the model-dtype logits, per dtype byte
    # The CUDA-graph estimate vLLM subtracts: the median of the printed ones (see above).
    cuda_graph: int = int(0.575 * GIB)
    # The profile run's first torch.compile on a cold cache, on top of the forward pass, per
    # worker: a residual with its rows (see above).
    compile_bytes: float = 0.83 * GIB
    # The form shipped until stop 53, per (decoder layer of the stage × MLP width ÷ TP):
    # 0 here, kept only so that the fuzz tier's pinned engines stay where they were placed
    # (simulator/family.py, TIER_OVERHEAD).
    compile_layer_width_bytes: float = 0.0
    # 0.33, modelled in direction only (no 0.33 GPU start-up measured): the second,
    # full-feature sampler pass keeps one more fp32 logits copy (4 B per request × vocab
    # entry), and the cuBLAS/cuBLASLt handles (their 32 MiB Hopper workspace) move into
    # the start-up baseline, out of non-torch memory.
    sampler_warmup_bytes: float = 4.0
    cublas_baseline: int = 32 << 20
    # Model Runner V2's persistent sampling state (``sampler_state_bytes``), counted from
    # the code; off only where a caller pins an older model (the fuzz tier).
    v2_sampler_state: bool = True
    # Structural terms, not fitted (no start-up of such a model is in the fixtures): the
    # encoder profile run pushes the largest image through the vision tower, whose MLP
    # peaks like the language model's (encoder_bytes above); soft-capped
    # logits (Gemma 2: tanh(x / c) · c in compute_logits) hold three model-dtype copies
    # at once, freed before sampling starts.
    softcap_copies: int = 3
    non_torch_single_by_era: tuple[tuple[tuple[int, int, int], int], ...] = (
        ((0, 27, 0), int(0.31 * GIB)),  # total_consumed less the weights (see above)
        ((0, 8, 0), int(0.11 * GIB)),
        ((0, 6, 5), int(0.10 * GIB)),  # V0 after vLLM PR 10511: growth over the baseline
        ((0, 0, 0), int(0.35 * GIB)),  # V0 before it: all device memory outside torch
    )  # on one GPU and per PP stage, (first release, bytes), newest first
    non_torch_tp_by_era: tuple[tuple[tuple[int, int, int], int], ...] = (
        ((0, 27, 0), int(0.57 * GIB)),
        ((0, 8, 0), int(0.19 * GIB)),
        ((0, 6, 5), int(0.10 * GIB) + int(1.79 * GIB)),  # + vLLM PR 10511's comm buffers
        ((0, 0, 0), int(0.35 * GIB) + int(1.79 * GIB)),
    )  # per GPU with TP > 1, (first release, bytes), newest first


DEFAULT_OVERHEAD = OverheadModel()


def requested_memory(total_bytes: int, utilization: float, release: Release) -> int:
    """The per-instance ceiling: ``ceil(total × utilization)`` (0.14+), else the product."""
    product = total_bytes * utilization
    return math.ceil(product) if release.ceil_requested_memory else int(product)


@dataclass(frozen=True)
class ActivationInputs:
    max_num_batched_tokens: int
    max_num_seqs: int
    intermediate_size: int
    hidden_size: int
    vocab_size: int
    dtype_bytes: int
    tp: int
    pp: int
    logits_softcap: bool = False  # Gemma 2: tanh soft-capping writes one more fp32 copy
    encoder_elems: int = 0  # a vision tower's profile: patches × MLP width (0: text only)
    # What the encoder profile leaves allocated while the dummy forward and the sampler
    # run (plan._encoder_profile): the cached outputs, padding, the dummy pixel values.
    encoder_held_bytes: int = 0
    v0_engine: bool = False  # V0's sampler sorts (Release.v0_engine_on)
    flashinfer_installed: bool | None = None  # None: pip install vllm's default
    v2_runner: bool = False  # Model Runner V2 serves it (Release.v2_model_runner)
    # torch.compile runs in the profile run and is charged (not eager, 0.20+)
    compiled: bool = False
    # The stage's decoder layers × MLP width ÷ TP (plan.compile_elems), which only the
    # retired per-layer × width form (``compile_layer_width_bytes``) is charged by
    compile_elems: int = 0


def activation_peaks(
    inputs: ActivationInputs, release: Release, model: OverheadModel = DEFAULT_OVERHEAD
) -> tuple[int, ...]:
    """Modelled torch peak increase of the profile run, per PP stage (bytes)."""
    a = inputs
    # A cold torch.compile peaks inside the profile run's first forward, and is freed
    # before the sampler runs: on the forward's side of the max, not on top of both.
    forward = forward_bytes(a, model) + compile_transient_bytes(a, model)
    requests = min(a.max_num_seqs, a.max_num_batched_tokens)
    path = sampler_path(release, a.v0_engine, a.flashinfer_installed, a.v2_runner, requests)
    per_entry = sampler_bytes(path, release, model) + model.sampler_dtype_bytes * a.dtype_bytes
    if release.sampler_warmup_pass:
        per_entry += model.sampler_warmup_bytes
    sampler = per_entry * requests * a.vocab_size
    copies = model.softcap_copies if a.logits_softcap else 1
    logits = copies * a.dtype_bytes * requests * a.vocab_size
    sampler = max(sampler, logits)  # the logits phase ends before the sampler's begins
    encoder = model.encoder_bytes * a.encoder_elems * a.dtype_bytes / a.tp
    # The vision tower runs on the first stage, before the dummy forward; what it leaves
    # in the encoder cache stays until the profile run ends (profile_run's
    # ``encoder_cache.clear()`` after the sampler), under both later peaks.
    held = a.encoder_held_bytes
    first = max(encoder, held + forward)
    if a.pp == 1:
        return (int(max(encoder, held + max(forward, sampler))),)
    received = 2 * a.max_num_batched_tokens * a.hidden_size * a.dtype_bytes
    last = sampler + received
    if a.compiled:  # every stage compiles its own layers
        last = max(last, forward)
    return tuple([int(first)] + [int(forward)] * (a.pp - 2) + [int(last)])


def compile_transient_bytes(a: ActivationInputs, model: OverheadModel = DEFAULT_OVERHEAD) -> float:
    """The cold torch.compile's transient on top of the forward pass (see the module
    docstring): a residual per worker, 0 where nothing is compiled."""
    if not a.compiled:
        return 0.0
    return model.compile_bytes + model.compile_layer_width_bytes * a.compile_elems


def forward_bytes(a: ActivationInputs, model: OverheadModel = DEFAULT_OVERHEAD) -> float:
    """The dummy forward pass's peak: intermediate-wide copies sharded over TP, hidden-wide
    copies not (see the module docstring)."""
    per_token = (
        model.forward_mlp_copies * a.intermediate_size / a.tp
        + model.forward_hidden_copies * a.hidden_size
    )
    return a.max_num_batched_tokens * per_token * a.dtype_bytes


def sampler_path(
    release: Release,
    v0_engine: bool,
    flashinfer_installed: bool | None,
    v2_runner: bool = False,
    requests: int = 256,
) -> str:
    """The path the profile run's dummy sampler takes, read from each release's code.

    The V1 runner's ``_dummy_sampler_run`` (vllm/v1/worker/gpu_model_runner.py, 0.8-0.32)
    samples every dummy request with temperature 0.5, ``top_k = vocab - 1`` and
    ``top_p = 0.9``, no penalties and no logprobs; V0's profile run
    (vllm/worker/model_runner.py::profile_run) gives its dummy sequences top-k and top-p
    too. Which code then filters:

    ``sorting``: V0's ``Sampler._apply_top_k_top_p`` (vllm/model_executor/layers/sampler.py)
    always; V1's ``TopKTopPSampler.forward_native`` -> ``apply_top_k_top_p_pytorch``
    (vllm/v1/sample/ops/topk_topp_sampler.py) before 0.11.1 when FlashInfer is not
    installed (it logs "FlashInfer is not available. Falling back to the PyTorch-native
    implementation of top-p & top-k sampling"), 0.11.1-0.16 (FlashInfer's sampler off by
    default, ``Release.sorting_sampler``), and from 0.17 when fewer than 8 requests are
    sampled (``apply_top_k_top_p`` takes the Triton kernel only from 8 rows).
    ``flashinfer``: V1 before 0.11.1 with FlashInfer installed (``forward_cuda`` ->
    ``flashinfer_sample``; "Using FlashInfer for top-p & top-k sampling"). ``pip install
    vllm`` did not install FlashInfer until vLLM PR 26443 (merged 2025-10-08, after 0.11.0)
    made it a dependency; the vllm/vllm-openai image has it. None takes the pip default.
    ``kernel``: V1 from 0.17, ``apply_top_k_top_p_triton``
    (vllm/v1/sample/ops/topk_topp_triton.py, vLLM PR 33538), in place.
    ``v2``: Model Runner V2 (``Release.v2_model_runner``): its ``_dummy_sampler_run``
    (vllm/v1/worker/gpu/model_runner.py, 0.22-0.32) builds ``InputBatch.make_dummy``
    requests that were never added to the sampler, so ``SamplingStates`` keeps
    ``top_k = vocab_size`` and ``top_p = 1.0`` (vllm/v1/worker/gpu/sample/states.py) and
    ``get_top_k_top_p`` returns None: no top-k/top-p runs, and ``gumbel_sample`` reads the
    logits in place (its own comment: "the sampler may skip top_k, top_p, and logprobs").
    """
    if v0_engine:
        return "sorting"
    if v2_runner:
        return "v2"
    if release.sorting_sampler:
        return "sorting"
    if release.version >= (0, 17, 0):
        return "kernel" if requests >= 8 else "sorting"
    return "flashinfer" if flashinfer_installed else "sorting"


def sampler_bytes(path: str, release: Release, model: OverheadModel = DEFAULT_OVERHEAD) -> float:
    """Bytes per (dummy request × vocabulary entry) the sampler holds at its peak beyond the
    model-dtype logits ``compute_logits`` returned (the caller keeps those alive).

    ``sorting`` (36): ``Sampler.forward`` copies the logits to fp32 (4); ``logits.sort``
    returns fp32 values and int64 indices (12); while it runs, PyTorch's CUDA sort of 128
    rows or more (aten/src/ATen/native/cuda/SortStable.cu, ``launch_stable_sort_kernel``
    -> ``segmented_sort_pairs``) allocates an int64 iota of the indices it permutes (8) and
    sorts through ``at::cuda::cub::segmented_sort_pairs`` (aten/src/ATen/cuda/cub.cuh),
    whose cub radix sort keeps alternate key and value buffers in its temporary storage
    (12). Fewer rows take ``segmented_sort_pairs_by_full_sort``, not counted apart. The
    masks, the cumulative probabilities and V0's out-of-place scatter that follow (V0: 4 +
    8 + 1 + 4 + 4 + 1 + 4 = 26, V1 0.10: 22, 0.11.1-0.16: 18, all with the fp32 copy) stay
    below it. The 0.16 -> 0.17
    Qwen3-14B pair on one H100 (llm-d-planner@8f9dbb8, 1,024 × 151,936 entries) measured
    5.64 GiB, this count 5.51; the public starts in tests/fixtures/sizing print
    36.4-37.2 B beyond the logits (Llama-3.2-3B T4 0.8.2, Qwen3-30B-A3B TP4 0.8.5 twice,
    Qwen3-235B-FP8 TP8 L40S 0.10.2).
    ``flashinfer`` (12): the fp32 copy, then ``top_k_top_p_sampling_from_logits`` masks
    the logits into a new fp32 tensor and takes its softmax (4 + 4); Qwen2-7B on an A100
    under 0.10.1.1 prints 11.8 and 11.6 B.
    ``kernel`` (12): the fp32 copy; the Triton kernel masks it in place; then
    ``forward_native``'s softmax (4) and ``random_sample``'s exponential noise (4). Its
    per-SM row buffer (``_TRITON_BUFFER_CACHE``: up to one fp32 vocabulary row per SM,
    cached) is not counted: the GPU table has no SM counts, and it is 0.04-0.13 GiB (108
    A100 SMs × 128,256 entries to 132 H100 SMs × 262,208). llm-d-planner's 0.17 Qwen3-14B
    H100 start measured 2.23 GiB, this count 2.03 (0.08 of the gap is that buffer).
    ``v2`` (0, or 4 in 0.22-0.25): ``Sampler.apply_sampling_params``
    (vllm/v1/worker/gpu/sample/sampler.py) copied the logits to fp32 unconditionally in
    0.22-0.25; 0.26 works in place and 0.28 copies only for requests that need logits
    processing, which no dummy request does.
    """
    if path == "sorting":
        return model.sampler_sort_bytes
    if path == "flashinfer":
        return model.sampler_fixed_bytes
    if path == "kernel":
        return model.sampler_kernel_bytes
    copies = (0, 22, 0) <= release.version < (0, 26, 0)
    return model.sampler_v2_copy_bytes if copies else model.sampler_v2_bytes


def non_torch_bytes(
    release: Release, tp: int, pp: int, model: OverheadModel = DEFAULT_OVERHEAD
) -> int:
    """Modelled non-torch growth after the start-up snapshot, per GPU."""
    if tp > 1:
        grown = _by_era(model.non_torch_tp_by_era, release)
    else:  # one GPU, or one GPU per PP stage
        grown = _by_era(model.non_torch_single_by_era, release)
    if release.cublas_in_baseline:
        grown = max(0, grown - model.cublas_baseline)
    return grown


# Model Runner V2's per-request sampling state besides the vocabulary-wide tensors: the
# logit-bias state (1,024 allowed ids, 1,024 bias ids and 1,024 biases, 128 stop ids) and
# the bad-words state (1,024 tokens, 129 offsets), four bytes each (sample/logit_bias.py,
# sample/bad_words.py with VLLM_MAX_BAD_WORDS_TOTAL_TOKENS and VLLM_MAX_NUM_BAD_WORDS at
# their defaults).
_V2_STATE_FIXED_BYTES = (1024 + 1024 + 1024 + 128 + 1024 + 129) * 4


def sampler_state_bytes(
    release: Release,
    max_num_seqs: int,
    vocab_size: int,
    v2_runner: bool,
    model: OverheadModel = DEFAULT_OVERHEAD,
) -> int:
    """Model Runner V2's sampling state, kept for the server's life on the last PP rank,
    per GPU: part of what 0.27's ``total_consumed`` charges beyond the weights, which
    vLLM's log counts as non-torch memory.

    ``GPUModelRunner.load_model`` (vllm/v1/worker/gpu/model_runner.py) builds the sampler
    after it has measured "Model loading took", so none of it is in the weights:
    ``PenaltiesState`` (sample/penalties.py) holds ``output_bin_counts``, max_num_reqs ×
    vocab int32 ("can be very large, taking up GBs of GPU memory"), and
    ``prompt_bin_mask``, max_num_reqs × ⌈vocab ÷ 32⌉ int32; ``StructuredOutputsWorker``
    (structured_outputs.py) a ``grammar_bitmask`` of the same shape (one decode token a
    request without speculative decoding); and the fixed per-request states above. Read in
    the 0.27.1, 0.28, 0.29, 0.31 and 0.33 wheels. Before 0.27 the accounting does not see
    it (neither weights, nor a peak increase, nor non-torch memory); the V1 runner builds
    its vocabulary-wide mask only when a request asks for allowed token ids."""
    if not (model.v2_sampler_state and v2_runner and release.charges_total_consumed):
        return 0
    words = (vocab_size + 31) // 32
    return max_num_seqs * (vocab_size * 4 + 2 * words * 4 + _V2_STATE_FIXED_BYTES)


def _by_era(table: tuple[tuple[tuple[int, int, int], int], ...], release: Release) -> int:
    return next(b for since, b in table if release.version >= since)


def cuda_graph_bytes(
    release: Release,
    enforce_eager: bool,
    model: OverheadModel = DEFAULT_OVERHEAD,
    v2_runner: bool = False,
) -> int:
    """The CUDA-graph estimate the start subtracts: none eager, before 0.20, or on Model
    Runner V2 before 0.29, whose ``profile_cudagraph_memory`` returns 0."""
    if enforce_eager or not release.subtracts_cudagraph_estimate:
        return 0
    if v2_runner and not release.v2_estimates_cudagraphs:
        return 0
    return model.cuda_graph


# How a capacity chain names ``StageMemory.device_cap`` (plan's table, the status page).
DEVICE_CAP_ROW = (
    "  capped after warmup at",
    "total − CUDA context − max(1 GiB (3 on ROCm), 0.75 × activation)",
)


@dataclass(frozen=True)
class StageMemory:
    """One worker's budget, every term in bytes."""

    requested: int
    weights: int
    activation: int
    non_torch: int
    cuda_graph: int
    # 0.34's extensible KV cache: what the device leaves after the CUDA context and the
    # margin, a cap on the ceiling (plan.extensible_kv_cache); None before.
    device_cap: int | None = None
    # The part of ``non_torch`` that is Model Runner V2's sampling state
    # (``sampler_state_bytes``), counted rather than refit: what vLLM prints as non-torch
    # memory holds it too.
    sampler_state: int = 0

    @property
    def overhead(self) -> int:
        return self.activation + self.non_torch + self.cuda_graph

    @property
    def non_kv(self) -> int:
        return self.weights + self.overhead

    @property
    def binding_cap(self) -> int | None:
        """``device_cap`` where it, not the ceiling, bounds the cache; else None."""
        if self.device_cap is None or self.device_cap >= self.requested:
            return None
        return self.device_cap

    @property
    def available(self) -> int:
        ceiling = (
            self.requested if self.device_cap is None else min(self.requested, self.device_cap)
        )
        return ceiling - self.non_kv
