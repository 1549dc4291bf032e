"""``kv-headroom plan``: vLLM's KV sizing before a deploy, as a table or one JSON object."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from exporter.capacity.arch import ModelArch, parse_config
from exporter.capacity.catalogue import describe
from exporter.capacity.deploy_flags import (
    NO_KV_METHODS,
    Lora,
    MultimodalProfile,
    parse_mm_limits,
    parse_mm_processor_kwargs,
    parse_speculative_config,
    speculative_from,
)
from exporter.capacity.gpus import CATALOGUE as GPU_CATALOGUE
from exporter.capacity.gpus import GpuChoice, parse_bytes, resolve_gpu
from exporter.capacity.kvcache import KV_CACHE_DTYPES, MAMBA_STATE_DTYPES
from exporter.capacity.memory import DEVICE_CAP_ROW
from exporter.capacity.plan import (
    Context,
    Plan,
    PlanRequest,
    Suggestion,
    WhatIf,
    fit,
    plan,
    what_ifs,
    what_would_work,
    why_not,
)
from exporter.capacity.releases import (
    DEFAULT_VERSION,
    NEWEST_KNOWN,
    OLDEST_KNOWN,
    format_version,
    parse_version,
)
from exporter.cli_args import bounded_float
from exporter.deployment import Deployment, plan_request
from exporter.errors import InputError
from exporter.plan.advice import (
    failure_lines,
    fit_json,
    parse_fit,
    recommendation_lines,
    recommendation_search_json,
    recommendations_json,
    render_fit,
    suggestion_lines,
    suggestions_json,
)
from exporter.plan.recommend import DEFAULT_MAX_REPLAYS, Recommendations, recommend
from exporter.plan.traffic import (
    DEFAULT_MAX_QUEUE_WAIT,
    DEFAULT_PRECISION,
    MAX_MULTIPLIER,
    MIN_MULTIPLIER,
    QUEUE_WAIT_QUANTILE,
    Headroom,
    Outcome,
    StatusLine,
    Traffic,
    assess_traffic,
    engine_at,
    load_traffic,
)
from exporter.simulator.requestlog import ROLES
from exporter.simulator.scenario import Scenario, parse_duration
from exporter.sources.model_dir import load_catalogue, load_model, load_restored

EXIT_OK, EXIT_WONT_START, EXIT_BAD_INPUT = 0, 1, 2
# With --traffic: the deployment starts but today's traffic (1×) preempts or queues past
# the bound. As much a "this will not work" as a refusal to start, so the same status: a
# deploy script that checks the plan's exit status stops on either.
EXIT_TRAFFIC_NOT_HELD = 1

_QUANTILE_RE = re.compile(r"^(p\d{1,2}(?:\.\d+)?|mean|max)=(\d+)$")


# vLLM's --block-size takes these (its BlockSize literal); anything else it refuses.
BLOCK_SIZES = (1, 8, 16, 32, 64, 128)


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "plan",
        help="size vLLM's KV cache for a model, GPU and flags, before a deploy",
        description=(
            "Size vLLM's KV cache as vLLM would at start-up: GPU memory → budget → blocks → "
            "tokens → sequences. Flags are spelled as vLLM spells them. Exit status: 0, "
            "1 when vLLM would refuse to start with these flags, 2 on bad input."
        ),
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", help="config.json, a model dir, or a catalogue name")
    what.add_argument("--list-models", action="store_true", help="list the catalogue and exit")
    what.add_argument("--list-gpus", action="store_true", help="list the GPU catalogue and exit")
    p.add_argument(
        "--gpu",
        default="H100-80GB",
        type=_gpu,
        help="catalogue name (A100 takes the 80 GB part and says so), 'cpu', or memory "
        "(79.19GiB); a count in front (2xH100) is the tensor-parallel size",
    )
    p.add_argument(
        "--vllm-version",
        metavar="VERSION",
        default=DEFAULT_VERSION,
        type=_version,
        help=f"release whose rules apply, {format_version(OLDEST_KNOWN)} to "
        f"{format_version(NEWEST_KNOWN)}",
    )
    p.add_argument(
        "--gpu-memory-utilization",
        metavar="FRACTION",
        type=_fraction,
        help="fraction of GPU memory vLLM may use (default: the release's, 0.92 since 0.20)",
    )
    p.add_argument(
        "--tensor-parallel-size",
        "-tp",
        metavar="N",
        type=_positive,
        help="GPUs per stage (default: 1, or the count of --gpu 2xH100 ÷ PP)",
    )
    p.add_argument(
        "--pipeline-parallel-size", "-pp", metavar="N", type=_positive, help="stages (default: 1)"
    )
    p.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=KV_CACHE_DTYPES,
        metavar="DTYPE",
        help=f"one of {', '.join(KV_CACHE_DTYPES)}",
    )
    p.add_argument("--dtype", default="auto", help="model dtype: auto, bfloat16, float16, float32")
    p.add_argument(
        "--quantization", "-q", metavar="METHOD", help="online weight quantization (e.g. fp8)"
    )
    p.add_argument(
        "--block-size",
        metavar="TOKENS",
        type=_block_size,
        help=f"tokens per block, one of {', '.join(map(str, BLOCK_SIZES))} "
        "(default: 16, or what the model's attention backend needs)",
    )
    p.add_argument(
        "--max-model-len", metavar="TOKENS", type=_tokens, help="default: the model's own"
    )
    p.add_argument(
        "--max-num-seqs", metavar="N", type=_positive, help="default: the release's for the GPU"
    )
    p.add_argument(
        "--max-num-batched-tokens",
        metavar="TOKENS",
        type=_tokens,
        help="default: the release's for the GPU",
    )
    p.add_argument(
        "--kv-cache-memory-bytes",
        metavar="BYTES",
        type=_size("--kv-cache-memory-bytes"),
        help="KV memory per GPU, given instead of a utilization",
    )
    p.add_argument(
        "--num-gpu-blocks-override", metavar="N", type=_positive, help="blocks, as given to vLLM"
    )
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    p.add_argument(
        "--flashinfer",
        choices=("installed", "absent"),
        help="vLLM before 0.11.1 samples without sorting only where FlashInfer is installed "
        "(the vllm/vllm-openai image has it; pip install vllm did not): default absent",
    )
    p.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="default: on, as in vLLM 0.28+ (always off with --gpu cpu, as vLLM forces it)",
    )
    p.add_argument(
        "--model-runner",
        choices=("v1", "v2"),
        help="VLLM_USE_V2_MODEL_RUNNER=0 (v1) or =1 (v2), vLLM 0.12+; default: the "
        "release's choice for the model (V2 for every model from 0.29)",
    )
    p.add_argument(
        "--enable-extensible-kv-cache",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="vLLM 0.34+ sizes the cache after warmup, at utilization 1.0 unless given; "
        "default: on with a GPU unless --kv-cache-memory-bytes or --num-gpu-blocks-override",
    )
    p.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="default: on, but off for hybrid Mamba models before vLLM 0.26; with it a "
        "hybrid model's request holds 2-3 state blocks ('align') or, for Mamba2 models "
        "in 0.26-0.27, one per block of tokens ('all')",
    )
    for flag in ("--mamba-cache-dtype", "--mamba-ssm-cache-dtype"):
        p.add_argument(
            flag,
            choices=("auto", *MAMBA_STATE_DTYPES),
            default="auto",
            help="a hybrid model's recurrent state; auto: the model dtype"
            + (", or the checkpoint's (Qwen3.5: float32, from 0.17)" if "ssm" in flag else ""),
        )
    p.add_argument(
        "--disable-hybrid-kv-cache-manager",
        action="store_true",
        help="one KV group for all layers, as vLLM's flag of that name",
    )
    _add_deploy_flags(p)
    p.add_argument(
        "--weights-bytes",
        metavar="BYTES",
        type=_size("--weights-bytes"),
        help="what vLLM printed as 'Model loading took X GiB': one GPU's weights, already "
        "split over TP, rotary table included (with PP: the first stage's)",
    )
    p.add_argument(
        "--available-kv-bytes",
        metavar="BYTES",
        type=_size("--available-kv-bytes"),
        help="vLLM's printed 'Available KV cache memory' (per GPU, first stage), e.g. 58.11GiB; "
        "with 0.34's extensible cache that is only the reservation: give the GiB of its "
        "'Memory after warmup: ... KV cache blocks (X GiB)' line",
    )
    p.add_argument(
        "--context",
        action="append",
        default=[],
        help="tokens per sequence: 2000, 2000,8000, or a distribution p50=1200,p95=4000 "
        "(default: max_model_len)",
    )
    p.add_argument(
        "--traffic",
        metavar="FILE",
        help="replay this traffic at the planned deployment: a request log (CSV or JSON "
        "Lines) or a scenario (YAML file or built-in name); finds the largest multiple held",
    )
    p.add_argument(
        "--max-queue-wait",
        type=_duration("--max-queue-wait"),
        default=DEFAULT_MAX_QUEUE_WAIT,
        help=f"with --traffic: the p{QUEUE_WAIT_QUANTILE * 100:.0f} queue wait a multiple may "
        f"reach and still hold (default {DEFAULT_MAX_QUEUE_WAIT:g}s)",
    )
    p.add_argument(
        "--traffic-precision",
        type=float,
        default=DEFAULT_PRECISION,
        help="with --traffic: stop the search when the multiple held and the one failed "
        f"are this close, relative (default {DEFAULT_PRECISION:g})",
    )
    p.add_argument(
        "--traffic-columns",
        default="",
        help="with a request log: role=column pairs, e.g. time=ts,prompt=in,output=out "
        f"(roles: {', '.join(ROLES)})",
    )
    p.add_argument("--traffic-time-unit", default="s", choices=("s", "ms", "us"))
    p.add_argument(
        "--recommend-replays",
        metavar="N",
        type=int,
        default=DEFAULT_MAX_REPLAYS,
        help="with --traffic: replay at most N candidate deployments looking for the fewest "
        f"GPUs that hold the traffic (default {DEFAULT_MAX_REPLAYS}; 0: recommend none)",
    )
    p.add_argument(
        "--recommend-gpus",
        metavar="NAMES",
        default="",
        help="with --traffic: the GPUs a recommendation may use, e.g. L4,H100 (default: "
        "the table's GPUs of the planned GPU's vendor)",
    )
    p.add_argument(
        "--traffic-jobs",
        type=int,
        default=1,
        help="with --traffic: replay this many multiples at once, in parallel processes",
    )
    p.add_argument("--output", choices=("table", "json"), default="table", help="table or json")
    p.add_argument(
        "--no-what-if",
        action="store_true",
        help="skip the alternatives (and, for a deployment that would not start, what would)",
    )
    p.add_argument(
        "--fit",
        metavar="N:TOKENS",
        help="instead of one plan: which deployments (GPU of the table × TP 1, 2, 4, 8 × KV "
        "dtype auto, fp8) hold N sequences of TOKENS tokens at once, fewest GPUs first; "
        "e.g. 64:8192 or 64:8k",
    )
    p.set_defaults(func=run)


def _add_deploy_flags(p: Any) -> None:
    """vLLM's flags that move the budget or the blocks without being KV flags (each as
    vLLM 0.32 and 0.33 apply it: exporter/capacity/deploy_flags.py)."""
    p.add_argument(
        "--speculative-config",
        metavar="JSON",
        help='as vLLM takes it, e.g. \'{"method": "eagle3", "model": "DIR or id", '
        '"num_speculative_tokens": 3}\' (ngram, suffix: no memory; eagle, eagle3, '
        "draft_model: the drafter's config from its model; mtp: the model's own modules)",
    )
    p.add_argument("--enable-lora", action="store_true", help="allocate LoRA buffers")
    p.add_argument("--max-loras", metavar="N", type=_positive, help="with --enable-lora (vLLM: 1)")
    p.add_argument(
        "--max-lora-rank", metavar="N", type=_positive, help="with --enable-lora (vLLM: 16)"
    )
    p.add_argument(
        "--fully-sharded-loras", action="store_true", help="shard the LoRA A/B buffers over TP"
    )
    p.add_argument(
        "--lora-dtype",
        default="auto",
        choices=("auto", "float16", "bfloat16", "float32"),
        help="LoRA buffers' dtype (default: the model's)",
    )
    p.add_argument(
        "--cpu-offload-gb",
        metavar="GIB",
        type=_gib_amount("--cpu-offload-gb"),
        default=0.0,
        help="GiB of weights per GPU kept in host memory (vLLM's UVA offload)",
    )
    p.add_argument(
        "--kv-offloading-size",
        metavar="GIB",
        type=_gib_amount("--kv-offloading-size"),
        help="a CPU KV tier of this many GiB (the GPU blocks do not change)",
    )
    p.add_argument(
        "--skip-mm-profiling",
        action="store_true",
        help="vLLM skips the multimodal encoder in its memory profile",
    )
    p.add_argument(
        "--limit-mm-per-prompt",
        metavar="JSON",
        help="items per prompt by modality, e.g. '{\"image\": 0}' (0 for all: text only)",
    )
    p.add_argument(
        "--mm-processor-kwargs",
        metavar="JSON",
        help="the image processor's options; a max_pixels (or size.longest_edge) limit, "
        "e.g. '{\"max_pixels\": 1003520}', sizes the encoder profile's largest image",
    )
    p.add_argument(
        "--language-model-only",
        action="store_true",
        help="serve a multimodal model as text only (no encoder profile)",
    )


def _gib_amount(flag: str) -> Any:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not value >= 0 or value == float("inf"):
            raise argparse.ArgumentTypeError(f"{text!r}: {flag} takes GiB, e.g. 4 or 0.5")
        return value

    return parse


def deploy_flags(args: argparse.Namespace, arch: ModelArch) -> dict[str, Any]:
    """The PlanRequest fields of ``_add_deploy_flags``'s flags; a draft model named in
    ``--speculative-config`` is read like ``--model`` (path, catalogue or Hub id)."""
    out: dict[str, Any] = {}
    if args.speculative_config:
        doc = parse_speculative_config(args.speculative_config, "--speculative-config")
        draft, weights, source, draft_vocab = None, None, "", None
        method = doc["method"]
        if doc.get("model") and method not in ("mtp", *NO_KV_METHODS):
            loaded = load_model(str(doc["model"]))
            draft = parse_config(loaded.config, loaded.config_path, name=loaded.name)
            weights, source = loaded.weights_bytes, loaded.weights_source
            vocab = loaded.config.get("draft_vocab_size")
            draft_vocab = vocab if isinstance(vocab, int) and vocab > 0 else None
        elif method in ("eagle", "eagle3", "draft_model", "dflash"):
            raise InputError(
                "--speculative-config", "model", None, f"is needed with method {method}"
            )
        out["speculative"] = speculative_from(
            doc,
            target=arch,
            draft=draft,
            draft_weights_bytes=weights,
            draft_weights_source=source,
            draft_vocab=draft_vocab,
        )
    lora_sizes = args.max_loras is not None or args.max_lora_rank is not None
    if lora_sizes and not args.enable_lora:
        raise InputError("--max-loras", "", None, "and --max-lora-rank need --enable-lora")
    if args.enable_lora:
        out["lora"] = Lora(
            max_loras=args.max_loras or 1,
            max_lora_rank=args.max_lora_rank or 16,
            fully_sharded=args.fully_sharded_loras,
            lora_dtype=args.lora_dtype,
        )
    out["cpu_offload_gb"] = args.cpu_offload_gb
    out["kv_offloading_size"] = args.kv_offloading_size
    out["mm_profile"] = MultimodalProfile(
        skip=args.skip_mm_profiling,
        limits=parse_mm_limits(args.limit_mm_per_prompt or "", "--limit-mm-per-prompt"),
        language_model_only=args.language_model_only,
        max_pixels=parse_mm_processor_kwargs(args.mm_processor_kwargs, "--mm-processor-kwargs")
        if args.mm_processor_kwargs
        else None,
    )
    return out


def _tokens(text: str) -> int:
    """``8192``, ``8k`` or ``128K`` (vLLM accepts the suffixes too)."""
    m = re.fullmatch(r"(\d+)([kK]?)", text.strip())
    if not m or int(m.group(1)) == 0:
        raise argparse.ArgumentTypeError(f"{text!r}: not a token count; write e.g. 8192 or 8k")
    return int(m.group(1)) * (1024 if m.group(2) else 1)


def _positive(text: str) -> int:
    if not text.strip().isdecimal() or int(text) == 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a whole number greater than 0")
    return int(text)


_fraction = bounded_float(1, "a fraction", "0.9")


def _block_size(text: str) -> int:
    if not text.strip().isdecimal() or int(text) not in BLOCK_SIZES:
        allowed = ", ".join(map(str, BLOCK_SIZES))
        raise argparse.ArgumentTypeError(f"{text!r}: vLLM accepts only {allowed}")
    return int(text)


def _gpu(text: str) -> str:
    if text.strip().startswith("-"):
        raise argparse.ArgumentTypeError(f"{text!r}: a GPU's memory must be greater than 0")
    try:
        resolve_gpu(text)
    except InputError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e.problem}") from None
    return text


def _version(text: str) -> str:
    """A release whose sizing rules this build has read; anything else is refused.

    Refused rather than flagged: a plan for an unknown release prints numbers that look as
    sure as any other, and a note under the table is easy to miss. Asking for the nearest
    known release by name is one flag away and says what was assumed.
    """
    try:
        version = parse_version(text)
    except InputError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e.problem}") from None
    if not OLDEST_KNOWN[:2] <= version[:2] <= NEWEST_KNOWN[:2]:
        oldest, newest = format_version(OLDEST_KNOWN), format_version(NEWEST_KNOWN)
        nearest = newest if version > NEWEST_KNOWN else oldest
        raise argparse.ArgumentTypeError(
            f"{text!r}: this build knows the sizing rules of vLLM {oldest} to {newest}; "
            f"to plan with the nearest, pass --vllm-version {nearest}"
        )
    return text


def _size(flag: str) -> Any:
    def parse(text: str) -> int:
        try:
            return parse_bytes(text, flag)
        except InputError as e:
            raise argparse.ArgumentTypeError(f"{text!r}: {e.problem}") from None

    return parse


def _duration(flag: str) -> Any:
    def parse(text: str) -> float:
        try:
            return parse_duration(text, flag, "")
        except InputError as e:
            raise argparse.ArgumentTypeError(e.problem) from None

    return parse


def parse_columns(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        role, sep, name = part.partition("=")
        role, name = role.strip(), name.strip()
        if not sep or role not in ROLES or not name:
            raise InputError(
                "--traffic-columns", "", part, f"write role=column; roles: {', '.join(ROLES)}"
            )
        out[role] = name
    return out


def parse_contexts(values: Sequence[str]) -> tuple[Context, ...]:
    out: list[Context] = []
    for value in values:
        for part in value.split(","):
            part = part.strip()
            if not part:
                continue
            m = _QUANTILE_RE.match(part)
            if m:
                out.append(Context(m.group(1), int(m.group(2))))
            elif part.isdigit() and int(part) > 0:
                out.append(Context(part, int(part)))
            else:
                raise InputError(
                    "--context", "", part, "write tokens (2000) or quantiles (p50=1200,p95=4000)"
                )
    return tuple(out)


def parallelism(args: argparse.Namespace, choice: GpuChoice) -> tuple[int, int]:
    """TP and PP: as given, or from ``--gpu 8xH200`` (all of them one TP group, as a
    single-node deployment of that many GPUs usually is). A count that disagrees with
    TP × PP given too is refused: which of them was meant cannot be guessed."""
    tp, pp = args.tensor_parallel_size, args.pipeline_parallel_size
    if choice.count is None:
        return tp or 1, pp or 1
    if tp is None:
        if choice.count % (pp or 1):
            raise InputError(
                "--gpu",
                "",
                args.gpu,
                f"{choice.count} GPUs do not split into --pipeline-parallel-size {pp} stages",
            )
        return choice.count // (pp or 1), pp or 1
    if tp * (pp or 1) != choice.count:
        raise InputError(
            "--gpu",
            "",
            args.gpu,
            f"{choice.count} GPUs, but --tensor-parallel-size {tp} × "
            f"--pipeline-parallel-size {pp or 1} = {tp * (pp or 1)}",
        )
    return tp, pp or 1


def build_request(args: argparse.Namespace) -> PlanRequest:
    if not args.model:
        raise InputError("--model", "", None, "is required (a config.json, model dir or name)")
    choice = resolve_gpu(args.gpu)
    if choice.note:
        # Said before any output, on stderr: the table's header names the GPU planned too.
        print(f"kv-headroom plan: {choice.note}", file=sys.stderr)
    tp, pp = parallelism(args, choice)
    source = load_model(args.model)
    if source.resolution:
        # Said before any output, as the GPU's note is: the header names the name asked for.
        print(f"kv-headroom plan: {source.resolution}", file=sys.stderr)
    arch = parse_config(source.config, source.config_path, dtype=args.dtype, name=source.name)
    weights, weights_source = args.weights_bytes, "flag (--weights-bytes)"
    if weights is None and source.weights_bytes is not None:
        weights, weights_source = source.weights_bytes, source.weights_source
    # The flags as the sidecar's Deployment spells them (argparse already refused what vLLM
    # would), so that plan and the sidecar's expected plan map them onto a request alike.
    deployment = Deployment(
        vllm_version=args.vllm_version,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        gpu_memory_utilization=args.gpu_memory_utilization,
        kv_cache_dtype=args.kv_cache_dtype,
        block_size=args.block_size,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        num_gpu_blocks_override=args.num_gpu_blocks_override,
        enforce_eager=args.enforce_eager,
        quantization=args.quantization,
        flashinfer=args.flashinfer,
        model_runner=args.model_runner,
        enable_extensible_kv_cache=args.enable_extensible_kv_cache,
        enable_prefix_caching=args.enable_prefix_caching,
        mamba_cache_dtype=args.mamba_cache_dtype,
        mamba_ssm_cache_dtype=args.mamba_ssm_cache_dtype,
    )
    request = plan_request(
        deployment,
        arch=arch,
        model_name=source.name,
        gpu=choice.gpu,
        weights_bytes=weights,
        weights_source=weights_source,
        flag_fields=deploy_flags(args, arch),
        available_kv_bytes=args.available_kv_bytes,
        contexts=parse_contexts(args.context),
        async_scheduling=args.async_scheduling,
        hybrid_kv_cache_manager=not args.disable_hybrid_kv_cache_manager,
    )
    if args.model_runner is not None and request.release.version < (0, 12, 0):
        raise InputError(
            "--model-runner",
            "",
            args.model_runner,
            f"vLLM {args.vllm_version} has one model runner (VLLM_USE_V2_MODEL_RUNNER "
            "arrived in 0.12)",
        )
    # --weights-bytes is the figure a user copies from vLLM's "Model loading took" line:
    # one GPU's loaded bytes (capacity.plan._stage_weights), not a checkpoint to split.
    return dataclasses.replace(request, weights_per_gpu=args.weights_bytes is not None)


def run(args: argparse.Namespace) -> int:
    if args.list_models:
        for model in load_catalogue():
            print(f"{model.name:<48} {describe(model)}")
        for model in load_restored():  # names an earlier catalogue listed
            also = f"= {model.resolves_to}" if model.resolves_to else describe(model)
            print(f"{model.name:<48} {also}")
        return EXIT_OK
    if args.list_gpus:
        for gpu in GPU_CATALOGUE:
            print(f"{gpu.name:<16} {gpu.total_bytes / 2**30:8.2f} GiB  {gpu.source}")
        return EXIT_OK
    result = plan(build_request(args))
    if args.fit is not None:
        return run_fit(args, result)
    alternatives = () if args.no_what_if else what_ifs(result)
    suggestions = () if args.no_what_if else what_would_work(result)
    traffic, recommended = run_traffic(args, result, alternatives) if args.traffic else (None, None)
    if args.output == "json":
        doc = plan_json(result, alternatives, traffic, suggestions)
        if recommended is not None:
            doc["recommendations"] = recommendations_json(recommended)
            doc["recommendation_search"] = recommendation_search_json(recommended)
        print(json.dumps(doc, indent=2))
    else:
        advice = recommendation_lines(recommended, args.max_queue_wait) if recommended else []
        print(render_table(result, alternatives, traffic, suggestions, advice))
    if result.startup_failure:
        return EXIT_WONT_START
    if traffic is not None and traffic.base.at_one is not None and not traffic.base.at_one.held:
        return EXIT_TRAFFIC_NOT_HELD
    return EXIT_OK


def run_fit(args: argparse.Namespace, base: Plan) -> int:
    """``--fit N:TOKENS``: the deployments that hold them; exit 1 when none does."""
    if args.traffic:
        raise InputError("--fit", "", args.fit, "is a question of its own; drop --traffic")
    sequences, tokens = parse_fit(args.fit)
    fits = fit(base, sequences, tokens)
    if args.output == "json":
        print(json.dumps(fit_json(base, sequences, tokens, fits), indent=2))
    else:
        print(render_fit(base, sequences, tokens, fits))
    return EXIT_OK if fits else EXIT_WONT_START


@dataclass(frozen=True)
class TrafficReport:
    source: str
    traffic: Traffic
    max_queue_wait: float
    base: Headroom
    alternatives: dict[str, Headroom]  # by what-if label
    wall_seconds: float


def run_traffic(
    args: argparse.Namespace, result: Plan, alternatives: Sequence[WhatIf]
) -> tuple[TrafficReport | None, Recommendations | None]:
    """The traffic through the planned deployment (where it starts), then through each
    what-if, then the search for the fewest GPUs that hold it (unless
    --recommend-replays 0)."""
    if not 0 < args.traffic_precision < 1:
        raise InputError("--traffic-precision", "", args.traffic_precision, "must be in (0, 1)")
    if args.traffic_jobs < 1:
        raise InputError("--traffic-jobs", "", args.traffic_jobs, "must be at least 1")
    if args.recommend_replays < 0:
        raise InputError("--recommend-replays", "", args.recommend_replays, "must be 0 or more")
    gpus = [
        resolve_gpu(name, "--recommend-gpus").gpu
        for name in args.recommend_gpus.split(",")
        if name.strip()
    ]
    started = time.perf_counter()
    traffic, scenario = load_traffic(
        args.traffic,
        columns=parse_columns(args.traffic_columns),
        time_unit=args.traffic_time_unit,
    )
    if not traffic.base:
        raise InputError(args.traffic, "", None, "holds no request to replay")
    # Progress only where someone watches it: one line redrawn on a terminal, nothing
    # in a pipe or a log (the answer is the table; a day's search once wrote 47 lines).
    say = StatusLine.for_stream(sys.stderr)
    try:
        if say is not None:
            say(
                f"replaying {len(traffic.base):,} requests over {traffic.span / 60:,.1f} min "
                f"from {args.traffic}"
            )
        common = {
            "max_queue_wait": args.max_queue_wait,
            "precision": args.traffic_precision,
            "jobs": args.traffic_jobs,
        }
        report = None
        if not result.startup_failure:
            base = assess_traffic(
                traffic, engine_at(result, scenario), label="as planned", say=say, **common
            )
            alts = _assess_alternatives(traffic, scenario, result, base, alternatives, say, common)
            report = TrafficReport(args.traffic, traffic, args.max_queue_wait, base, alts, 0.0)
        recommended = None
        if args.recommend_replays > 0:
            recommended = recommend(
                result,
                traffic,
                scenario,
                max_queue_wait=args.max_queue_wait,
                precision=args.traffic_precision,
                max_replays=args.recommend_replays,
                gpus=gpus or None,
                say=say,
                jobs=args.traffic_jobs,
            )
        wall = time.perf_counter() - started
        if say is not None:
            say(f"{len(traffic.base):,} requests from {args.traffic} replayed in {wall:.1f} s")
    finally:
        if say is not None:
            say.close()
    if report is not None:
        report = dataclasses.replace(report, wall_seconds=wall)
    return report, recommended


def _assess_alternatives(
    traffic: Traffic,
    scenario: Scenario,
    result: Plan,
    base: Headroom,
    alternatives: Sequence[WhatIf],
    say: StatusLine | None,
    common: dict[str, Any],
) -> dict[str, Headroom]:
    """Each what-if that starts, on the same traffic."""
    alts: dict[str, Headroom] = {}
    for w in alternatives:
        if w.plan is not None and not w.plan.startup_failure:
            alts[w.label] = assess_traffic(
                traffic,
                engine_at(w.plan, scenario),
                label=w.label,
                guess=what_if_guess(base, result, w.plan),
                say=say,
                report_at_one=False,
                **common,
            )
    return alts


def what_if_guess(base: Headroom, planned: Plan, alternative: Plan) -> float | None:
    """Where a what-if's search starts: the planned deployment's answer, scaled by the
    cache's size when the cache is what gave out. A probe that fails stops at its first
    preemption and costs little; one that holds replays all the traffic. So a start at or
    a little above the answer (more blocks hold somewhat less than proportionally more,
    as a fuller batch steps slower) saves the holding probes of a climb from below."""
    held = base.limit.held
    if held is None or base.limit.binding != "kv_cache" or not planned.cap.num_blocks:
        return held
    scaled = held * alternative.cap.num_blocks / planned.cap.num_blocks
    return min(MAX_MULTIPLIER, max(MIN_MULTIPLIER, scaled))


def _outcome_json(o: Outcome) -> dict[str, Any]:
    return {
        "multiplier": round(o.multiplier, 4),
        "held": o.held,
        "complete": o.complete,
        "preemptions": o.preemptions,
        "first_preemption_seconds": o.first_preemption_seconds,
        "peak_kv_usage": round(o.peak_kv_usage, 4),
        "p95_kv_usage": round(o.p95_kv_usage, 4),
        "queue_wait_seconds": {k: round(v, 3) for k, v in o.queue_wait_seconds.items()},
        "binding_resource": o.binding,
        "waiting_seconds": {k: round(v, 1) for k, v in o.waiting_seconds.items() if k != "none"},
        "wall_seconds": round(o.wall_seconds, 3),
    }


def _limit_json(h: Headroom) -> dict[str, Any]:
    lim = h.limit
    return {
        "max_multiplier": None if lim.held is None else round(lim.held, 4),
        "failed_multiplier": None if lim.failed is None else round(lim.failed, 4),
        "precision": None if lim.precision is None else round(lim.precision, 4),
        "binding_resource": lim.binding,
    }


def traffic_json(t: TrafficReport) -> dict[str, Any]:
    assert t.base.at_one is not None  # the planned deployment's replay is always reported
    return {
        "source": t.source,
        "requests": len(t.traffic.base),
        "sequences": t.traffic.sequences,
        "duration_seconds": round(t.traffic.span, 3),
        "max_queue_wait_seconds": t.max_queue_wait,
        "queue_wait_quantile": QUEUE_WAIT_QUANTILE,
        "replay": _outcome_json(t.base.at_one),
        **_limit_json(t.base),
        "probes": [_outcome_json(p) for p in t.base.limit.probes],
        "wall_seconds": round(t.wall_seconds, 3),
    }


def _summary(p: Plan) -> dict[str, Any]:
    return {
        "kv_budget_bytes": p.kv_budget_bytes,
        "num_blocks": p.cap.num_blocks,
        "kv_capacity_tokens": p.cap.capacity_tokens,
        "max_concurrency": round(p.cap.max_concurrency, 4),
        "max_sequences": {c.label: n for c, n in p.sequences},
    }


def plan_json(
    p: Plan,
    alternatives: Sequence[WhatIf] = (),
    traffic: TrafficReport | None = None,
    suggestions: Sequence[Suggestion] = (),
) -> dict[str, Any]:
    req, t = p.request, p.tightest
    failure = p.startup_failure
    return {
        "model": req.model_name,
        "gpu": req.gpu.name,
        "vllm_version": req.release.label,
        "attention_kind": req.arch.attention_kind.value,
        "dtype": req.arch.dtype,
        "kv_cache_dtype": req.kv_cache_dtype,
        "tensor_parallel_size": req.tensor_parallel_size,
        "pipeline_parallel_size": req.pipeline_parallel_size,
        "gpu_memory_utilization": p.utilization,
        "max_model_len": p.max_model_len,
        "max_num_seqs": p.max_num_seqs,
        "max_num_batched_tokens": p.max_num_batched_tokens,
        "kv_bytes_per_token": p.kv_bytes_per_token,
        "block_size": p.block_size,
        "bytes_per_block": p.layout.stage_bytes_per_block(p.cap.tightest_stage),
        "kv_cache_groups": p.layout.num_groups,
        "padding_layers": p.layout.padding_layers,
        "computed_num_blocks": p.cap.computed_blocks,
        "blocks_per_request": p.cap.blocks_per_request,
        "pool_tokens": p.cap.pool_tokens,
        **_summary(p),
        "contexts": {c.label: c.tokens for c, _ in p.sequences},
        "tightest_stage": p.cap.tightest_stage,
        "stage_kv_budget_bytes": list(p.stage_available),
        "memory": {
            "gpu_total_bytes": req.gpu.total_bytes,
            "ceiling_bytes": t.requested,
            "device_cap_bytes": t.device_cap,
            "weights_bytes": t.weights,
            "activation_bytes": t.activation,
            "non_torch_bytes": t.non_torch,
            "cuda_graph_bytes": t.cuda_graph,
        },
        "deploy_flags": _deploy_flags_json(p),
        "sources": p.sources,
        "approximate": list(req.arch.approximate),
        "notes": list(p.notes),
        "startup_error": None
        if failure is None
        else {
            "message": failure.message,
            "needed_bytes": failure.needed_bytes,
            "available_bytes": failure.available_bytes,
            "estimated_max_model_len": failure.estimated_max_model_len,
            "cause": failure.cause,
            "why": why_not(p),
        },
        "what_would_work": suggestions_json(suggestions),
        "what_if": [
            {
                "change": w.label,
                **(
                    {
                        **_summary(w.plan),
                        "starts": w.plan.startup_failure is None,
                        **({"why_not": why_not(w.plan)} if w.plan.startup_failure else {}),
                    }
                    if w.plan
                    else {"not_possible": w.reason}
                ),
                **(
                    {"traffic": _limit_json(traffic.alternatives[w.label])}
                    if traffic is not None and w.label in traffic.alternatives
                    else {}
                ),
            }
            for w in alternatives
        ],
        **({"traffic": traffic_json(traffic)} if traffic is not None else {}),
    }


def _gib(n: float) -> str:
    return f"{n / 2**30:,.2f} GiB"


def _multiple(h: Headroom | None) -> str:
    if h is None:
        return ""
    lim = h.limit
    if lim.held is None:
        return f"  < ×{lim.failed:.3g} traffic"
    if lim.failed is None:
        return f"  ≥ ×{lim.held:.3g} traffic"
    return f"  ×{lim.held:.3g} traffic ({lim.binding})"


def traffic_lines(t: TrafficReport) -> list[str]:
    o, lim = t.base.at_one, t.base.limit
    assert o is not None  # the planned deployment's replay is always reported
    waits = o.queue_wait_seconds
    lines = [
        "",
        f"Traffic: {t.source} · {len(t.traffic.base):,} requests over "
        f"{t.traffic.span / 60:,.1f} min, replayed at this deployment",
        f"  KV usage                peak {o.peak_kv_usage:.0%}, p95 {o.p95_kv_usage:.0%}",
        f"  preemptions             {o.preemptions:,}"
        + (
            f" (first at {o.first_preemption_seconds / 60:.1f} min)"
            if o.first_preemption_seconds is not None
            else ""
        ),
        f"  queue wait              p50 {waits['p50']:.2f} s, p95 {waits['p95']:.2f} s, "
        f"p99 {waits['p99']:.2f} s",
        f"  requests wait on        {o.binding}",
    ]
    rule = f"no preemption, p{QUEUE_WAIT_QUANTILE * 100:.0f} queue wait ≤ {t.max_queue_wait:g} s"
    if lim.held is None:
        lines.append(f"  holds                   less than ×{lim.failed:.3g} ({rule})")
    elif lim.failed is None:
        lines.append(f"  holds                   at least ×{lim.held:.3g} ({rule})")
    else:
        lines.append(
            f"  holds                   ×{lim.held:.3g} this traffic ({rule}); "
            f"×{lim.failed:.3g} fails on {lim.binding} (±{(lim.precision or 0) * 100:.1f} %)"
        )
    return lines


def _flag_rows(p: Plan) -> list[tuple[str, str, str]]:
    """What the deployment flags put into (or take out of) the weights row."""
    src, mem = p.sources, p.flag_memory
    rows = []
    if "draft_weights" in mem:
        rows.append(("  of which the drafter", _gib(mem["draft_weights"]), src["draft_weights"]))
    if "lora_buffers" in mem:
        rows.append(("  of which LoRA buffers", _gib(mem["lora_buffers"]), src["lora_buffers"]))
    if "cpu_offloaded" in mem:
        rows.append(("  kept on the host", "−" + _gib(mem["cpu_offloaded"]), src["cpu_offload"]))
    return rows


def _deploy_flags_json(p: Plan) -> dict[str, Any]:
    req = p.request
    spec = req.speculative
    return {
        "speculative": None
        if spec is None
        else {
            "method": spec.method,
            "num_speculative_tokens": spec.num_speculative_tokens,
            "draft_kv_layers": len(spec.kv_layers),
            "lookahead_tokens": spec.lookahead_tokens,
            "draft_weights_bytes": p.flag_memory.get("draft_weights", 0),
        },
        "lora_buffer_bytes": p.flag_memory.get("lora_buffers"),
        "cpu_offloaded_bytes": p.flag_memory.get("cpu_offloaded"),
        "kv_offloading_size_gib": req.kv_offloading_size,
        "encoder_profile": p.sources.get("encoder_profile"),
    }


def render_table(
    p: Plan,
    alternatives: Sequence[WhatIf] = (),
    traffic: TrafficReport | None = None,
    suggestions: Sequence[Suggestion] = (),
    recommended: Sequence[str] = (),
) -> str:
    req, t, arch, src = p.request, p.tightest, p.request.arch, p.sources
    tp, pp = req.tensor_parallel_size, req.pipeline_parallel_size
    kv_names: dict[float, str] = {1: "fp8", 2: "16-bit", 4: "fp32"}
    kv_name = kv_names.get(p.kv_dtype_bytes, req.kv_cache_dtype)
    lines = [
        f"{req.model_name} on {req.gpu.name} · vLLM {req.release.label} · "
        f"{arch.attention_kind.value}, {arch.num_layers} layers, TP{tp} PP{pp}, "
        f"{arch.dtype} weights, {kv_name} KV",
        "",
    ]
    rows: list[tuple[str, str, str]] = []
    given_budget = src["kv_budget"].startswith(("flag", "given"))
    if req.gpu.platform != "cpu":
        rows += [
            ("GPU memory (CUDA total)", _gib(req.gpu.total_bytes), req.gpu.source),
            (f"× gpu-memory-utilization {p.utilization:g}", _gib(t.requested), src["utilization"]),
            *(
                [(DEVICE_CAP_ROW[0], _gib(cap), DEVICE_CAP_ROW[1])]
                if (cap := t.binding_cap) is not None
                else []
            ),
            ("− weights (this GPU)", _gib(t.weights), src.get("weights", "unknown")),
            *_flag_rows(p),
            ("− activation peak", _gib(t.activation), src["activation"]),
            ("− non-torch", _gib(t.non_torch), src["non_torch"]),
            ("− CUDA graphs", _gib(t.cuda_graph), src["cuda_graph"]),
        ]
        if given_budget:
            rows.append(("  (modelled KV budget)", _gib(t.available), "for comparison"))
    stage = f" (stage {p.cap.tightest_stage}, tightest)" if pp > 1 else ""
    rows.append((f"= KV budget per GPU{stage}", _gib(p.kv_budget_bytes), src["kv_budget"]))
    heads = {layer.num_kv_heads for layer in arch.attention_layers}
    rows.append(
        (
            "÷ KV bytes per token",
            f"{p.kv_bytes_per_token:,} B",
            f"config: {arch.num_layers} layers, {'/'.join(map(str, sorted(heads)))} KV heads "
            f"÷ TP{tp}, {p.kv_dtype_bytes:g} B each",
        )
    )
    per_block = p.layout.stage_bytes_per_block(p.cap.tightest_stage)
    rows.append(
        (
            "÷ bytes per block",
            f"{per_block:,} B",
            f"{p.block_size} tokens ({src['block_size']}), {p.layout.num_groups} group(s)",
        )
    )
    rows.append(("= blocks", f"{p.cap.num_blocks:,}", src["num_blocks"]))
    rows.append(
        (
            "= KV cache size",
            f"{p.cap.capacity_tokens:,} tokens",
            f"as vLLM {req.release.label} prints it ({p.cap.token_line.value})",
        )
    )
    rows.append(
        (
            f"max concurrency @ {p.max_model_len:,}",
            f"{p.cap.max_concurrency:.2f}x",
            f"{p.cap.blocks_per_request} blocks per request",
        )
    )
    for c, n in p.sequences:
        label = c.label if not c.label.isdigit() else f"{c.tokens:,} tokens"
        rows.append((f"sequences that fit @ {label}", f"{n:,}", f"{c.tokens:,} tokens each"))
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    lines += [f"  {a:<{w0}}  {b:>{w1}}  {c}" for a, b, c in rows]
    lines += failure_lines(p)
    for reason in arch.approximate:
        lines.append(f"approximate: {reason}")
    for note in p.notes:
        lines.append(f"note: {note}")
    if traffic is not None:
        lines += traffic_lines(traffic)
    lines += recommended
    lines += suggestion_lines(p, suggestions)
    if alternatives:
        lines += ["", "What if"]
        first = p.sequences[0][0]
        for w in alternatives:
            if w.plan is None:
                lines.append(f"  {w.label:<38} not possible: {w.reason}")
                continue
            q = w.plan
            if q.startup_failure:
                # Its blocks say nothing once vLLM refuses it; why it refuses does.
                lines.append(f"  {w.label:<38} would not start: {why_not(q)}")
                continue
            seqs = {c.label: n for c, n in q.sequences}[first.label]
            base = p.cap.num_blocks or 1
            change = (q.cap.num_blocks - p.cap.num_blocks) / base * 100
            # Against a deployment with no blocks, a percentage says nothing.
            pct = f"({change:+.0f}%)" if p.cap.num_blocks else ""
            lines.append(
                f"  {w.label:<38} {q.cap.num_blocks:>10,} blocks {pct:>7}  "
                f"{q.cap.capacity_tokens:>12,} tokens  {seqs:>7,} seqs @ {first.label}"
                + _multiple(traffic.alternatives.get(w.label) if traffic else None)
            )
    return "\n".join(lines)
