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
  ``F = 5.03 B × tokens × intermediate / TP × dtype bytes`` and
  ``S = (12.83 B + 1.31 B × dtype bytes) × requests × vocabulary`` were calibrated on the
  llm-d v0.19 H100 logs in ``../shared/fixtures/sizing`` (Llama-3.1-8B bf16 and fp32,
  Qwen2.5-7B, Qwen3-14B: peaks 1.89, 2.21, 2.21, 2.23 GiB; PP stages 1.10 and 2.01 GiB).
  Before 0.17 the sampler's peak was 2.52× larger (Qwen3-14B: 5.64 GiB on 0.15/0.16 vs
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

from exporter.capacity.releases import Release

GIB = 1 << 30

_FORWARD_BYTES_PER_TOKEN_X_WIDTH = 5.03
_SAMPLER_BYTES_FIXED = 12.83
_SAMPLER_BYTES_PER_DTYPE_BYTE = 1.31
_SAMPLER_EARLY_FACTOR = 2.52
_NON_TORCH_PP_STAGE = int(0.07 * GIB)
_NON_TORCH_TP = int(2.1 * GIB)
_CUDA_GRAPH_ESTIMATE = int(0.65 * GIB)


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


def activation_peaks(inputs: ActivationInputs, release: Release) -> tuple[int, ...]:
    """Modelled torch peak increase of the profile run, per PP stage (bytes)."""
    a = inputs
    forward = _FORWARD_BYTES_PER_TOKEN_X_WIDTH * (
        a.max_num_batched_tokens * (a.intermediate_size / a.tp) * a.dtype_bytes
    )
    per_entry = _SAMPLER_BYTES_FIXED + _SAMPLER_BYTES_PER_DTYPE_BYTE * a.dtype_bytes
    if release.activation_era == "v1-early":
        per_entry *= _SAMPLER_EARLY_FACTOR
    requests = min(a.max_num_seqs, a.max_num_batched_tokens)
    sampler = per_entry * requests * a.vocab_size
    if a.pp == 1:
        return (int(max(forward, sampler)),)
    received = 2 * a.max_num_batched_tokens * a.hidden_size * a.dtype_bytes
    return tuple([int(forward)] * (a.pp - 1) + [int(sampler + received)])


def non_torch_bytes(release: Release, tp: int, pp: int) -> int:
    """Modelled non-torch growth after the start-up snapshot, per GPU."""
    if tp > 1:
        return _NON_TORCH_TP
    if pp > 1:
        return _NON_TORCH_PP_STAGE
    return int(release.non_torch_base_gib * GIB)


def cuda_graph_bytes(release: Release, enforce_eager: bool) -> int:
    if enforce_eager or not release.subtracts_cudagraph_estimate:
        return 0
    return _CUDA_GRAPH_ESTIMATE


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
