"""How long a vLLM scheduler step takes on a GPU, from its datasheet. Pure.

A decode step reads the weights once and every token of context it attends to once:
memory-bound, at ``BANDWIDTH_EFFICIENCY`` of the peak bandwidth. A prompt token costs
2 FLOPs (a multiply and an add) per parameter it passes through — an MoE's active experts
only — at ``COMPUTE_EFFICIENCY`` of the dense bf16 peak. Every step adds
``STEP_OVERHEAD_S`` of scheduling and launch time. The simulator's engine steps on these
figures; the sidecar's load headroom uses the same ones to tell how much slower a busier
engine's steps get. The efficiencies are assumptions, not measurements of any one
deployment (see docs/traffic-headroom.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.capacity.gpus import Gpu
from exporter.capacity.plan import Plan
from exporter.capacity.weights import count_params

BANDWIDTH_EFFICIENCY = 0.75  # share of peak memory bandwidth a decode step achieves
COMPUTE_EFFICIENCY = 0.45  # share of peak bf16 FLOP/s a prefill achieves
STEP_OVERHEAD_S = 0.003  # scheduling and kernel launches, per step


@dataclass(frozen=True)
class StepTimes:
    """One step's duration: ``base_s + per_prefill_token_s × prompt tokens computed +
    per_kv_token_s × tokens attended``."""

    base_s: float
    per_prefill_token_s: float
    per_kv_token_s: float


def step_times(sized: Plan, gpu: Gpu | None = None) -> StepTimes:
    """The step times of a planned deployment (on ``gpu``, else the plan's GPU), per GPU.

    A prompt token's FLOPs count the parameters it passes through (an MoE's active
    experts, not all of them; every parameter of a quantized model, whatever its bytes),
    split over the TP × PP GPUs; without a parameter count, half the weight bytes (bf16).
    """
    gpu = gpu or sized.request.gpu
    bandwidth = gpu.memory_bandwidth * BANDWIDTH_EFFICIENCY
    weights = sized.tightest.weights or sized.request.weights_bytes or 0
    req = sized.request
    count = count_params(req.arch)
    gpus = req.tensor_parallel_size * req.pipeline_parallel_size
    params = count.active / gpus if count is not None else weights / 2
    return StepTimes(
        base_s=weights / bandwidth + STEP_OVERHEAD_S,
        per_prefill_token_s=2 * params / (gpu.bf16_flops * COMPUTE_EFFICIENCY),
        per_kv_token_s=sized.kv_bytes_per_token / bandwidth,
    )
