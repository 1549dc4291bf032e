"""Which starts subtract a CUDA-graph estimate and which are charged a cold torch.compile,
as each release's code does (exporter/capacity/memory.py)."""

from __future__ import annotations

from dataclasses import replace

from exporter.capacity.arch import parse_config
from exporter.capacity.gpus import lookup_gpu
from exporter.capacity.memory import OverheadModel
from exporter.capacity.plan import PlanRequest, plan
from exporter.capacity.releases import release
from exporter.simulator.family import TIER_OVERHEAD
from tests.conftest import fixture_config


def _request(model: str, version: str, **changes: object) -> PlanRequest:
    base = PlanRequest(
        arch=parse_config(fixture_config(model), model),
        model_name=model,
        gpu=lookup_gpu("L40S"),
        release=release(version),
        max_model_len=8192,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_model_runner_v2_subtracts_no_graph_estimate_before_029() -> None:
    # V2's profile_cudagraph_memory returns 0 in 0.22-0.28; Qwen3 runs on V2 from 0.22 (a
    # listed architecture), so 0.21 (V1) and 0.29 (V2 that measures) subtract it and
    # 0.24-0.28 do not.
    graphs = {
        v: plan(_request("Qwen__Qwen3-14B", v)).stages[0].cuda_graph
        for v in ("0.21.0", "0.24.0", "0.28.0", "0.29.0")
    }
    shipped = OverheadModel().cuda_graph
    assert graphs == {"0.21.0": shipped, "0.24.0": 0, "0.28.0": 0, "0.29.0": shipped}
    v2 = plan(_request("Qwen__Qwen3-14B", "0.28.0"))
    assert v2.sources["cuda_graph"] == "0: Model Runner V2 estimates none in 0.28.0"


def test_a_moe_model_on_the_v1_runner_still_subtracts_it_in_028() -> None:
    # 0.25-0.28 put only dense models (and listed MoE ones) on V2.
    moe = plan(_request("Qwen__Qwen3-30B-A3B", "0.28.0")).stages[0]
    assert moe.cuda_graph == OverheadModel().cuda_graph


def test_the_cold_compile_rides_on_the_forward_pass_as_one_figure_per_worker() -> None:
    transient = OverheadModel().compile_bytes
    for tp in (1, 2):
        eager = plan(
            _request("Qwen__Qwen3-14B", "0.29.0", tensor_parallel_size=tp, enforce_eager=True)
        ).stages[0]
        compiled = plan(_request("Qwen__Qwen3-14B", "0.29.0", tensor_parallel_size=tp)).stages[0]
        # Every TP rank compiles and tunes its own kernels: TP does not share it out.
        assert abs(compiled.activation - eager.activation - transient) <= 1


def test_the_fuzz_tiers_pin_keeps_the_per_layer_and_width_form() -> None:
    # The tier's engines were placed under the retired form (simulator/family.py).
    arch = parse_config(fixture_config("Qwen__Qwen3-14B"), "m")
    eager = plan(_request("Qwen__Qwen3-14B", "0.29.0", enforce_eager=True, overhead=TIER_OVERHEAD))
    pinned = plan(_request("Qwen__Qwen3-14B", "0.29.0", overhead=TIER_OVERHEAD))
    transient = (
        TIER_OVERHEAD.compile_layer_width_bytes * arch.num_layers * (arch.intermediate_size or 0)
    )
    assert abs(pinned.stages[0].activation - eager.stages[0].activation - transient) <= 1


def test_no_compile_transient_is_assumed_before_020() -> None:
    compiled = plan(_request("Qwen__Qwen3-14B", "0.19.0")).stages[0]
    eager = plan(_request("Qwen__Qwen3-14B", "0.19.0", enforce_eager=True)).stages[0]
    assert compiled.activation == eager.activation
