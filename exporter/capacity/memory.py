"""The per-GPU memory budget vLLM leaves for the KV cache, and a model of what it subtracts.

vLLM (vllm/v1/worker/gpu_worker.py::determine_available_memory):

    requested = ceil(total × gpu_memory_utilization)          # plain product before 0.14
    available = requested − weights − activation peak − non-torch [− CUDA-graph estimate]

``total`` is the device memory CUDA reports; what was already in use when the worker took
its start-up snapshot (the CUDA context, from 0.11 NCCL) is not charged. The weights are
known or estimated (weights.py). The other three terms are measured by vLLM during its
profile run; this module models them:

* **activation peak** — the profile run pushes ``max_num_batched_tokens`` tokens through
  the model (peak ``F``, set by the MLP width) and, on the last PP stage, samples one
  token for each of ``min(max_num_seqs, max_num_batched_tokens)`` dummy requests over the
  full vocabulary with top-k/top-p (peak ``S``, set by requests × vocabulary). The two do
  not overlap, so a single stage peaks at ``max(F, S)``; a last PP stage also keeps the
  hidden-state and residual buffers it receives from the previous stage.
  ``S`` is ``(fixed + dtype bytes)`` per entry, ``fixed`` set by the top-k/top-p path the
  start takes (``sampler_path``), each refit by ``benchmarks/plan_accuracy.py`` from the
  public start-ups in tests/fixtures/sizing/ whose sampler sets the peak (a row that prints
  no breakdown gives as its peak what weights, KV memory, its era's non-torch memory and
  graph estimate leave of the ceiling):

  - *sorting* (``logits.sort``: fp32 values and int64 indices over the whole vocabulary):
    V0 — every release before 0.8, and 0.8-0.10 on Volta/Turing, which fall back to V0
    (``Release.v0_engine_on``) — V1 before 0.11.1 without FlashInfer installed, and V1
    0.11.1-0.16 (``Release.sorting_sampler``): 36.73 B, from four starts that print their
    peak: Llama-3.2-3B on a T4 under 0.8.2 (0.90 GiB over 192 × 128,256 entries: 37.2 B),
    Qwen3-30B-A3B at TP4 on Turing cards under 0.8.5 (1.40 and 1.39 GiB over 256 × 151,936:
    36.7 and 36.4 B) and Qwen3-235B-A22B-FP8 at TP8 on L40S under 0.10.2 (1.4 GiB: 36.6 B;
    tim-roethig/ai-platform; its install is not stated). It replaces the 24 B code count.
  - *FlashInfer* (V1's sort-free sampler before 0.11.1, where FlashInfer is installed):
    11.71 B, from Qwen2-7B on an A100 under 0.10.1.1 at two utilizations, whose logs print
    "Using FlashInfer for top-p & top-k sampling" (11.8 and 11.6 B;
    dennislee22/vLLM-benchmarking) — the code count is 12 B (three fp32 copies: cast
    logits, softmax, renormalised probabilities). The same logs' TP2 run on A100 40GB had
    no FlashInfer and fell back to the sorting path.
  - *kernel* (0.17 on: the top-k/top-p kernel of vLLM PR 33538, or FlashInfer's sampler
    where a release turns it back on; one coefficient): 29.79 B, the mean of gpt-oss-20b on
    an A100 under 0.19 (22.6 B), Qwen2.5-7B-AWQ on an RTX 4080 under 0.26 (19.3 B),
    Qwen3-14B and Qwen3-14B-AWQ on an L40S under 0.28 (35.0, 35.5 B) and Llama-3.1-8B on an
    A100 under 0.31 (36.4 B). The step between 0.26 and 0.28 is not explained by a term
    here; a per-release coefficient would need more than one row a release.

  ``F = forward_bytes × tokens × intermediate / TP × dtype bytes``; ``forward_bytes``
  (3.84) is fitted to the V0 starts whose forward pass sets the peak: vLLM issue 10517
  (Llama-3.1-8B on an RTX 3090, 20,000 and 29,000 profile tokens: peaks of 2.07 and 2.99
  GiB above the weights) and Qwen2.5-7B on an RTX 3090 under 0.6.6 (8,192 tokens, 1.09
  GiB): 3.88, 3.86 and 3.77.
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
  start-up) are not read and take 0.6.4's figures. 0.8-0.27: 0.055 GiB on
  one GPU (Llama-3.2-3B under 0.8.2: 0.05; Qwen2.5-7B-AWQ under 0.26: 0.06) and 0.187 GiB
  per GPU with TP > 1 (printed: Qwen3-235B TP8 under 0.10.2, 0.21; Qwen3-30B-A3B TP4
  under 0.8.5, 0.20 twice; and what printed weights, KV memory and the modelled peak
  leave of the ceiling in the TP starts that print no breakdown: Qwen2-7B TP2 under
  0.10.1.1, 0.18, 0.18 and 0.14; gpt-oss-120b TP4 under 0.10.1.1, 0.21) — the V0
  comm-buffer figure does not carry over. From 0.28 vLLM charges
  everything the instance took since the snapshot (``total_consumed``, from
  ``cudaMemGetInfo``), so memory PyTorch keeps reserved past the weights counts too: 0.26
  GiB, the "consumed memory" less the weights of Llama-3.1-8B on an A100 under 0.31 (15.26
  − 15.0), used for TP too (no 0.28+ TP row prints it). A PP stage's worker accounts like
  one GPU's.
* **CUDA-graph estimate** — subtracted from 0.20 unless ``--enforce-eager``: 0.27 GiB per
  GPU, the median of the estimates public 0.20+ logs print (0.09, 0.17 and 0.36 GiB on
  RTX 3090s and a 0.27 start, 2.43 GiB on GB10s: club-3090 issues 434 and 127, gpustack
  runner PR 251, MiaAI-Lab PR 25). It varies with the captured sizes far more than this
  constant says; unvalidated against a printed KV figure.

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

    forward_bytes: float = 3.84  # per (batched token × intermediate width / TP × dtype byte)
    # The sampler's bytes per (dummy request × vocabulary entry), by the top-k/top-p path
    # the start takes (see the module docstring and ``sampler_path``).
    sampler_fixed_bytes: float = 11.71  # FlashInfer's sort-free sampler, V1 before 0.11.1
    sampler_kernel_bytes: float = 29.79  # the Triton top-k/top-p kernel, 0.17 on
    sampler_sort_bytes: float = 36.73  # the sorting path (see sampler_path)
    sampler_dtype_bytes: float = 1.0  # ... plus the model-dtype logits, per dtype byte
    cuda_graph: int = int(0.27 * GIB)
    # 0.33, modelled in direction only (no 0.33 GPU start-up measured): the second,
    # full-feature sampler pass keeps one more fp32 logits copy (4 B per request × vocab
    # entry), and the cuBLAS/cuBLASLt handles (their 32 MiB Hopper workspace) move into
    # the start-up baseline, out of non-torch memory.
    sampler_warmup_bytes: float = 4.0
    cublas_baseline: int = 32 << 20
    # Structural terms, not fitted (no start-up of such a model is in the fixtures): the
    # encoder profile run pushes the largest image through the vision tower, whose MLP
    # peaks like the language model's (the same forward_bytes per element); soft-capped
    # logits (Gemma 2: tanh(x / c) · c in compute_logits) hold three model-dtype copies
    # at once, freed before sampling starts.
    softcap_copies: int = 3
    non_torch_single_by_era: tuple[tuple[tuple[int, int, int], int], ...] = (
        ((0, 28, 0), int(0.26 * GIB)),  # total_consumed less the weights (see above)
        ((0, 8, 0), int(0.055 * GIB)),
        ((0, 6, 5), int(0.10 * GIB)),  # V0 after vLLM PR 10511: growth over the baseline
        ((0, 0, 0), int(0.35 * GIB)),  # V0 before it: all device memory outside torch
    )  # on one GPU and per PP stage, (first release, bytes), newest first
    non_torch_tp_by_era: tuple[tuple[tuple[int, int, int], int], ...] = (
        ((0, 28, 0), int(0.26 * GIB)),
        ((0, 8, 0), int(0.187 * GIB)),
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
    v0_engine: bool = False  # V0's sampler sorts (Release.v0_engine_on)
    flashinfer_installed: bool | None = None  # None: pip install vllm's default


def activation_peaks(
    inputs: ActivationInputs, release: Release, model: OverheadModel = DEFAULT_OVERHEAD
) -> tuple[int, ...]:
    """Modelled torch peak increase of the profile run, per PP stage (bytes)."""
    a = inputs
    forward = model.forward_bytes * (
        a.max_num_batched_tokens * (a.intermediate_size / a.tp) * a.dtype_bytes
    )
    fixed = {
        "sorting": model.sampler_sort_bytes,
        "flashinfer": model.sampler_fixed_bytes,
        "kernel": model.sampler_kernel_bytes,
    }[sampler_path(release, a.v0_engine, a.flashinfer_installed)]
    per_entry = fixed + model.sampler_dtype_bytes * a.dtype_bytes
    if release.sampler_warmup_pass:
        per_entry += model.sampler_warmup_bytes
    requests = min(a.max_num_seqs, a.max_num_batched_tokens)
    sampler = per_entry * requests * a.vocab_size
    copies = model.softcap_copies if a.logits_softcap else 1
    logits = copies * a.dtype_bytes * requests * a.vocab_size
    sampler = max(sampler, logits)  # the logits phase ends before the sampler's begins
    encoder = model.forward_bytes * a.encoder_elems * a.dtype_bytes / a.tp
    first = max(forward, encoder)  # the vision tower runs on the first stage
    if a.pp == 1:
        return (int(max(first, sampler)),)
    received = 2 * a.max_num_batched_tokens * a.hidden_size * a.dtype_bytes
    return tuple([int(first)] + [int(forward)] * (a.pp - 2) + [int(sampler + received)])


def sampler_path(release: Release, v0_engine: bool, flashinfer_installed: bool | None) -> str:
    """The top-k/top-p path of the profile run's sampler.

    ``sorting``: V0's ``Sampler._apply_top_k_top_p`` and V1's ``apply_top_k_top_p_pytorch``
    sort the logits — V0 always; V1 before 0.11.1 when FlashInfer is not installed (its
    ``topk_topp_sampler.py`` logs "FlashInfer is not available. Falling back to the
    PyTorch-native implementation of top-p & top-k sampling"), and 0.11.1-0.16, where
    FlashInfer's sampler is off by default (``Release.sorting_sampler``). ``flashinfer``:
    V1 before 0.11.1 with FlashInfer installed (its log: "Using FlashInfer for top-p & top-k
    sampling"). ``pip install vllm`` did not install FlashInfer until vLLM PR 26443
    (merged 2025-10-08, after 0.11.0) made it a dependency; the vllm/vllm-openai image has
    it. None takes the pip default. ``kernel``: 0.17 on (the top-k/top-p kernel of vLLM PR
    33538, or FlashInfer's sampler where a release turns it back on; one coefficient).
    """
    if v0_engine or release.sorting_sampler:
        return "sorting"
    if release.version >= (0, 17, 0):
        return "kernel"
    return "flashinfer" if flashinfer_installed else "sorting"


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


def _by_era(table: tuple[tuple[tuple[int, int, int], int], ...], release: Release) -> int:
    return next(b for since, b in table if release.version >= since)


def cuda_graph_bytes(
    release: Release, enforce_eager: bool, model: OverheadModel = DEFAULT_OVERHEAD
) -> int:
    if enforce_eager or not release.subtracts_cudagraph_estimate:
        return 0
    return model.cuda_graph


@dataclass(frozen=True)
class StageMemory:
    """One worker's budget, every term in bytes."""

    requested: int
    weights: int
    activation: int
    non_torch: int
    cuda_graph: int

    @property
    def overhead(self) -> int:
        return self.activation + self.non_torch + self.cuda_graph

    @property
    def non_kv(self) -> int:
        return self.weights + self.overhead

    @property
    def available(self) -> int:
        return self.requested - self.non_kv
