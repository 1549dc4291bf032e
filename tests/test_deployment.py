"""The one typed deployment: each flag from the most trusted source that has it, typed."""

from __future__ import annotations

from typing import get_args, get_type_hints

from exporter.cache_config import CacheConfig
from exporter.deployment import (
    FLAGS,
    FROM_CACHE_CONFIG,
    FROM_CMDLINE,
    FROM_CONFIG,
    Deployment,
    resolve,
)
from exporter.sources.cmdline import CANONICAL, parse_flags


def test_each_flag_comes_from_the_most_trusted_source_that_has_it_and_says_which() -> None:
    d = resolve(
        cache_config=CacheConfig(block_size=16),
        max_model_len=None,
        version=None,
        cmdline={"block_size": 32, "max_num_seqs": 64},
        config=Deployment(max_num_seqs=8, gpu="L4"),
    )
    assert (d.block_size, d.max_num_seqs, d.gpu) == (16, 64, "L4")
    assert dict(d.origin) == {
        "block_size": FROM_CACHE_CONFIG,
        "max_num_seqs": FROM_CMDLINE,
        "gpu": FROM_CONFIG,
    }


def test_a_value_not_of_the_flags_type_is_passed_over_for_the_next_source() -> None:
    d = resolve(
        cache_config=None,
        max_model_len=None,
        version=None,
        cmdline={"max_num_seqs": "64", "enforce_eager": 1},
        config=Deployment(max_num_seqs=8),
    )
    assert (d.max_num_seqs, d.enforce_eager) == (8, None)
    assert d.origin["max_num_seqs"] == FROM_CONFIG


def test_a_whole_number_utilization_is_a_float() -> None:
    d = resolve(
        cache_config=None, max_model_len=None, version=None, cmdline={"gpu_memory_utilization": 1},
        config=None,
    )  # fmt: skip
    assert d.gpu_memory_utilization == 1.0
    assert isinstance(d.gpu_memory_utilization, float)


def test_every_flag_the_command_line_types_arrives_with_the_deployments_type() -> None:
    argv = ["vllm", "serve", "/m", "-tp", "2", "--max-num-seqs", "8", "--dtype", "half"]
    argv += ["--gpu-memory-utilization", "0.8", "--enforce-eager", "--cpu-offload-gb", "2"]
    argv += ["--speculative-config", '{"method": "ngram"}', "--max-model-len", "4K"]
    flags = parse_flags(argv, read_text=lambda _: "")
    d = resolve(
        cache_config=None, max_model_len=None, version=None, cmdline=dict(flags.values),
        config=None,
    )  # fmt: skip
    assert {k for k, _ in d.items()} == set(flags.values)
    hints = get_type_hints(Deployment)
    for key, value in d.items():
        assert isinstance(value, get_args(hints[key])[0]), key


def test_the_command_lines_typed_flags_that_size_the_cache_are_all_deployment_fields() -> None:
    # Flags the parser reads for the server's own use, not for the cache's size.
    elsewhere = {"served_model_name", "swap_space", "max_num_partial_prefills", "port", "host"}
    elsewhere |= {"disable_hybrid_kv_cache_manager", "async_scheduling"}
    parsed = {name for name, _ in CANONICAL.values()}
    assert parsed - elsewhere <= set(FLAGS)


def test_items_list_the_known_flags_and_leave_out_the_origin() -> None:
    d = Deployment(model="m", max_num_seqs=4, origin={"model": FROM_CONFIG})
    assert d.items() == (("model", "m"), ("max_num_seqs", 4))


def _told_blocks(version: str, key: str, value: str | None) -> tuple[int, int]:
    """Llama-3.1-8B on an H100 under ``version``: the sidecar's expected plan's blocks when
    told ``deployment.<key>`` through its environment, and plan's with ``--<key>``."""
    from exporter.capacity.plan import plan
    from exporter.cli import build_parser
    from exporter.config import load_config
    from exporter.deployment import plan_request
    from exporter.plan.cli import build_request

    flag = "--" + key.replace("_", "-")
    argv = ["plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100"]
    argv += ["--vllm-version", version] + ([flag, value] if value else [])
    cli = build_request(build_parser().parse_args(argv))
    env = {"KV_HEADROOM_DEPLOYMENT_VLLM_VERSION": version}
    if value:
        env[f"KV_HEADROOM_DEPLOYMENT_{key.upper()}"] = value
    config = load_config({}, env)
    assert getattr(config.deployment, key) == value
    deployment = resolve(
        cache_config=None, max_model_len=None, version=None, cmdline=None, config=config.deployment
    )
    assert deployment.origin.get(key) == (FROM_CONFIG if value else None)
    expected = plan_request(
        deployment,
        arch=cli.arch,
        model_name=cli.model_name,
        gpu=cli.gpu,
        weights_bytes=cli.weights_bytes,
        weights_source=cli.weights_source,
    )
    return plan(expected).cap.num_blocks, plan(cli).cap.num_blocks


def test_deployment_flashinfer_moves_the_expected_plan_as_plan_flashinfer_does() -> None:
    # Before 0.11.1 vLLM's profile-run sampler sorts the logits unless FlashInfer is
    # installed (memory.sampler_path); no vLLM page or flag says which, so the sidecar is
    # told with deployment.flashinfer, as plan is with --flashinfer.
    pip, image, absent = (
        _told_blocks("0.10.2", "flashinfer", f) for f in (None, "installed", "absent")
    )
    assert pip[0] == pip[1]  # the sidecar's expected plan is plan's, block for block
    assert image[0] == image[1]
    assert absent == pip
    assert image[0] > pip[0]  # the image's sort-free sampler: a smaller peak, more blocks
    # ignored from 0.17
    assert _told_blocks("0.32.0", "flashinfer", "installed") == _told_blocks(
        "0.32.0", "flashinfer", None
    )


def test_deployment_model_runner_moves_the_expected_plan_as_plan_model_runner_does() -> None:
    # VLLM_USE_V2_MODEL_RUNNER sits in vLLM's environment, which no page or flag shows: the
    # sidecar is told with deployment.model_runner, as plan is with --model-runner. Under
    # 0.26 a dense model defaults to V2, which subtracts no CUDA-graph estimate; V1 does.
    default, v1, v2 = (_told_blocks("0.26.0", "model_runner", r) for r in (None, "v1", "v2"))
    assert v1[0] == v1[1]  # the sidecar's expected plan is plan's, block for block
    assert default == v2
    assert v1[0] < v2[0]  # V1 also subtracts the graph estimate


def test_the_state_dtypes_and_prefix_caching_vllm_resolved_reach_the_expected_plan() -> None:
    # cache_config_info states them as vLLM resolved them (Qwen3.5's SSM state in float32
    # from its checkpoint); the expected plan sizes a hybrid model's state pages with them.
    import json
    from pathlib import Path

    from exporter.capacity.arch import parse_config
    from exporter.capacity.gpus import lookup_gpu
    from exporter.capacity.plan import plan
    from exporter.deployment import plan_request

    config = Path(__file__).parent / "fixtures/sizing/configs/Qwen__Qwen3.5-0.8B/config.json"
    labels = {"mamba_cache_dtype": "auto", "mamba_ssm_cache_dtype": "bfloat16"}
    labels |= {"enable_prefix_caching": "False", "block_size": "16"}
    d = resolve(
        cache_config=CacheConfig.from_labels(labels), max_model_len=8192, version="0.28.0",
        cmdline=None, config=None,
    )  # fmt: skip
    request = plan_request(
        d,
        arch=parse_config(json.loads(config.read_text()), str(config)),
        model_name="Qwen/Qwen3.5-0.8B",
        gpu=lookup_gpu("A100"),
        weights_bytes=None,
        weights_source="estimate",
    )
    assert (request.mamba_ssm_cache_dtype, request.enable_prefix_caching) == ("bfloat16", False)
    assert plan(request).block_size == 288  # a bf16 state page, not the checkpoint's float32
