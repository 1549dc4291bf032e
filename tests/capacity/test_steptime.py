"""Step times from the datasheet: what a prompt token and a token of context cost."""

from __future__ import annotations

import dataclasses

import pytest

from exporter.capacity.arch import parse_config
from exporter.capacity.gpus import lookup_gpu
from exporter.capacity.plan import Plan, PlanRequest, plan
from exporter.capacity.releases import release
from exporter.capacity.steptime import COMPUTE_EFFICIENCY, step_times
from exporter.capacity.weights import ParamCount, count_params
from tests.conftest import fixture_config


def planned(model: str, tp: int = 1) -> Plan:
    arch = parse_config(fixture_config(model), "model")
    return plan(
        PlanRequest(arch=arch, model_name=model, gpu=lookup_gpu("H100-80GB"),
                    release=release("0.32.0"), tensor_parallel_size=tp, max_model_len=8192)
    )  # fmt: skip


FLOPS = lookup_gpu("H100-80GB").bf16_flops * COMPUTE_EFFICIENCY  # what a prefill achieves


def params_of(sized: Plan) -> ParamCount:
    params = count_params(sized.request.arch)
    assert params is not None
    return params


def test_a_prompt_token_costs_two_flops_per_parameter_at_the_assumed_efficiency() -> None:
    sized = planned("meta-llama__Llama-3.1-8B-Instruct")
    expected = 2 * params_of(sized).total / FLOPS
    assert step_times(sized).per_prefill_token_s == pytest.approx(expected)


def test_an_moe_prompt_token_costs_its_active_experts_only() -> None:
    moe = planned("Qwen__Qwen3-30B-A3B")
    # Every expert's weights are read by a busy decode step, but a token computes 8 of 128.
    prefill = step_times(moe).per_prefill_token_s
    assert prefill == pytest.approx(2 * params_of(moe).active / FLOPS)
    assert prefill < 0.2 * 2 * params_of(moe).total / FLOPS


def test_tensor_parallel_gpus_share_a_prompt_tokens_work() -> None:
    one, two = (
        planned("meta-llama__Llama-3.1-8B-Instruct"),
        planned("meta-llama__Llama-3.1-8B-Instruct", tp=2),
    )
    assert step_times(two).per_prefill_token_s == pytest.approx(
        step_times(one).per_prefill_token_s / 2
    )


def test_without_a_parameter_count_half_the_weight_bytes_stand_in() -> None:
    sized = planned("meta-llama__Llama-3.1-8B-Instruct")
    bare = dataclasses.replace(sized.request.arch, vocab_size=0)
    assert count_params(bare) is None
    blind = dataclasses.replace(sized, request=dataclasses.replace(sized.request, arch=bare))
    assert step_times(blind).per_prefill_token_s == pytest.approx(sized.tightest.weights / FLOPS)
