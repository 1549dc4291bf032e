"""A deployment vLLM would refuse: why, in vLLM's terms, and the smallest change per dial
that starts; and which deployments hold N sequences of L tokens (``fit``)."""

from __future__ import annotations

import pytest

from exporter.capacity.gpus import lookup_gpu
from exporter.capacity.plan import (
    CUDA_CONTEXT_BYTES,
    Plan,
    Suggestion,
    fit,
    gpu_count,
    plan,
    replan,
    what_ifs,
    what_would_work,
    why_not,
)
from exporter.cli import build_parser
from exporter.errors import InputError
from exporter.plan.cli import build_request
from exporter.sources.model_dir import load_catalogue


def planned(model: str, *flags: str) -> Plan:
    """The plan ``kv-headroom plan --model MODEL FLAGS`` makes."""
    args = build_parser().parse_args(["plan", "--model", model, *flags])
    return plan(build_request(args))


def dial(p: Plan, name: str) -> Suggestion:
    return next(s for s in what_would_work(p) if s.dial == name)


QWEN_72B = "Qwen/Qwen2.5-72B-Instruct"


def test_weights_larger_than_the_gpu_fail_while_loading_with_cudas_out_of_memory() -> None:
    p = planned(QWEN_72B)
    assert p.startup_failure is not None
    assert p.startup_failure.cause == "load_oom"
    assert "CUDA out of memory while loading the weights" in p.startup_failure.message
    assert p.startup_failure.available_bytes == p.request.gpu.total_bytes - CUDA_CONTEXT_BYTES


def test_weights_over_the_ceiling_but_within_the_gpu_leave_no_room_for_one_block() -> None:
    p = planned("meta-llama/Llama-3.1-8B-Instruct", "--weights-bytes", "76GiB")
    assert p.startup_failure is not None
    assert p.startup_failure.cause == "no_kv_memory"
    assert why_not(p).startswith("no room for one KV block: weights and overhead")


def test_a_budget_vllm_printed_is_never_a_load_failure() -> None:
    p = planned(QWEN_72B, "--available-kv-bytes", "1GiB")
    assert p.startup_failure is not None
    assert p.startup_failure.cause == "max_model_len"


def test_a_context_too_long_for_the_cache_says_how_long_fits() -> None:
    p = planned("meta-llama/Llama-3.1-8B-Instruct", "--gpu", "L4")
    assert p.startup_failure is not None
    assert p.startup_failure.cause == "max_model_len"
    assert f"(the longest: {p.startup_failure.estimated_max_model_len:,})" in why_not(p)


def test_a_deployment_that_starts_gets_no_suggestion() -> None:
    assert what_would_work(planned("meta-llama/Llama-3.1-8B-Instruct")) == ()


def test_the_tp_dial_names_the_smallest_tp_that_starts() -> None:
    p = planned(QWEN_72B)
    tp = dial(p, "tensor_parallel")
    assert tp.change == "--tensor-parallel-size 4"
    assert tp.plan is not None
    assert tp.plan.startup_failure is None
    assert replan(p, tensor_parallel_size=2).startup_failure is not None


def test_the_fewest_gpus_dial_adds_stages_where_they_need_fewer_gpus_than_tp() -> None:
    fewest = dial(planned(QWEN_72B), "parallel")
    assert fewest.change == "--pipeline-parallel-size 3"
    assert fewest.plan is not None
    assert fewest.plan.startup_failure is None
    assert gpu_count(fewest.plan) == 3


def test_the_fewest_gpus_dial_is_left_out_where_tp_alone_needs_no_more() -> None:
    dials = [
        s.dial for s in what_would_work(planned("meta-llama/Llama-3.1-8B-Instruct", "--gpu", "L4"))
    ]
    assert "tensor_parallel" in dials
    assert "parallel" not in dials


def test_the_gpu_dial_names_the_smallest_gpu_of_the_table_that_starts() -> None:
    p = planned("Qwen/Qwen3-30B-A3B", "--gpu", "L4")
    gpu = dial(p, "gpu")
    assert gpu.change == "--gpu H100-80GB"
    assert gpu.plan is not None
    assert gpu.plan.startup_failure is None
    smaller = [lookup_gpu(n) for n in ("L40S", "A100-SXM4-40GB", "RTX-A6000")]
    assert all(replan(p, gpu=g).startup_failure is not None for g in smaller)


def test_with_no_gpu_holding_it_at_this_tp_the_gpu_dial_adds_tp() -> None:
    p = planned(QWEN_72B)
    assert dial(p, "gpu").plan is None
    wider = dial(p, "gpu_tp")
    assert wider.change == "--gpu H200-141GB --tensor-parallel-size 2"
    assert wider.plan is not None
    assert wider.plan.startup_failure is None


def test_the_gpu_dial_stays_with_the_vendor_of_the_gpu_asked() -> None:
    # MI325X (256 GB) would hold it at TP1; a CUDA deployment is not moved to ROCm.
    assert dial(planned(QWEN_72B), "gpu").why_not.startswith("--gpu B200:")


def test_the_kv_dtype_dial_offers_fp8_where_it_starts() -> None:
    fp8 = dial(planned("mistralai/Devstral-Small-2-24B-Instruct"), "kv_cache_dtype")
    assert fp8.change == "--kv-cache-dtype fp8"
    assert fp8.plan is not None
    assert fp8.plan.startup_failure is None


def test_a_dial_that_cannot_start_it_says_why_in_vllms_terms() -> None:
    fp8 = dial(planned(QWEN_72B), "kv_cache_dtype")
    assert fp8.plan is None
    assert fp8.why_not.startswith("--kv-cache-dtype fp8: CUDA OOM loading the weights")


def test_the_context_dial_is_vllms_estimated_longest_context() -> None:
    p = planned("meta-llama/Llama-3.1-8B-Instruct", "--gpu", "L4")
    assert p.startup_failure is not None
    longest = dial(p, "max_model_len")
    assert longest.change == f"--max-model-len {p.startup_failure.estimated_max_model_len}"
    assert longest.plan is not None
    assert longest.plan.startup_failure is None


def test_the_utilization_dial_names_the_lowest_utilization_above_todays_that_starts() -> None:
    # gpt-oss-120b on one H100 under 0.16, whose profile run sorts the logits of 1,024
    # dummy requests over a 201,088-entry vocabulary (memory.sampler_bytes): the default
    # 0.9 leaves no KV block, 0.97 fits one 131,072-token request and 0.96 does not.
    p = planned("openai/gpt-oss-120b", "--vllm-version", "0.16.0")
    u = dial(p, "utilization")
    assert u.change == "--gpu-memory-utilization 0.97"
    assert replan(p, gpu_memory_utilization=0.96).startup_failure is not None


def test_the_utilization_dial_goes_no_higher_than_the_memory_free_at_start_up() -> None:
    u = dial(planned("meta-llama/Llama-3.1-8B-Instruct", "--gpu", "L4"), "utilization")
    l4 = lookup_gpu("L4")
    top = int((l4.total_bytes - CUDA_CONTEXT_BYTES) / l4.total_bytes * 100) / 100
    assert u.plan is None
    assert u.why_not.startswith(f"--gpu-memory-utilization {top:g}:")


@pytest.mark.parametrize("gpu", ["H100", "L4"])
def test_every_catalogue_model_at_its_defaults_starts_or_is_told_what_does(gpu: str) -> None:
    told_nothing = []
    for model in load_catalogue():
        p = planned(model.name, "--gpu", gpu)
        if p.startup_failure is not None and not any(s.plan for s in what_would_work(p)):
            told_nothing.append(model.name)
    assert told_nothing == []


@pytest.mark.parametrize("gpu", ["H100", "L4"])
def test_no_what_if_of_a_catalogue_model_would_not_start_without_saying_why(gpu: str) -> None:
    unexplained = [
        (model.name, w.label)
        for model in load_catalogue()
        for w in what_ifs(planned(model.name, "--gpu", gpu))
        if w.plan is not None and w.plan.startup_failure is not None and not why_not(w.plan)
    ]
    assert unexplained == []


def test_fit_lists_the_fewest_gpus_first_then_the_smallest_gpu() -> None:
    fits = fit(planned(QWEN_72B), 64, 8192)
    keys = [(f.gpus, f.plan.request.gpu.total_bytes) for f in fits]
    assert keys == sorted(keys)
    assert len({f.gpus for f in fits}) > 1


def test_every_fit_starts_and_holds_the_sequences_asked() -> None:
    fits = fit(planned(QWEN_72B), 64, 8192)
    assert fits
    for f in fits:
        assert f.plan.startup_failure is None
        assert f.held >= 64
        assert f.plan.sequences[0][0].tokens == 8192


def test_fit_takes_the_smallest_tp_that_holds_on_each_gpu() -> None:
    h100 = next(
        f
        for f in fit(planned(QWEN_72B), 64, 8192)
        if f.plan.request.gpu.name == "H100-80GB" and f.plan.request.kv_cache_dtype == "auto"
    )
    assert h100.plan.request.tensor_parallel_size == 8
    smaller = replan(h100.plan, tensor_parallel_size=4)  # starts, but holds fewer than 64
    assert smaller.startup_failure is None
    assert smaller.sequences[0][1] < 64


def test_fit_keeps_an_fp8_deployment_only_where_it_needs_fewer_gpus() -> None:
    fits = fit(planned(QWEN_72B), 64, 8192)
    by_gpu: dict[str, dict[str, int]] = {}
    for f in fits:
        by_gpu.setdefault(f.plan.request.gpu.name, {})[f.plan.request.kv_cache_dtype] = f.gpus
    both = {g: d for g, d in by_gpu.items() if len(d) == 2}
    assert all(d["fp8"] < d["auto"] for d in both.values())
    assert any("fp8" in d for d in by_gpu.values())


def test_fit_raises_a_default_max_num_seqs_below_the_sequences_asked() -> None:
    fits = fit(planned("Qwen/Qwen3-VL-2B-Instruct", "--gpu", "L4"), 300, 1024)
    l4 = next(f for f in fits if f.plan.request.gpu.name == "L4")
    assert l4.plan.max_num_seqs == 300
    assert "--max-num-seqs 300" in l4.change


def test_fit_refuses_sequences_longer_than_the_max_model_len_given() -> None:
    base = planned("meta-llama/Llama-3.1-8B-Instruct", "--max-model-len", "4096")
    with pytest.raises(InputError, match="longer than --max-model-len 4096"):
        fit(base, 8, 8192)


def test_fit_sizes_the_context_as_max_model_len_when_none_is_given() -> None:
    fits = fit(planned("meta-llama/Llama-3.1-8B-Instruct"), 8, 8192)
    assert {f.plan.max_model_len for f in fits} == {8192}


def test_fit_finds_nothing_where_no_gpu_of_the_table_holds_it() -> None:
    assert fit(planned("meta-llama/Meta-Llama-3.1-405B"), 4096, 131072) == ()


def test_a_gpu_given_by_its_size_is_compared_with_every_gpu_of_the_table() -> None:
    # No vendor to stay with: the smallest GPU that holds it at TP1 is AMD's MI325X.
    assert dial(planned(QWEN_72B, "--gpu", "80GB"), "gpu").change == "--gpu MI325X"
