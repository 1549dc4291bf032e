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
  ``F = 4.91 B × tokens × intermediate / TP × dtype bytes`` and
  ``S = (12.66 B + 1.35 B × dtype bytes) × requests × vocabulary`` were fitted (by
  ``benchmarks/plan_accuracy.py``) to the profile figures of the llm-d H100 logs in
  tests/fixtures/sizing (Llama-3.1-8B bf16 and fp32, Qwen2.5-7B, Qwen3-14B: peaks 1.89,
  2.21, 2.21, 2.23 GiB; first PP stages 1.05-1.10 GiB, last ones 2.01 GiB).
  Before 0.17 the sampler's peak was 2.53× larger (Qwen3-14B: 5.64 GiB on 0.15/0.16 vs
  2.23 GiB on 0.17, same flags).
* **non-torch memory** — allocations outside PyTorch after the snapshot: 0.13 GiB (0.15-0.17)
  or 0.25 GiB (0.18+) on one GPU, 0.07 GiB per PP stage, 2.1 GiB per GPU with TP > 1
  (custom all-reduce and NCCL buffers; 2.06-2.13 GiB in the TP2/TP4 logs).
* **CUDA-graph estimate** — subtracted from 0.20 unless ``--enforce-eager``: 0.65 GiB per
  GPU, the median of the estimates the v0.19 logs print (0.49-1.69 GiB). No 0.20+ run is in
  the fixtures, so this term is unvalidated.

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

    forward_bytes: float = 4.91  # per (batched token × intermediate width / TP × dtype byte)
    sampler_fixed_bytes: float = 12.66  # per (dummy request × vocabulary entry)
    sampler_dtype_bytes: float = 1.35  # ... plus this per dtype byte
    sampler_early_factor: float = 2.53  # the sampler's peak before 0.17, relative
    non_torch_pp_stage: int = int(0.07 * GIB)
    non_torch_tp: int = int(2.1 * GIB)
    cuda_graph: int = int(0.65 * GIB)
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
        ((0, 18, 0), int(0.25 * GIB)),
        ((0, 0, 0), int(0.13 * GIB)),
    )  # (first release, bytes), newest first


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
    per_entry = model.sampler_fixed_bytes + model.sampler_dtype_bytes * a.dtype_bytes
    if release.version < (0, 17, 0):
        per_entry *= model.sampler_early_factor
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
        grown = model.non_torch_tp
    elif pp > 1:
        grown = model.non_torch_pp_stage
    else:
        grown = next(b for since, b in model.non_torch_single_by_era if release.version >= since)
    if release.cublas_in_baseline:
        grown = max(0, grown - model.cublas_baseline)
    return grown


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
