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
  ``S`` is ``(fixed + dtype bytes)`` per entry, ``fixed`` set by the top-k/top-p path
  the release takes. The sort-free path (FlashInfer's top-k/top-p sampler; up to 0.11.0
  and from 0.17) holds the fp32 logits copy, the softmax probabilities and the
  renormalised probabilities: 12 B counted from vLLM's sampler code. Four public V1
  starts whose sampler sets the peak there refit it to 21.13 B, which is shipped:
  gpt-oss-20b on an A100 under 0.19 (23.1 B) and Qwen2-7B on an A100 under 0.10.1.1 at two
  utilizations (12.5 and 12.3 B, dennislee22/vLLM-benchmarking), each taking the peak as
  what weights and KV memory leave of the ceiling less the 32 MiB of V1 non-torch memory
  below, and Qwen3-235B-A22B-FP8 at TP8 on L40S under 0.10.2, which prints its peak
  (1.4 GiB: 36.6 B; tim-roethig/ai-platform). The spread (12-37 B) says the sampler is
  not the whole of that peak on every row.
  From 0.11.1 to 0.16 the sorting path sets the peak (``logits.sort``: fp32 values and
  int64 indices on top; see ``Release.sorting_sampler``): 24 B, the code count — no
  fixture row in that window prints what its peak is made of, so nothing refits it.
  ``F = forward_bytes × tokens × intermediate / TP × dtype bytes``; ``forward_bytes``
  (3.87) is fitted by ``benchmarks/plan_accuracy.py`` to the public V0 start-ups of
  vLLM issue 10517 (RTX 3090, 20,000 and 29,000 profile tokens: peaks of 2.07 and
  2.99 GiB above the weights; the two agree within 0.4 %).
* **non-torch memory** — allocations outside PyTorch after the snapshot, by engine:
  V0 0.35 GiB on one GPU (issue 10517, the only public row that prints it) and 2.14 GiB
  per GPU with TP > 1 (1.79 GiB more: the TP2 − TP1 difference of the non-torch figures
  vLLM PR 10511 printed for Llama-3-8B on an H100 under 0.6.x, whose accounting still
  held NCCL's buffers). V1 (0.8+) with TP > 1: 0.21 GiB per GPU, what a Qwen3-235B TP8
  start on L40S under 0.10.2 prints (tim-roethig/ai-platform), the only V1 TP row that
  prints it — the V0 comm-buffer figure does not carry over, NCCL's buffers already sit
  in V1's start-up snapshot. No public V1 start in the fixtures prints its non-torch
  memory on one GPU, so that keeps the structural prior ``benchmarks/plan_accuracy.py``
  refits from: the cuBLAS/cuBLASLt workspace (32 MiB, ``cublas_baseline``), also per PP
  stage.
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

    forward_bytes: float = 3.87  # per (batched token × intermediate width / TP × dtype byte)
    sampler_fixed_bytes: float = 21.13  # per (dummy request × vocabulary entry); see above
    sampler_dtype_bytes: float = 1.0  # ... plus the model-dtype logits, per dtype byte
    # 0.11.1-0.16: the sorting top-k/top-p path instead; the code count (no row measures it)
    sampler_sort_bytes: float = 24.0
    non_torch_pp_stage: int = 32 << 20  # V1's prior, cuBLAS: no row measures it (see above)
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
        ((0, 8, 0), 32 << 20),  # V1's prior, cuBLAS: no row measures it (see above)
        ((0, 0, 0), int(0.35 * GIB)),
    )  # (first release, bytes), newest first
    non_torch_tp_by_era: tuple[tuple[tuple[int, int, int], int], ...] = (
        ((0, 8, 0), int(0.21 * GIB)),  # Qwen3-235B TP8 on L40S, 0.10.2 (see above)
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


def activation_peaks(
    inputs: ActivationInputs, release: Release, model: OverheadModel = DEFAULT_OVERHEAD
) -> tuple[int, ...]:
    """Modelled torch peak increase of the profile run, per PP stage (bytes)."""
    a = inputs
    forward = model.forward_bytes * (
        a.max_num_batched_tokens * (a.intermediate_size / a.tp) * a.dtype_bytes
    )
    fixed = model.sampler_sort_bytes if release.sorting_sampler else model.sampler_fixed_bytes
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


def non_torch_bytes(
    release: Release, tp: int, pp: int, model: OverheadModel = DEFAULT_OVERHEAD
) -> int:
    """Modelled non-torch growth after the start-up snapshot, per GPU."""
    if tp > 1:
        grown = _by_era(model.non_torch_tp_by_era, release)
    elif pp > 1:
        grown = model.non_torch_pp_stage
    else:
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
