"""The deployment flags that move vLLM's capacity without being KV flags (issue 28, item 5).

Where vLLM's CPU build runs a flag, the start-up captured here is reproduced exactly
(tests/fixtures/sizing/cpu-0.32/flags/); where it cannot (GPU memory: weights, LoRA
buffers, offloading), against arithmetic written out from vLLM 0.32's code.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

import pytest

from exporter.capacity.arch import ModelArch, parse_config
from exporter.capacity.deploy_flags import (
    DEFAULT_MM_PROFILE,
    Lora,
    MultimodalProfile,
    Speculative,
    deployment_flags,
    encoder_profile_items,
    image_at_max_pixels,
    lora_buffer_bytes,
    parse_mm_limits,
    parse_mm_processor_kwargs,
    parse_speculative_config,
    profiled_arch,
    speculative_from,
)
from exporter.capacity.gpus import lookup_gpu
from exporter.capacity.plan import Context, PlanRequest, plan, what_ifs
from exporter.capacity.releases import release
from exporter.cli import build_parser
from exporter.deployment import plan_request, resolve
from exporter.errors import InputError
from exporter.plan.cli import build_request
from tests.conftest import FIXTURES, fixture_config

GIB = 1 << 30
FLAGS_DIR = FIXTURES / "sizing" / "cpu-0.32" / "flags"


def _starts() -> list[dict[str, str]]:
    with (FLAGS_DIR / "starts.csv").open(encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _cache_config_info(log: Path) -> dict[str, str]:
    line = next(x for x in log.read_text(encoding="utf-8").splitlines() if x.startswith("vllm:"))
    return dict(re.findall(r'(\w+)="([^"]*)"', line))


def _plan_args(row: dict[str, str]) -> list[str]:
    flags = row["flags"].replace("{here}", str(FLAGS_DIR))
    return [
        "plan",
        "--model",
        str((FLAGS_DIR / row["config"] / "config.json").resolve()),
        "--gpu",
        "cpu",
        "--vllm-version",
        "0.32.0",
        "--kv-cache-memory-bytes",
        str(int(row["vllm_cpu_kvcache_space_gib"]) * GIB),
        *flags.split(),  # the JSON values hold no spaces
    ]


@pytest.mark.parametrize("row", _starts(), ids=lambda r: r["log"])
def test_each_cpu_start_up_with_a_deployment_flag_is_reproduced_exactly(
    row: dict[str, str],
) -> None:
    # The flags as the start-up was given them, through plan's own parser.
    args = build_parser().parse_args(_plan_args(row))
    result = plan(build_request(args))
    printed = _cache_config_info(FLAGS_DIR / row["log"])
    assert result.cap.num_blocks == int(printed["num_gpu_blocks"])
    assert result.cap.capacity_tokens == int(printed["kv_cache_size_tokens"])
    assert result.cap.max_concurrency == pytest.approx(
        float(printed["kv_cache_max_concurrency"]), rel=1e-12
    )


def test_the_cpu_start_ups_cover_every_method_the_cpu_build_runs() -> None:
    flags = " ".join(r["flags"] for r in _starts())
    for method in ("ngram", "draft_model", "eagle", "eagle3", "mtp"):
        assert f'"method":"{method}"' in flags
    assert "--enable-lora" in flags
    assert "--cpu-offload-gb" in flags
    # The drafter's layers cost the pool; n-gram, LoRA and offloading (KV memory given
    # on the CPU backend) leave the 8,192 blocks of the plain start.
    blocks = {
        r["log"]: int(_cache_config_info(FLAGS_DIR / r["log"])["num_gpu_blocks"]) for r in _starts()
    }
    assert blocks["llama-gqa-ngram.log"] == blocks["llama-gqa-lora.log"] == 8192
    assert blocks["llama-gqa-draft-2l.log"] == 5461  # 1 GiB / (32 KiB × (4 + 2) layers)
    assert blocks["llama-gqa-eagle.log"] == 6553  # 1 GiB / (32 KiB × (4 + 1) layers)


def llama(**changes: object) -> PlanRequest:
    arch = parse_config(fixture_config("meta-llama__Llama-3.1-8B-Instruct"), "llama")
    base = PlanRequest(
        arch=arch,
        model_name="Llama-3.1-8B-Instruct",
        gpu=lookup_gpu("H100-80GB"),
        release=release("0.32.0"),
        max_model_len=8192,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_lookahead_slots_cost_sequences_at_run_time_but_not_the_printed_concurrency() -> None:
    # EAGLE with 3 tokens: the scheduler allocates 3 slots past each request
    # (kv_cache_manager.py::allocate_slots), so a 2,048-token sequence spans
    # cdiv(2051, 16) = 129 blocks, not 128; vLLM's startup figures ignore them.
    arch = llama().arch
    eagle = Speculative("eagle", 3)
    base = plan(llama(contexts=(Context("2048", 2048),)))
    drafted = plan(llama(contexts=(Context("2048", 2048),), speculative=eagle))
    assert drafted.cap == base.cap
    assert drafted.sequences[0][1] == (base.cap.num_blocks - 1) // 129
    assert base.sequences[0][1] == (base.cap.num_blocks - 1) // 128
    ngram = plan(llama(contexts=(Context("2048", 2048),), speculative=Speculative("ngram", 4)))
    assert ngram.sequences == base.sequences
    assert arch.num_layers == 32


def test_a_drafter_adds_its_weights_and_its_layers_to_every_block() -> None:
    draft_arch = parse_config(
        json.loads((FLAGS_DIR / "draft-llama-2l" / "config.json").read_text()), "draft"
    )
    doc = parse_speculative_config(
        '{"method": "draft_model", "model": "d", "num_speculative_tokens": 4}', "x"
    )
    spec = speculative_from(doc, target=llama().arch, draft=draft_arch, draft_weights_bytes=GIB)
    assert spec.lookahead_tokens == 4
    assert len(spec.kv_layers) == 2
    base, drafted = plan(llama()), plan(llama(speculative=spec))
    assert drafted.tightest.weights == base.tightest.weights + GIB
    # Llama-3.1-8B's page is 16 tokens × 8 heads × (128 + 128) × 2 B = 64 KiB a layer; the
    # draft's two layers of 2 heads × (32 + 32) dims add 4 KiB each, in one uniform-type
    # group whose block costs every layer's page (UniformTypeKVCacheSpecs.page_size_bytes).
    assert base.layout.stage_bytes_per_block(0) == 32 * 65536
    assert drafted.layout.stage_bytes_per_block(0) == 32 * 65536 + 2 * 4096
    assert drafted.kv_bytes_per_token == base.kv_bytes_per_token + 2 * 256


def test_mtp_takes_the_models_own_modules_and_needs_no_draft_config() -> None:
    cfg = json.loads((FLAGS_DIR / "deepseek-v3-mtp" / "config.json").read_text())
    arch = parse_config(cfg, "dsv3")
    assert arch.mtp_layers == 1
    doc = parse_speculative_config('{"method": "deepseek_mtp"}', "x")
    spec = speculative_from(doc, target=arch)
    assert spec.method == "mtp"
    assert spec.num_speculative_tokens == 1
    assert spec.kv_layers == (arch.layers[-1],)
    assert spec.weights_bytes > 0  # one decoder layer and its eh_proj; embedding shared


def test_unknown_methods_and_missing_counts_are_refused_in_vllms_words() -> None:
    with pytest.raises(InputError, match="use one of"):
        parse_speculative_config('{"method": "lookahead", "num_speculative_tokens": 2}', "x")
    with pytest.raises(InputError, match="num_speculative_tokens"):
        parse_speculative_config('{"method": "eagle", "model": "m"}', "x")
    with pytest.raises(InputError, match="JSON object"):
        parse_speculative_config("[1]", "x")
    # vLLM's inference: no method and no model is n-gram; a model alone, a draft model.
    assert parse_speculative_config('{"num_speculative_tokens": 2}', "x")["method"] == "ngram"
    both = parse_speculative_config('{"model": "m", "num_speculative_tokens": 2}', "x")
    assert both["method"] == "draft_model"


def _lora_rows() -> list[dict[str, str]]:
    with (FLAGS_DIR / "lora-buffers.csv").open(encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("row", _lora_rows(), ids=lambda r: r["config"])
def test_lora_buffers_are_what_vllms_cpu_build_allocates_to_the_byte(row: dict[str, str]) -> None:
    # Summed in process over every lora_a_stacked / lora_b_stacked tensor of the loaded
    # model (flags/README.md); Gemma 2 and DeepSeek declare no embedding modules.
    config = json.loads((FLAGS_DIR / row["config"] / "config.json").read_text())
    arch = parse_config(config, row["config"])
    lora = Lora(max_loras=int(row["max_loras"]), max_lora_rank=int(row["max_lora_rank"]))
    got = lora_buffer_bytes(arch, lora, tp=1, layers=range(arch.num_layers))
    assert got == int(row["lora_buffer_bytes"])
    assert got == sum(json.loads(row["by_layer_type"]).values())


def _llama8b_lora_elems_per_adapter_rank() -> int:
    # vllm/lora/layers (0.32), Llama-3.1-8B at TP1, per adapter and per unit of rank:
    # qkv_proj (3 slices): A 3 × 4096, B 4096 + 1024 + 1024; o_proj: A 4096, B 4096;
    # gate_up_proj (2 slices): A 2 × 4096, B 2 × 14336; down_proj: A 14336, B 4096.
    layer = 3 * 4096 + (4096 + 2 * 1024) + 4096 + 4096 + 2 * 4096 + 2 * 14336 + 14336 + 4096
    embed = 128_256 + 4096  # A: vocab × rank, B: hidden × rank
    lm_head = 4096 + 128_256  # A: rank × hidden, B: vocab × rank
    return 32 * layer + embed + lm_head


def test_lora_buffers_are_vllms_stacked_a_and_b_tensors() -> None:
    arch = llama().arch
    lora = Lora(max_loras=4, max_lora_rank=64)
    expected = 4 * 64 * _llama8b_lora_elems_per_adapter_rank() * 2  # bf16
    assert lora_buffer_bytes(arch, lora, tp=1, layers=range(32)) == expected
    base, with_lora = plan(llama()), plan(llama(lora=lora))
    assert with_lora.tightest.weights == base.tightest.weights + expected
    assert with_lora.cap.num_blocks < base.cap.num_blocks
    assert with_lora.flag_memory["lora_buffers"] == expected


def test_lora_buffers_shard_over_tp_as_the_column_and_row_layers_do() -> None:
    arch = llama().arch
    lora = Lora(max_loras=1, max_lora_rank=16)
    one = lora_buffer_bytes(arch, lora, tp=1, layers=range(32))
    two = lora_buffer_bytes(arch, lora, tp=2, layers=range(32))
    full = lora_buffer_bytes(arch, replace(lora, fully_sharded=True), tp=2, layers=range(32))
    assert full < two < one
    assert two > one // 2  # the embedding, LM head and unsharded halves stay whole


def test_cpu_offload_moves_whole_parameters_of_the_decoder_layers() -> None:
    base = plan(llama())
    off = plan(llama(cpu_offload_gb=4))
    moved = off.flag_memory["cpu_offloaded"]
    # vLLM's UVA offloader walks Llama-3.1-8B's decoder layers (436,224,000 B each in bf16)
    # parameter by parameter — qkv_proj 4096 × 6144, o_proj 4096², gate_up_proj
    # 2 × 14336 × 4096, down_proj 14336 × 4096, two norms of 4096 — until 4 GiB is
    # reached: nine whole layers, then the tenth's down_proj crosses the line.
    layer = 436_224_000
    tenth = (4096 * 6144 + 4096 * 4096 + 2 * 14336 * 4096 + 14336 * 4096) * 2
    assert moved == 9 * layer + tenth
    assert 4 * GIB <= moved < 4 * GIB + 2 * 14336 * 4096 * 2
    assert off.tightest.weights == base.tightest.weights - moved
    assert off.cap.num_blocks > base.cap.num_blocks
    # More than the decoder layers hold cannot move: the embedding and LM head stay.
    everything = plan(llama(cpu_offload_gb=100)).flag_memory["cpu_offloaded"]
    assert everything < base.tightest.weights


def test_weights_that_do_not_load_get_a_cpu_offload_what_if_that_starts() -> None:
    arch = parse_config(fixture_config("meta-llama__Llama-3.1-8B-Instruct"), "llama")
    req = replace(llama(), arch=arch, gpu=lookup_gpu("L4"), max_model_len=4096)
    base = plan(replace(req, weights_bytes=30 * GIB))
    assert base.startup_failure is not None
    assert base.startup_failure.cause == "load_oom"
    rows = {w.label: w for w in what_ifs(base)}
    label = next(k for k in rows if k.startswith("--cpu-offload-gb"))
    offload = int(label.split()[1])
    started = rows[label].plan
    assert started is not None
    assert started.startup_failure is None
    fewer = plan(replace(base.request, cpu_offload_gb=float(offload - 1)))
    assert fewer.startup_failure is not None  # the fewest whole GiB that start


def test_flags_given_get_a_what_if_without_them() -> None:
    labels = [w.label for w in what_ifs(plan(llama(lora=Lora(), cpu_offload_gb=2.0)))]
    assert "without --enable-lora" in labels
    assert "--cpu-offload-gb 0" in labels


def test_kv_offloading_leaves_the_gpu_blocks_and_says_why() -> None:
    base, tiered = plan(llama()), plan(llama(kv_offloading_size=64.0))
    assert tiered.cap == base.cap
    assert any("CPU tier" in n for n in tiered.notes)


def test_the_encoder_profile_batches_as_many_images_as_the_budget_holds() -> None:
    cfg = fixture_config("google__gemma-3-27b-it")
    arch = parse_config(cfg, "gemma3")
    assert arch.vision_item_tokens == 256
    assert arch.vision_profile_elems > 0
    # 8,192 batched tokens / 256 tokens an image = 32 images in the profile batch.
    assert encoder_profile_items(arch, 8192, 1024, DEFAULT_MM_PROFILE, 131_072) == 32
    limited = MultimodalProfile(limits=(("image", 1),))
    assert encoder_profile_items(arch, 8192, 4, limited, 131_072) == 4  # 4 seqs × 1 image
    req = PlanRequest(
        arch=arch,
        model_name="gemma-3-27b",
        gpu=lookup_gpu("H100-80GB"),
        release=release("0.32.0"),
        max_model_len=32_768,
    )
    full, skipped = plan(req), plan(replace(req, mm_profile=MultimodalProfile(skip=True)))
    text = plan(replace(req, mm_profile=MultimodalProfile(language_model_only=True)))
    assert skipped.tightest.activation <= full.tightest.activation
    assert text.tightest.activation == skipped.tightest.activation
    assert "encoder_profile" in full.sources


def test_limit_mm_per_prompt_reads_both_of_vllms_spellings() -> None:
    assert parse_mm_limits('{"image": 0, "video": {"count": 1}}', "x") == (
        ("image", 0),
        ("video", 1),
    )
    assert MultimodalProfile(limits=(("image", 0),)).allows_none(("image",))
    with pytest.raises(InputError):
        parse_mm_limits('{"image": -1}', "x")


def test_the_sidecar_reads_the_same_flags_from_vllms_command_line() -> None:
    values = {
        "speculative_config": '{"method": "ngram", "num_speculative_tokens": 5}',
        "enable_lora": True,
        "max_loras": 3,
        "max_lora_rank": 32,
        "cpu_offload_gb": 2.0,
        "kv_offloading_size": 16.0,
        "limit_mm_per_prompt": '{"image": 0}',
    }
    out = deployment_flags(values, llama().arch)
    assert out["speculative"].method == "ngram"
    assert out["lora"] == Lora(max_loras=3, max_lora_rank=32)
    assert out["cpu_offload_gb"] == 2.0
    assert out["kv_offloading_size"] == 16.0
    assert out["mm_profile"].allows_none(("image",))
    # A flag vLLM would have refused is left out, not guessed at.
    assert "speculative" not in deployment_flags({"speculative_config": "{"}, llama().arch)


def sidecar_request(flags: Mapping[str, object], arch: ModelArch, context: int) -> PlanRequest:
    """The plan the sidecar expects on an H100 from vLLM's parsed command line, as the
    poller resolves it (``/v1/models`` giving ``context`` and 0.32.0)."""
    deployment = resolve(
        cache_config=None, max_model_len=context, version="0.32.0", cmdline=flags, config=None
    )
    return plan_request(
        deployment,
        arch=arch,
        model_name="m",
        gpu=lookup_gpu("H100-80GB"),
        weights_bytes=None,
        weights_source="estimate",
    )


def test_vllms_command_line_and_config_file_carry_the_flags_to_the_expected_plan() -> None:
    from exporter.sources.cmdline import parse_flags

    config = "speculative-config:\n  method: eagle\n  model: %s\n  num_speculative_tokens: 2\n"
    eagle_dir = FLAGS_DIR / "eagle-llama-1l"
    flags = parse_flags(
        [
            "vllm",
            "serve",
            "/models/llama",
            "--config",
            "/etc/vllm.yaml",
            "--enable-lora",
            "--max-loras",
            "4",
            "--max-lora-rank",
            "64",
            "--cpu-offload-gb",
            "2",
            "--limit-mm-per-prompt",
            '{"image": 0}',
        ],
        read_text=lambda _: config % eagle_dir,
    )
    assert flags.problems == ()
    assert flags.values["enable_lora"] is True
    assert json.loads(str(flags.values["speculative_config"]))["method"] == "eagle"
    request = sidecar_request(flags.values, llama().arch, 8192)
    assert request.lora == Lora(max_loras=4, max_lora_rank=64)
    assert request.cpu_offload_gb == 2.0
    assert request.mm_profile.allows_none(("image",))
    assert request.speculative is not None
    assert len(request.speculative.kv_layers) == 1  # the EAGLE head's config, read locally
    expected = plan(request)
    assert expected.flag_memory["lora_buffers"] > 0


def test_plan_prints_what_each_flag_puts_in_the_weights_row_and_its_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from exporter.cli import main

    eagle = json.dumps(
        {"method": "eagle", "model": str(FLAGS_DIR / "eagle-llama-1l"), "num_speculative_tokens": 3}
    )
    args = ["plan", "--model", "Llama-3.1-8B-Instruct", "--max-model-len", "8192"]
    args += ["--enable-lora", "--max-loras", "2", "--cpu-offload-gb", "1"]
    args += ["--speculative-config", eagle, "--kv-offloading-size", "32"]
    assert main(args) == 0
    table = capsys.readouterr().out
    for row in ("of which the drafter", "of which LoRA buffers", "kept on the host"):
        assert row in table
    assert "without --speculative-config" in table
    assert "CPU tier" in table
    assert main([*args, "--output", "json", "--no-what-if"]) == 0
    doc = json.loads(capsys.readouterr().out)["deploy_flags"]
    assert doc["speculative"]["draft_kv_layers"] == 1
    assert doc["speculative"]["lookahead_tokens"] == 3
    assert doc["lora_buffer_bytes"] > 0
    assert doc["cpu_offloaded_bytes"] >= GIB
    assert doc["kv_offloading_size_gib"] == 32


def test_lora_sizes_without_enable_lora_are_refused() -> None:
    args = build_parser().parse_args(
        ["plan", "--model", "Llama-3.1-8B-Instruct", "--max-loras", "2"]
    )
    with pytest.raises(InputError, match="--enable-lora"):
        build_request(args)


def test_the_sidecars_ceilings_count_the_lookahead_slots_too() -> None:
    from exporter.capacity.live import blocks_per_sequence

    plain = plan(llama())
    eagle = plan(llama(speculative=Speculative("eagle", 3)))
    assert blocks_per_sequence(plain.layout, 16, 2048) == 128
    assert blocks_per_sequence(eagle.layout, 16, 2048) == 129  # cdiv(2051, 16)
    # No more than max_model_len (8,192): allocate_slots caps the reservation there.
    assert blocks_per_sequence(eagle.layout, 16, 8192) == 512


def test_a_drafter_whose_config_cannot_be_read_is_said_to_be_left_out() -> None:
    doc = {"method": "eagle", "model": "org/head", "num_speculative_tokens": 2}
    out = deployment_flags(
        {"speculative_config": json.dumps(doc)},
        llama().arch,
        load_draft=lambda _: None,
    )
    result = plan(llama(**out))
    assert result.cap == plan(llama()).cap
    assert "not counted" in result.sources["speculative"]
    assert any("could not be read" in n for n in result.notes)


def _lookahead_rows() -> list[dict[str, str]]:
    with (FLAGS_DIR / "lookahead.csv").open(encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("row", _lookahead_rows(), ids=lambda r: r["start"])
def test_the_first_blocks_a_sequence_takes_are_what_vllms_cpu_build_reserved(
    row: dict[str, str],
) -> None:
    # The fewest blocks the 126-token request held while it ran on vLLM's CPU build: one
    # without a drafter, two with EAGLE's 3 lookahead slots (126 + 3 > 128).
    args = [
        "plan",
        "--model",
        str((FLAGS_DIR / ".." / "llama-gqa" / "config.json").resolve()),
        "--gpu",
        "cpu",
        "--kv-cache-memory-bytes",
        str(GIB),
        *row["flags"].replace("{here}", str(FLAGS_DIR)).split(),
    ]
    result = plan(build_request(build_parser().parse_args(args)))
    assert result.cap.num_blocks == int(row["num_gpu_blocks"])
    seen = [int(x) for x in row["blocks_in_use_seen"].split()]
    prompt, done = (
        int(row["prompt_tokens"]),
        int(row["prompt_tokens"]) + int(row["completion_tokens"]),
    )
    layout = result.layout
    assert layout.blocks_per_request(layout.running_tokens(prompt), 0) == seen[0]
    assert layout.blocks_per_request(layout.running_tokens(done - 1), 0) == seen[-1]


def test_a_drafter_run_unsharded_keeps_its_whole_weights_and_heads_on_every_gpu() -> None:
    draft_arch = parse_config(
        json.loads((FLAGS_DIR / "draft-llama-2l" / "config.json").read_text()), "draft"
    )
    doc = {"method": "draft_model", "model": "d", "num_speculative_tokens": 2}
    sharded = speculative_from(doc, target=llama().arch, draft=draft_arch, draft_weights_bytes=GIB)
    whole = replace(sharded, draft_tensor_parallel_size=1)
    at_tp2 = {s: plan(llama(tensor_parallel_size=2, speculative=s)) for s in (sharded, whole)}
    assert at_tp2[whole].flag_memory["draft_weights"] == GIB
    assert at_tp2[sharded].flag_memory["draft_weights"] == GIB // 2
    # 2 KV heads of 32 + 32 dims, 2 layers, bf16: 512 B a token whole, 256 B split over TP 2.
    base = plan(llama(tensor_parallel_size=2)).kv_bytes_per_token
    assert at_tp2[whole].kv_bytes_per_token == base + 512
    assert at_tp2[sharded].kv_bytes_per_token == base + 256
    with pytest.raises(InputError, match="draft_tensor_parallel_size"):
        plan(
            llama(tensor_parallel_size=4, speculative=replace(whole, draft_tensor_parallel_size=2))
        )


def test_vllms_dotted_spelling_of_a_json_flag_is_read_and_merged() -> None:
    from exporter.sources.cmdline import parse_flags

    flags = parse_flags(
        [
            "vllm",
            "serve",
            "M",
            "--speculative-config",
            '{"method": "eagle", "model": "x"}',
            "--speculative_config.num_speculative_tokens=3",
            "--limit-mm-per-prompt.image",
            "0",
        ]
    )
    assert json.loads(str(flags.values["speculative_config"])) == {
        "method": "eagle",
        "model": "x",
        "num_speculative_tokens": 3,
    }
    assert json.loads(str(flags.values["limit_mm_per_prompt"])) == {"image": 0}
    assert flags.model == "M"


def test_an_eagle3_head_is_estimated_with_its_own_lm_head_over_the_draft_vocabulary() -> None:
    config = json.loads((FLAGS_DIR / "eagle3-llama-1l" / "config.json").read_text())
    head = parse_config(config, "eagle3")
    doc = {"method": "eagle3", "model": "m", "num_speculative_tokens": 3}
    without = speculative_from(doc, target=llama().arch, draft=head)
    own = speculative_from(doc, target=llama().arch, draft=head, draft_vocab=1024)
    assert own.weights_bytes - without.weights_bytes == 1024 * 256 * 2  # vocab × hidden × bf16


def test_vllm_033_refuses_the_medusa_drafters_it_removed() -> None:
    # 0.33's SpeculativeMethod has no "medusa" or "mlp_speculator" (vllm/config/speculative.py)
    # and its model runner no MedusaProposer; 0.32 runs them (no drafter KV, no lookahead).
    for method in ("medusa", "mlp_speculator"):
        spec = Speculative(method, 2)
        assert plan(llama(speculative=spec)).cap == plan(llama()).cap
        with pytest.raises(InputError, match=r"removed in vLLM 0\.33"):
            plan(llama(speculative=spec, release=release("0.33.0")))


def test_vllm_033_draft_lm_head_quantization_adds_a_quantized_copy_of_the_lm_head() -> None:
    # quantized_lm_head_copy (0.33, online/lm_head.py): this rank's rows of the target's LM
    # head (vocabulary padded to 64), fp8 with an fp32 scale per row, or nvfp4 with an E4M3
    # scale per 16 weights and one fp32 global scale; the target keeps its own bf16 head.
    v033 = release("0.33.0")
    doc = parse_speculative_config(
        '{"method": "eagle", "model": "m", "num_speculative_tokens": 3,'
        ' "draft_lm_head_quantization": "fp8"}',
        "x",
    )
    spec = speculative_from(doc, target=llama().arch)
    assert spec.lm_head_quantization == "fp8"
    shared = replace(spec, lm_head_quantization=None)
    base = plan(llama(speculative=shared, release=v033))
    fp8 = plan(llama(speculative=spec, release=v033))
    rows = 128_256  # Llama 3.1's vocabulary, already a multiple of 64
    assert fp8.tightest.weights - base.tightest.weights == rows * 4096 + rows * 4
    assert fp8.cap.num_blocks < base.cap.num_blocks
    assert fp8.flag_memory["draft_weights"] == rows * 4096 + rows * 4
    nvfp4 = plan(llama(speculative=replace(spec, lm_head_quantization="nvfp4"), release=v033))
    assert nvfp4.tightest.weights - base.tightest.weights == rows * 2048 + rows * 256 + 4
    tp2 = plan(llama(speculative=spec, release=v033, tensor_parallel_size=2))
    base2 = plan(llama(speculative=shared, release=v033, tensor_parallel_size=2))
    assert tp2.tightest.weights - base2.tightest.weights == rows // 2 * 4096 + rows // 2 * 4
    # Not in 0.32; only for drafters that share the target's head, in vLLM's words.
    with pytest.raises(InputError, match=r"new in vLLM 0\.33"):
        plan(llama(speculative=spec))
    with pytest.raises(InputError, match="not supported for method 'draft_model'"):
        parse_speculative_config(
            '{"method": "draft_model", "model": "m", "num_speculative_tokens": 3,'
            ' "draft_lm_head_quantization": "fp8"}',
            "x",
        )
    with pytest.raises(InputError, match="use one of fp8, nvfp4"):
        parse_speculative_config('{"method": "mtp", "draft_lm_head_quantization": "int4"}', "x")
    own_head = parse_config(
        json.loads((FLAGS_DIR / "eagle3-llama-1l" / "config.json").read_text()), "eagle3"
    )
    doc3 = {**doc, "method": "eagle3"}
    with pytest.raises(InputError, match="shares the target lm_head"):
        speculative_from(doc3, target=llama().arch, draft=own_head, draft_vocab=1024)


def qwen25_vl(**changes: object) -> PlanRequest:
    arch = parse_config(fixture_config("Qwen__Qwen2.5-VL-7B-Instruct"), "qwen2.5-vl")
    base = PlanRequest(
        arch=arch,
        model_name="Qwen2.5-VL-7B-Instruct",
        gpu=lookup_gpu("H100-80GB"),
        release=release("0.32.0"),
        max_model_len=32_768,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_mm_processor_kwargs_are_resolved_as_vllm_resolves_the_profiles_image_size() -> None:
    # Qwen2VLProcessingInfo.get_image_size_with_most_features (0.32, 0.33): the configured
    # kwargs routed into images_kwargs (a value scoped there wins over the flat one), then
    # max_pixels over size.longest_edge.
    assert parse_mm_processor_kwargs('{"max_pixels": 1003520}', "x") == 1003520
    assert parse_mm_processor_kwargs('{"size": {"longest_edge": 802816}}', "x") == 802816
    both = '{"max_pixels": 1003520, "size": {"longest_edge": 802816, "shortest_edge": 3136}}'
    assert parse_mm_processor_kwargs(both, "x") == 1003520
    scoped = '{"max_pixels": 1003520, "images_kwargs": {"max_pixels": 401408}}'
    assert parse_mm_processor_kwargs(scoped, "x") == 401408
    assert parse_mm_processor_kwargs({"fps": 2, "min_pixels": 3136}, "x") is None
    with pytest.raises(InputError, match="whole number of pixels"):
        parse_mm_processor_kwargs('{"max_pixels": "many"}', "x")
    with pytest.raises(InputError, match="not a JSON object"):
        parse_mm_processor_kwargs("[1]", "x")


def test_a_max_pixels_limit_sizes_the_encoder_profiles_largest_image() -> None:
    # Qwen2.5-VL-7B's real config: 14-pixel patches merged 2 × 2, a 3,420-wide MLP and no
    # image_size, so the processor's max_pixels (default 12,845,056) sets the largest image:
    # 12,845,056 // 28² = 16,384 tokens of 4 patches. With max_pixels 1,003,520 (1,280 × 28²)
    # the profile's image is 1,280 tokens, 32 × 40 squares of 28 pixels.
    req = qwen25_vl()
    arch = req.arch
    assert arch.dynamic_vision == (14, 2, 3420)
    assert image_at_max_pixels(arch, 12_845_056) == (16_384, 65_536 * 3420)
    assert (arch.vision_item_tokens, arch.vision_profile_elems) == (16_384, 65_536 * 3420)
    assert image_at_max_pixels(arch, 1_003_520) == (1280, 5120 * 3420)
    # A prime count of squares has no factor pair within an aspect of 200: one fewer.
    assert image_at_max_pixels(arch, 211 * 784) == (210, 840 * 3420)
    limited_mm = MultimodalProfile(max_pixels=1_003_520)
    sized = profiled_arch(arch, limited_mm)
    # The encoder budget (8,192 batched tokens) now holds 6 such images, not one larger one.
    assert encoder_profile_items(arch, 8192, 1024, DEFAULT_MM_PROFILE, 32_768) == 1
    assert encoder_profile_items(sized, 8192, 1024, limited_mm, 32_768) == 6
    # 64 sequences, so that the sampler's warm-up is not the larger peak, and eager, so
    # that the forward pass's cold torch.compile (which peaks after the encoder's) is not.
    req = replace(req, max_num_seqs=64, enforce_eager=True)
    full, limited = plan(req), plan(replace(req, mm_profile=limited_mm))
    assert "1 dummy item(s) of the largest image" in full.sources["encoder_profile"]
    assert limited.sources["encoder_profile"] == (
        "6 dummy item(s) of the largest image under max_pixels 1,003,520 (1,280 tokens)"
    )
    # 6 × 5,120 patches against 65,536: a smaller encoder peak, more blocks.
    assert limited.tightest.activation < full.tightest.activation
    assert limited.cap.num_blocks > full.cap.num_blocks
    # A fixed-size tower (Gemma 3's SigLIP, 896²) is not resized by it.
    gemma = parse_config(fixture_config("google__gemma-3-27b-it"), "gemma3")
    assert profiled_arch(gemma, limited_mm) is gemma


def _text(text: str) -> Callable[[str], str]:
    return lambda _: text


def test_mm_processor_kwargs_reach_plan_and_the_sidecar_from_vllms_flags() -> None:
    from exporter.sources.cmdline import parse_flags

    model = FIXTURES / "models" / "Qwen__Qwen2.5-VL-7B-Instruct" / "config.json"
    args = build_parser().parse_args(
        ["plan", "--model", str(model), "--mm-processor-kwargs", '{"max_pixels": 1003520}']
    )
    assert build_request(args).mm_profile.max_pixels == 1_003_520
    for argv, config in (
        (["--mm-processor-kwargs", '{"max_pixels": 1003520}'], ""),
        (["--mm-processor-kwargs.max_pixels", "1003520"], ""),
        (["--config", "/etc/vllm.yaml"], "mm-processor-kwargs:\n  max_pixels: 1003520\n"),
    ):
        flags = parse_flags(["vllm", "serve", "/models/qwen", *argv], read_text=_text(config))
        assert flags.problems == ()
        request = sidecar_request(flags.values, qwen25_vl().arch, 32_768)
        assert request.mm_profile.max_pixels == 1_003_520, argv
    # One vLLM would refuse is left out, not guessed at.
    bad = deployment_flags({"mm_processor_kwargs": '{"max_pixels": -1}'}, qwen25_vl().arch)
    assert bad["mm_profile"].max_pixels is None


def test_a_limit_on_one_modality_leaves_the_others_profiled() -> None:
    # vLLM keeps every modality whose limit is above 0; one the flag does not name keeps 999.
    assert not MultimodalProfile(limits=(("video", 0),)).allows_none(("image",))
    assert MultimodalProfile(limits=(("video", 0),)).allows_none(("video",))
    assert MultimodalProfile(language_model_only=True).allows_none(("image", "video"))
