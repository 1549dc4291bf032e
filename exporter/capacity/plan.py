"""The whole sizing chain of one deployment: GPU memory → budget → blocks → sequences.

``plan(request)`` is what ``kv-headroom plan`` prints and what the sidecar's expected
capacity is computed with. Every figure carries where it came from (config, flag,
default, estimate, given), so a reader can tell arithmetic from assumption.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from exporter.capacity.arch import DTYPE_BYTES, AttentionKind, LayerKind, ModelArch
from exporter.capacity.deploy_flags import (
    DEFAULT_MM_PROFILE,
    MEDUSA_METHODS,
    Lora,
    MultimodalProfile,
    Speculative,
    encoder_profile_items,
    lm_head_copy_bytes,
    lora_buffer_bytes,
    offloaded_bytes,
    profiled_arch,
    profiled_modality,
)
from exporter.capacity.gpus import CATALOGUE as GPU_CATALOGUE
from exporter.capacity.gpus import GIB, Gpu, neighbours
from exporter.capacity.kvcache import (
    MAMBA_STATE_DTYPES,
    OCTAVE_HEAD_SIZE,
    OCTAVE_KV_DTYPES,
    OCTAVE_ROPE_DIM,
    Capacity,
    Layout,
    StartupFailure,
    build_layout,
    capacity,
    kv_dtype_bytes,
    layer_page_bytes,
    pp_partition,
    sequences_that_fit,
    startup_check,
)
from exporter.capacity.memory import (
    DEFAULT_OVERHEAD,
    ActivationInputs,
    OverheadModel,
    StageMemory,
    activation_peaks,
    cuda_graph_bytes,
    non_torch_bytes,
    requested_memory,
    sampler_path,
    sampler_state_bytes,
)
from exporter.capacity.releases import NEWEST_KNOWN, OLDEST_KNOWN, Release, format_version
from exporter.capacity.weights import (
    estimate_weights_bytes,
    rotary_cache_bytes,
    stage_weight_bytes,
)
from exporter.errors import InputError


@dataclass(frozen=True)
class Context:
    """A context length to size for: a label (``"2000"``, ``"p95"``) and its tokens."""

    label: str
    tokens: int


@dataclass(frozen=True)
class PlanRequest:
    """A deployment as vLLM flags spell it; ``None`` means vLLM's default for the release."""

    arch: ModelArch
    model_name: str
    gpu: Gpu
    release: Release
    gpu_memory_utilization: float | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    kv_cache_dtype: str = "auto"
    block_size: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    kv_cache_memory_bytes: int | None = None
    num_gpu_blocks_override: int | None = None
    enforce_eager: bool = False
    quantization: str | None = None
    weights_bytes: int | None = None
    weights_source: str = "flag"
    # ``weights_bytes`` is what vLLM printed as "Model loading took X GiB" (plan's
    # --weights-bytes): one worker's loaded bytes, already split over TP and with the
    # rotary table in it, not the checkpoint to split (see ``_stage_weights``).
    weights_per_gpu: bool = False
    available_kv_bytes: int | None = None
    contexts: tuple[Context, ...] = ()
    async_scheduling: bool = True
    # VLLM_USE_V2_MODEL_RUNNER=1 / =0 ("v2" / "v1"); None takes the release's choice for
    # the model (Release.v2_model_runner).
    model_runner: Literal["v1", "v2"] | None = None
    hybrid_kv_cache_manager: bool = True
    # --[no-]enable-prefix-caching; None takes vLLM's default, which for a hybrid Mamba
    # model is the release's (Release.hybrid_prefix_caching_default) and on otherwise.
    enable_prefix_caching: bool | None = None
    # --mamba-cache-dtype / --mamba-ssm-cache-dtype: a hybrid model's recurrent state,
    # "auto" as vLLM resolves it (_state_dtypes).
    mamba_cache_dtype: str = "auto"
    mamba_ssm_cache_dtype: str = "auto"
    # 0.34's extensible KV cache (--[no-]enable-extensible-kv-cache): the cache sized after
    # warmup, the utilization 1.0 unless given; None takes the release's default
    # (``extensible_kv_cache``).
    extensible_kv_cache: bool | None = None
    # FlashInfer installed beside vLLM: before 0.11.1 it decides whether V1 samples
    # sort-free; None is ``pip install vllm``'s default (memory.sampler_path).
    flashinfer_installed: bool | None = None
    # Flags that move the budget or the blocks without being KV flags (deploy_flags.py).
    speculative: Speculative | None = None  # --speculative-config
    lora: Lora | None = None  # --enable-lora (--max-loras, --max-lora-rank)
    cpu_offload_gb: float = 0.0  # --cpu-offload-gb, per GPU
    kv_offloading_size: float | None = None  # --kv-offloading-size GiB (a CPU tier)
    mm_profile: MultimodalProfile = DEFAULT_MM_PROFILE  # --skip-mm-profiling, limits
    overhead: OverheadModel = DEFAULT_OVERHEAD


@dataclass(frozen=True)
class Plan:
    request: PlanRequest
    utilization: float
    block_size: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    in_flight_tokens: int
    kv_dtype_bytes: float  # 1, 2 or 4; a fraction for packed formats (Octave)
    kv_bytes_per_token: int  # per GPU on the tightest stage, summed over its layers
    layout: Layout
    stages: tuple[StageMemory, ...]  # modelled budget per PP stage
    stage_available: tuple[int, ...]  # what each stage has for KV (modelled or given)
    cap: Capacity
    sequences: tuple[tuple[Context, int], ...]
    startup_failure: StartupFailure | None
    sources: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    # Bytes per GPU (the stage that holds most) the deployment flags move inside the
    # weights term: draft_weights, lora_buffers, cpu_offloaded (deploy_flags.py).
    flag_memory: dict[str, int] = field(default_factory=dict)

    @property
    def tightest(self) -> StageMemory:
        return self.stages[self.cap.tightest_stage]

    @property
    def kv_budget_bytes(self) -> int:
        return self.stage_available[self.cap.tightest_stage]


def default_batched_tokens(gpu: Gpu, release: Release, max_model_len: int) -> tuple[int, int]:
    """vLLM's ``max_num_batched_tokens`` and ``max_num_seqs`` defaults for ``vllm serve``.

    V1 (vllm/engine/arg_utils.py::get_batch_defaults): 8192 / 1024 on GPUs with ≥ 70 GiB
    that are not A100s, 2048 / 256 otherwise; 0.32 adds 16384 / 1024 from 160 GiB (B200)
    and 2048 / 128 on the CPU backend; 0.33 gives GB10 (DGX Spark, compute capability 12.1)
    2048 / 256 although its unified memory is larger than 70 GiB. V0 without chunked
    prefill (every release before 0.8, and 0.8-0.10 on Volta/Turing, which fall back to V0):
    the larger of max_model_len and 2048, with 256 sequences.
    """
    if release.v0_engine_on(gpu.family):
        return max(max_model_len, 2048), 256
    if gpu.platform == "cpu":
        return 2048, 128 if release.version >= (0, 32, 0) else 256
    if gpu.name == "GB10" and release.version >= (0, 33, 0):
        return 2048, 256
    if gpu.total_bytes >= 160 * GIB and release.version >= (0, 32, 0):
        return 16384, 1024
    big = gpu.total_bytes >= 70 * GIB and "a100" not in gpu.name.lower()
    return (8192, 1024) if big else (2048, 256)


def default_block_size(arch: ModelArch, gpu: Gpu, release: Release) -> tuple[int, str]:
    """The block size vLLM picks when ``--block-size`` is not given, and why.

    0.34 raised ``CacheConfig.DEFAULT_BLOCK_SIZE`` from 16 to 64 (vllm/config/cache.py),
    which ``platforms/interface.py::update_block_size_for_backend`` keeps wherever the
    backend takes it: FlashAttention, FlashInfer, Triton and their MLA backends, FlashMLA;
    CUTLASS MLA stays at 128 and ROCm's dense ROCM_ATTN prefers 16.
    """
    mla = any(layer.kind is LayerKind.MLA for layer in arch.layers)
    if gpu.platform == "cpu":
        if mla:
            return 16, "default (CPU MLA backend requires 16)"
        return 128, "default (CPU backend: 128)"
    if mla and gpu.family == "blackwell" and release.version >= (0, 10, 0):
        return 128, "default (CUTLASS MLA backend on Blackwell)"
    if release.version >= (0, 34, 0):
        if gpu.family == "cdna3" and not mla:
            return 16, "default (ROCm attention prefers 16)"
        return 64, "default (64 from 0.34)"
    if mla:
        if gpu.family == "hopper" and (0, 7, 0) <= release.version < (0, 18, 0):
            return 64, "default (FlashMLA backend on Hopper)"
        return 16, "default (MLA backend; 16 from 0.18 on Hopper, backend-dependent)"
    return 16, "default"


def _validate(req: PlanRequest) -> None:
    arch = req.arch
    for state_flag, dtype in (
        ("--mamba-cache-dtype", req.mamba_cache_dtype),
        ("--mamba-ssm-cache-dtype", req.mamba_ssm_cache_dtype),
    ):
        if dtype != "auto" and dtype not in MAMBA_STATE_DTYPES:
            raise InputError(
                state_flag, "", dtype, f"must be auto or one of {', '.join(MAMBA_STATE_DTYPES)}"
            )
    tp, pp = req.tensor_parallel_size, req.pipeline_parallel_size
    if tp < 1:
        raise InputError("--tensor-parallel-size", "", tp, "must be at least 1")
    if pp < 1:
        raise InputError("--pipeline-parallel-size", "", pp, "must be at least 1")
    heads = arch.num_attention_heads
    if heads is not None and heads % tp:
        raise InputError(
            "--tensor-parallel-size",
            "",
            tp,
            f"must divide the model's {heads} attention heads ({arch.origin}: "
            "num_attention_heads); vLLM refuses to start otherwise",
        )
    u = req.gpu_memory_utilization
    if u is not None and not 0 < u <= 1:
        raise InputError("--gpu-memory-utilization", "", u, "must be in (0, 1]")
    for flag, value in (
        ("--block-size", req.block_size),
        ("--max-model-len", req.max_model_len),
        ("--max-num-seqs", req.max_num_seqs),
        ("--max-num-batched-tokens", req.max_num_batched_tokens),
        ("--num-gpu-blocks-override", req.num_gpu_blocks_override),
        ("--kv-cache-memory-bytes", req.kv_cache_memory_bytes),
    ):
        if value is not None and value <= 0:
            raise InputError(flag, "", value, "must be greater than 0")
    if req.cpu_offload_gb < 0:
        raise InputError("--cpu-offload-gb", "", req.cpu_offload_gb, "must be 0 or more")
    if req.kv_offloading_size is not None and req.kv_offloading_size <= 0:
        raise InputError(
            "--kv-offloading-size", "", req.kv_offloading_size, "must be greater than 0"
        )
    lora = req.lora
    if lora is not None and (lora.max_loras < 1 or lora.max_lora_rank < 1):
        raise InputError("--max-loras", "", lora.max_loras, "and --max-lora-rank must be >= 1")
    spec = req.speculative
    draft_tp = spec.draft_tensor_parallel_size if spec is not None else None
    if draft_tp is not None and draft_tp not in (1, tp):
        raise InputError(
            "--speculative-config",
            "draft_tensor_parallel_size",
            draft_tp,
            "cannot be other value than 1 or target model tensor_parallel_size (vLLM)",
        )
    rel = req.release
    if spec is not None and spec.method in MEDUSA_METHODS and not rel.medusa_speculators:
        raise InputError(
            "--speculative-config",
            "method",
            spec.method,
            f"was removed in vLLM 0.33 ({rel.label}): use eagle, eagle3, mtp or draft_model",
        )
    if spec is not None and spec.lm_head_quantization and not rel.draft_lm_head_quantization:
        raise InputError(
            "--speculative-config",
            "draft_lm_head_quantization",
            spec.lm_head_quantization,
            f"is new in vLLM 0.33 ({rel.label})",
        )
    if spec is not None and spec.kv_layers and pp > 1:
        raise InputError(
            "--speculative-config",
            "",
            spec.method,
            "with --pipeline-parallel-size > 1: the drafter's KV layers sit on the last "
            "stage, which this planner does not model",
        )


def plan(req: PlanRequest) -> Plan:
    """Size a deployment as vLLM would at start-up."""
    _validate(req)
    arch, rel, gpu = req.arch, req.release, req.gpu
    tp, pp = req.tensor_parallel_size, req.pipeline_parallel_size
    sources: dict[str, str] = {}
    notes: list[str] = list(arch.notes)
    if not rel.known:
        read = f"{format_version(OLDEST_KNOWN)}-{format_version(NEWEST_KNOWN)}"
        notes.append(f"vLLM {rel.label} is outside the releases read ({read}): nearest rules")
    extensible = extensible_kv_cache(req)
    if gpu.name == "GB10" and not extensible:
        notes.append(
            "GB10 shares its memory with the CPU: vLLM compares the budget with the system's "
            "free memory at start-up, so the default utilization often fails there "
            "(DGX Spark recipes run 0.80-0.85)"
        )

    default = 1.0 if extensible else rel.default_gpu_memory_utilization
    utilization = req.gpu_memory_utilization or default
    sources["utilization"] = (
        "flag"
        if req.gpu_memory_utilization
        else "default (1.0 with the extensible KV cache)"
        if extensible
        else f"default ({rel.label})"
    )
    if extensible:
        notes.append(
            "vLLM sizes this cache after warmup (the extensible KV cache), modelled from "
            "0.34's code with this model's activation and CUDA-graph estimates; no 0.34 GPU "
            "start-up has checked it yet"
        )

    max_len = req.max_model_len or arch.max_model_len
    if max_len is None:
        raise InputError(
            arch.origin, "max_position_embeddings", None, "is not set; pass --max-model-len"
        )
    sources["max_model_len"] = "flag" if req.max_model_len else "config"
    if arch.max_model_len and max_len > arch.max_model_len:
        notes.append(
            f"--max-model-len {max_len} exceeds the config's {arch.max_model_len}: vLLM refuses "
            "unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"
        )

    mnbt_default, seqs_default = default_batched_tokens(gpu, rel, max_len)
    mnbt = req.max_num_batched_tokens or mnbt_default
    max_seqs = req.max_num_seqs or seqs_default
    sources["max_num_batched_tokens"] = "flag" if req.max_num_batched_tokens else "default"
    sources["max_num_seqs"] = "flag" if req.max_num_seqs else "default"
    # vLLM's CPU platform turns async scheduling off whatever the flag says
    # (vllm/platforms/cpu.py::check_and_update_config, 0.32), so one batch is in flight.
    async_scheduling = req.async_scheduling and gpu.platform != "cpu"
    in_flight = mnbt * rel.in_flight_batches(pp, async_scheduling, _v2_runner(req))

    if req.block_size is not None:
        block_size, sources["block_size"] = req.block_size, "flag"
    else:
        block_size, sources["block_size"] = default_block_size(arch, gpu, rel)
    configured_block = block_size

    _check_kv_dtype(req)
    kv_bytes = kv_dtype_bytes(req.kv_cache_dtype, arch.dtype, arch)
    # A hybrid Mamba model's state: how much of it a request holds and in what dtypes.
    mamba_mode = rel.mamba_cache_mode(prefix_caching(req), arch.architectures)
    state_bytes = _state_dtypes(req, sources)
    # 0.33 read: the FlashInfer GDN prefill, used on Hopper and Blackwell, exports checkpoints.
    gdn_alignment = rel.gdn_checkpoint_alignment if gpu.family in ("hopper", "blackwell") else None
    # A drafter's attention layers (EAGLE, MTP, draft model) join the KV groups: every
    # block holds their pages too (deploy_flags.py; vllm/v1/worker/gpu_model_runner.py::
    # get_kv_cache_spec lists them beside the target's, 0.32 and 0.33).
    spec = req.speculative
    kv_arch = arch
    draft_layers = spec.kv_layers_at(tp) if spec is not None else ()
    if spec is not None and draft_layers:
        kv_arch = replace(arch, layers=arch.layers + draft_layers)
        sources["speculative"] = (
            f"{spec.label}: {len(spec.kv_layers)} drafter KV layer(s), "
            f"{spec.lookahead_tokens} lookahead slot(s) per request"
        )
    elif spec is not None and spec.lookahead_tokens:
        sources["speculative"] = (
            f"{spec.label}: the drafter's config is unknown, so its KV layers and weights "
            f"are not counted; {spec.lookahead_tokens} lookahead slot(s) per request"
        )
        notes.append(
            f"--speculative-config {spec.method}: the drafter's config could not be read "
            "(pass its directory as the model), so its KV layers and weights are left out"
        )
    elif spec is not None:
        sources["speculative"] = f"{spec.label}: no drafter KV, no lookahead slots"

    def grouped(model: ModelArch) -> tuple[Layout, int]:
        return build_layout(
            model,
            release=rel,
            block_size=block_size,
            tp=tp,
            pp=pp,
            dtype_bytes=kv_bytes,
            hybrid_manager=req.hybrid_kv_cache_manager,
            mamba_cache_mode=mamba_mode,
            state_bytes=state_bytes,
            gdn_checkpoint_alignment=gdn_alignment if mamba_mode == "align" else None,
        )

    if draft_layers and _uniform_type_draft(arch, kv_arch, block_size, tp, kv_bytes):
        # A drafter whose pages differ from the target's, all layers full attention:
        # one uniform-type group whose block costs every layer's page.
        layout, block_size = grouped(arch)
        extra = sum(layer_page_bytes(x, block_size, tp, kv_bytes) for x in draft_layers)
        layout = replace(layout, extra_block_bytes=extra)
    else:
        layout, block_size = grouped(kv_arch)
    if block_size != configured_block:
        sources["block_size"] = "raised to cover the Mamba state page"
    if arch.attention_kind is AttentionKind.HYBRID_MAMBA:
        caching = "on" if prefix_caching(req) else "off"
        sources["mamba_cache_mode"] = f'"{mamba_mode}" (prefix caching {caching}, {rel.label})'

    flag_memory: dict[str, int] = {}
    stages = _stage_memory(req, utilization, mnbt, max_seqs, sources, flag_memory)
    available = _stage_available(req, stages, sources)

    check_avail = list(available)
    if req.num_gpu_blocks_override is not None and rel.version >= (0, 32, 0):
        # 0.32 checks the overridden pool, not the profiled memory.
        check_avail = [
            req.num_gpu_blocks_override * layout.stage_bytes_per_block(s) for s in range(pp)
        ]
    failure = None
    for s in range(pp):
        failure = startup_check(
            layout,
            s,
            check_avail[s],
            release=rel,
            max_model_len=max_len,
            in_flight_tokens=in_flight,
        )
        if failure is not None:
            break

    cap = capacity(
        layout,
        available,
        release=rel,
        max_model_len=max_len,
        in_flight_tokens=in_flight,
        num_gpu_blocks_override=req.num_gpu_blocks_override,
    )
    sources["num_blocks"] = (
        "flag (--num-gpu-blocks-override)" if req.num_gpu_blocks_override else "computed"
    )
    oom = _load_oom(req, stages)
    if oom is not None:
        failure = oom
    refusal = _float_kv_dtype_refusal(req)
    if refusal is not None:
        failure = StartupFailure(0, 0, 0, refusal, "config")
    if arch.gated_delta and rel.gdn_warmup_in_profile and gpu.family not in ("hopper", "cpu"):
        # Not subtracted: what the warm-up leaves is no count a config gives, and the starts
        # that show it disagree (Qwen3.5-0.8B on an A100 under 0.28 left 2.46 GiB beyond the
        # weights; 27B starts of the same architecture 0.51 on the same A100 and 0.56 on an
        # 80 GB ROCm card).
        notes.append(
            "Gated DeltaNet layers: vLLM autotunes their Triton prefill kernels inside the "
            "profile run on this GPU (vLLM PR 36599) and charges what that leaves on the "
            "device, which this plan does not subtract: 3.4 GiB on an RTX 5090 (vLLM issue "
            "36973); Qwen3.5 starts on A100s under 0.28 left 0.5-2.5 GiB beyond the weights, "
            "dense models 0.3-0.5"
        )
    if rel.sampler_warmup_pass or rel.cublas_in_baseline:
        notes.append(
            "vLLM 0.33's second sampler warm-up pass and cuBLAS handles in the start-up "
            "baseline are modelled in direction only (no 0.33 GPU start-up measured yet)"
        )
    held = layout.stage_layers[cap.tightest_stage]
    per_token = sum(kv_arch.layers[i].bytes_per_token(tp, kv_bytes) for i in held)
    if layout.extra_block_bytes and cap.tightest_stage == pp - 1:
        per_token += sum(x.bytes_per_token(tp, kv_bytes) for x in draft_layers)
    contexts = req.contexts or (Context("max_model_len", max_len),)
    # The scheduler reserves the drafter's lookahead slots past each running request
    # (kv_cache_manager.py::allocate_slots, capped at max_model_len); the start-up check
    # and the printed concurrency do not. The layout carries them to the sidecar's ceilings.
    if spec is not None and spec.lookahead_tokens:
        layout = replace(layout, lookahead_tokens=spec.lookahead_tokens, max_model_len=max_len)
    sequences = tuple(
        (c, sequences_that_fit(layout, cap.num_blocks, c.tokens, in_flight)) for c in contexts
    )
    flags_given = (
        spec is not None or req.lora is not None or req.cpu_offload_gb > 0 or req.mm_profile.skip
    )
    if flags_given and rel.version < (0, 32, 0):
        notes.append(
            f"--speculative-config, LoRA, --cpu-offload-gb and the encoder profile are "
            f"modelled as vLLM 0.32 and 0.33 apply them; {rel.label}'s code was not read "
            "for them"
        )
    if req.kv_offloading_size is not None:
        notes.append(
            f"--kv-offloading-size {req.kv_offloading_size:g}: a {req.kv_offloading_size:g} "
            "GiB CPU tier behind the GPU cache (vLLM's OffloadingConnector); the GPU blocks "
            "are unchanged, it holds evicted prefixes, not running sequences"
        )
    return Plan(
        request=req,
        utilization=utilization,
        block_size=block_size,
        max_model_len=max_len,
        max_num_seqs=max_seqs,
        max_num_batched_tokens=mnbt,
        in_flight_tokens=in_flight,
        kv_dtype_bytes=kv_bytes,
        kv_bytes_per_token=per_token,
        layout=layout,
        stages=stages,
        stage_available=tuple(available),
        cap=cap,
        sequences=sequences,
        startup_failure=failure,
        sources=sources,
        notes=tuple(notes),
        flag_memory=flag_memory,
    )


# What the CUDA context holds before vLLM loads a byte: 0.51 GiB on an H100 in the llm-d
# start-up logs (``worker init memory snapshot: ... cuda_memory=0.51GiB``). Weights that do
# not fit beside it fail the load, whatever the utilization.
CUDA_CONTEXT_BYTES = round(0.51 * GIB)


def _load_oom(req: PlanRequest, stages: Sequence[StageMemory]) -> StartupFailure | None:
    """Weights larger than the GPU fail in ``load_model`` with CUDA's out-of-memory error,
    before vLLM profiles anything; weights under the GPU's memory but over the ceiling load,
    and then leave no memory for the cache (vLLM's "No available memory" refusal).

    Not checked for a budget given as vLLM printed it: that deployment loaded.
    """
    if req.gpu.platform == "cpu" or req.available_kv_bytes is not None:
        return None
    free = req.gpu.total_bytes - CUDA_CONTEXT_BYTES
    weights = max(s.weights for s in stages)
    if weights <= free:
        return None
    return StartupFailure(
        weights,
        free,
        0,
        f"torch.OutOfMemoryError: CUDA out of memory while loading the weights "
        f"({weights / GIB:.2f} GiB on each GPU; the GPU has {req.gpu.total_bytes / GIB:.2f} "
        f"GiB, {free / GIB:.2f} GiB of it free beside the CUDA context).",
        "load_oom",
    )


_MODEL_DTYPE_NAMES = {"fp16": "float16", "bf16": "bfloat16"}


def _float_kv_dtype_refusal(req: PlanRequest) -> str | None:
    """0.33 refuses an explicit 16-bit KV dtype other than the model's, with this message
    (vllm/config/vllm.py::_reject_mismatched_float_kv_cache)."""
    if not req.release.rejects_mismatched_float_kv_cache:
        return None
    name = req.kv_cache_dtype.lower()
    cache_dtype = _MODEL_DTYPE_NAMES.get(name, name)
    if cache_dtype not in ("float16", "bfloat16"):
        return None
    model_dtype = req.arch.dtype
    if model_dtype == cache_dtype:
        return None
    allowed = f"`auto` or `{model_dtype}`" if model_dtype in ("float16", "bfloat16") else "`auto`"
    return (
        f'kv_cache_dtype="{cache_dtype}" is incompatible with dtype="{model_dtype}". '
        f"Please set `--kv-cache-dtype` to {allowed}."
    )


def _check_kv_dtype(req: PlanRequest) -> None:
    """The Octave formats exist from 0.33, on AMD GPUs, for 256-dim heads with 64 RoPE dims."""
    name = req.kv_cache_dtype.lower()
    if name not in OCTAVE_KV_DTYPES:
        return
    if not req.release.octave_kv_cache:
        raise InputError(
            "--kv-cache-dtype", "", req.kv_cache_dtype, f"is new in vLLM 0.33 ({req.release.label})"
        )
    if req.gpu.family != "cdna3":
        raise InputError(
            "--kv-cache-dtype",
            "",
            req.kv_cache_dtype,
            f"needs vLLM's ROCM_OCTAVE backend (AMD CDNA3/RDNA3), not {req.gpu.name}",
        )
    head = req.arch.attention_layers[0].head_size
    rope = int(head * req.arch.partial_rotary_factor)
    if head != OCTAVE_HEAD_SIZE or rope != OCTAVE_ROPE_DIM:
        raise InputError(
            "--kv-cache-dtype",
            "",
            req.kv_cache_dtype,
            f"ROCM_OCTAVE kernels need head_size {OCTAVE_HEAD_SIZE} and {OCTAVE_ROPE_DIM} "
            f"rotary dims; {req.arch.origin} has {head} and {rope}",
        )


def _uniform_type_draft(
    arch: ModelArch, kv_arch: ModelArch, block_size: int, tp: int, kv_bytes: float
) -> bool:
    """The target and drafter layers are all full attention (or all MLA) and their pages
    differ: vLLM puts them in one ``UniformTypeKVCacheSpecs`` group
    (vllm/v1/core/kv_cache_utils.py::get_kv_cache_groups, 0.32)."""
    kinds = {x.kind for x in kv_arch.layers}
    if len(kinds) != 1 or kinds.pop() not in (LayerKind.FULL, LayerKind.MLA):
        return False
    pages = {layer_page_bytes(x, block_size, tp, kv_bytes) for x in kv_arch.layers}
    return len(pages) > 1 and arch.num_layers < kv_arch.num_layers


def _weights_total(req: PlanRequest, sources: dict[str, str]) -> int | None:
    if req.weights_bytes is not None:
        sources["weights"] = req.weights_source
        return req.weights_bytes
    estimate = estimate_weights_bytes(
        req.arch,
        req.arch.dtype,
        req.quantization,
        native_fp4=req.gpu.family == "blackwell",
        marlin_tp=_marlin_tp(req),
    )
    if estimate is not None:
        sources["weights"] = "estimate (config parameters × dtype/quantization)"
    return estimate


def _stage_weights(
    req: PlanRequest, total_weights: int | None, sources: dict[str, str]
) -> tuple[int, ...]:
    """What each PP stage's GPU holds after loading: the checkpoint split as vLLM places it
    plus the rotary table, or, for a figure vLLM printed, that figure as it stands.

    vLLM's "Model loading took" is ``DeviceMemoryProfiler().consumed_memory`` around
    ``model_loader.load_model`` in ``GPUModelRunner.load_model``
    (vllm/v1/worker/gpu_model_runner.py, 0.8-0.32): the model is built inside it, so the
    rotary embedding's ``cos_sin_cache`` buffer, registered in ``RotaryEmbedding.__init__``
    (vllm/model_executor/layers/rotary_embedding/base.py), is already in the figure, and
    each worker measures its own TP shard. With PP the printed worker is taken as the first
    stage, the others scaled by how vLLM splits the layers.
    """
    arch, tp, pp = req.arch, req.tensor_parallel_size, req.pipeline_parallel_size
    if total_weights is None:
        return (0,) * pp

    def split(total: int) -> tuple[int, ...]:
        return stage_weight_bytes(
            arch,
            total,
            tp=tp,
            pp=pp,
            dtype=arch.dtype,
            quantization=req.quantization,
            native_fp4=req.gpu.family == "blackwell",
            marlin_tp=_marlin_tp(req),
        )

    if req.weights_per_gpu:
        if pp == 1:
            return (total_weights,)
        shares = split(total_weights * tp * pp)
        return tuple(int(total_weights * share / shares[0]) for share in shares)
    weights = split(total_weights)
    rope = rotary_cache_bytes(arch)
    if rope:
        weights = tuple(w + rope for w in weights)
        sources["weights"] += f" + {rope / 2**20:.0f} MiB rotary table"
    return weights


def _marlin_tp(req: PlanRequest) -> int:
    """The TP size MXFP4 experts are padded at for Marlin (``Release.mxfp4_marlin_on``), or
    0 where another kernel (or no MXFP4) loads them."""
    on = req.release.mxfp4_marlin_on(req.gpu.family) and req.gpu.platform == "cuda"
    return req.tensor_parallel_size if on else 0


_SAMPLER_NAMES = {
    "sorting": "sorting top-k/top-p",
    "flashinfer": "FlashInfer top-k/top-p",
    "kernel": "Triton top-k/top-p",
    "v2": "Model Runner V2, in place",
}


def mlp_width(arch: ModelArch) -> int:
    """The MLP width the forward pass scales with: the dense width, or experts per token ×
    expert width where that is larger."""
    width = arch.intermediate_size or 0
    if arch.moe is not None:
        width = max(width, arch.moe.expert_intermediate_size * arch.moe.experts_per_token)
    return width


def compiles(req: PlanRequest) -> bool:
    """Whether the profile run's cold torch.compile is charged: not eager, 0.20 on."""
    return not req.enforce_eager and req.release.charges_compile_transient


def compile_elems(req: PlanRequest) -> int:
    """A stage's decoder layers × MLP width ÷ TP, what the retired per-layer × width form of
    the compile transient was charged by (``memory.OverheadModel.compile_layer_width_bytes``,
    the fuzz tier's pin); 0 where none is charged (eager, or before 0.20)."""
    if not compiles(req):
        return 0
    layers = math.ceil(req.arch.num_layers / req.pipeline_parallel_size)
    return layers * mlp_width(req.arch) // req.tensor_parallel_size


def _stage_memory(
    req: PlanRequest,
    utilization: float,
    mnbt: int,
    max_seqs: int,
    sources: dict[str, str],
    flag_memory: dict[str, int],
) -> tuple[StageMemory, ...]:
    """The modelled budget of each PP stage (all TP ranks of a stage are alike)."""
    arch, rel = req.arch, req.release
    tp, pp = req.tensor_parallel_size, req.pipeline_parallel_size
    total_weights = _weights_total(req, sources)
    if req.gpu.platform == "cpu":
        # The CPU backend takes its KV size as given; nothing is profiled or subtracted.
        sources.update(activation="n/a on CPU", non_torch="n/a on CPU", cuda_graph="n/a on CPU")
        return tuple(StageMemory(0, 0, 0, 0, 0) for _ in range(pp))
    requested = requested_memory(req.gpu.total_bytes, utilization, rel)
    weights = _stage_weights(req, total_weights, sources)
    weights = _flag_weights(req, weights, total_weights, sources, flag_memory)
    dtype_bytes = 4 if arch.dtype == "float32" else 2
    width = mlp_width(arch)
    v2 = _v2_runner(req)
    v0 = rel.v0_engine_on(req.gpu.family)
    encoder_elems, encoder_held = _encoder_profile(
        req,
        mnbt,
        max_seqs,
        dtype_bytes,
        runner="v0" if v0 else "v2" if v2 else "v1",
        sources=sources,
    )
    inputs = ActivationInputs(
        max_num_batched_tokens=mnbt,
        max_num_seqs=max_seqs,
        intermediate_size=width,
        hidden_size=arch.hidden_size or 0,
        vocab_size=arch.vocab_size or 0,
        dtype_bytes=dtype_bytes,
        tp=tp,
        pp=pp,
        logits_softcap=arch.final_logit_softcapping is not None,
        encoder_elems=encoder_elems,
        encoder_held_bytes=encoder_held,
        v0_engine=v0,
        flashinfer_installed=req.flashinfer_installed,
        v2_runner=v2,
        compiled=compiles(req),
        compile_elems=compile_elems(req),
    )
    peaks = activation_peaks(inputs, rel, req.overhead)
    if not arch.vocab_size or not width:
        sources["activation"] = "unknown (config lacks vocab_size/intermediate_size): 0"
    else:
        # Which sampler the profile run takes moves this row by GiBs at a large vocabulary;
        # a start-up log says which (V2: "Using V2 Model Runner"), so the row names it.
        path = sampler_path(
            rel,
            inputs.v0_engine,
            inputs.flashinfer_installed,
            inputs.v2_runner,
            min(max_seqs, mnbt),
        )
        compiled = " with a cold torch.compile" if inputs.compiled else ""
        sources["activation"] = f"estimate (profile run{compiled}; sampler: {_SAMPLER_NAMES[path]})"
    non_torch = non_torch_bytes(rel, tp, pp, req.overhead)
    # The sampler and its state live on the last PP rank only.
    state = sampler_state_bytes(rel, max_seqs, arch.vocab_size or 0, inputs.v2_runner, req.overhead)
    states = tuple(state if s == pp - 1 else 0 for s in range(pp))
    graphs = cuda_graph_bytes(rel, req.enforce_eager, req.overhead, inputs.v2_runner)
    sources["non_torch"] = "estimate (by release and parallelism)"
    if state:
        where = " (last stage)" if pp > 1 else ""
        sources["non_torch"] += f", {state / GIB:.2f} GiB of it V2's sampling state{where}"
    if graphs:
        sources["cuda_graph"] = "estimate (subtracted from 0.20)"
    elif req.enforce_eager:
        sources["cuda_graph"] = "0: --enforce-eager"
    elif inputs.v2_runner and rel.subtracts_cudagraph_estimate:
        sources["cuda_graph"] = f"0: Model Runner V2 estimates none in {rel.label}"
    else:
        sources["cuda_graph"] = f"0: not subtracted in {rel.label}"

    # Sized after warmup (0.34's extensible cache): the device's memory, less the CUDA
    # context the start-up snapshot left out and a margin of max(floor, 0.75 × the
    # transient peak), caps the ceiling; None where the cache is sized at start-up.
    extensible = extensible_kv_cache(req)
    floor = ROCM_MARGIN_FLOOR if req.gpu.family == "cdna3" else MARGIN_FLOOR
    return tuple(
        StageMemory(
            requested,
            weights[s],
            peaks[s],
            non_torch + states[s],
            graphs,
            device_cap=req.gpu.total_bytes
            - CUDA_CONTEXT_BYTES
            - max(floor, int(peaks[s] * MARGIN_FRACTION))
            if extensible
            else None,
            sampler_state=states[s],
        )
        for s in range(pp)
    )


def _flag_weights(
    req: PlanRequest,
    weights: tuple[int, ...],
    total_weights: int | None,
    sources: dict[str, str],
    flag_memory: dict[str, int],
) -> tuple[int, ...]:
    """Each stage's weights with the drafter and the LoRA buffers added and the
    ``--cpu-offload-gb`` share taken off: all three happen inside vLLM's model-loading
    measurement (``GPUModelRunner.load_model``, 0.32 and 0.33), so they are weights.
    """
    tp, pp = req.tensor_parallel_size, req.pipeline_parallel_size
    stages = pp_partition(req.arch.num_layers, pp)
    out = list(weights)
    spec, lora = req.speculative, req.lora
    if spec is not None and spec.weights_bytes:
        # The drafter runs beside the last stage's LM head, sharded over the same TP.
        draft = spec.weights_bytes // (spec.draft_tensor_parallel_size or tp)
        out[-1] += draft
        flag_memory["draft_weights"] = draft
        sources["draft_weights"] = f"{spec.weights_bytes / GIB:.2f} GiB ({spec.weights_source})"
    if spec is not None and spec.lm_head_quantization:
        # 0.33: the drafter's quantized copy of the target's LM head, built in the same
        # loading measurement (deploy_flags.lm_head_copy_bytes).
        copy = lm_head_copy_bytes(req.arch, spec.lm_head_quantization, tp)
        out[-1] += copy
        flag_memory["draft_weights"] = flag_memory.get("draft_weights", 0) + copy
        head = f"{copy / GIB:.3f} GiB {spec.lm_head_quantization} copy of the LM head per GPU"
        earlier = sources.get("draft_weights")
        sources["draft_weights"] = f"{earlier} + {head}" if earlier else head
    if lora is not None:
        buffers = [lora_buffer_bytes(req.arch, lora, tp=tp, layers=r) for r in stages]
        out = [w + b for w, b in zip(out, buffers, strict=True)]
        flag_memory["lora_buffers"] = max(buffers)
        sources["lora_buffers"] = (
            f"{max(buffers) / GIB:.3f} GiB per GPU: {lora.max_loras} adapter(s) of rank "
            f"{lora.max_lora_rank} on every linear layer, the embedding and the LM head"
        )
    if req.cpu_offload_gb > 0 and total_weights is not None:
        moved = [
            offloaded_bytes(
                req.arch,
                total_weights,
                req.cpu_offload_gb,
                tp=tp,
                layers=r,
                quantization=req.quantization,
                native_fp4=req.gpu.family == "blackwell",
            )
            for r in stages
        ]
        out = [max(0, w - m) for w, m in zip(out, moved, strict=True)]
        flag_memory["cpu_offloaded"] = max(moved)
        sources["cpu_offload"] = (
            f"{max(moved) / GIB:.2f} GiB of decoder-layer weights per GPU on the host "
            f"(--cpu-offload-gb {req.cpu_offload_gb:g})"
        )
    return tuple(out)


# vllm/v1/worker/extensible_kv_cache.py (0.34): KV_CACHE_MARGIN_FLOOR_BYTES (3 GiB on ROCm)
# and KV_CACHE_MARGIN_FRACTION.
MARGIN_FLOOR = 1 << 30
ROCM_MARGIN_FLOOR = 3 << 30
MARGIN_FRACTION = 0.75


def prefix_caching(req: PlanRequest) -> bool:
    """Whether vLLM runs with prefix caching: the flag, else its default, which for a
    hybrid Mamba model depends on the release (Release.hybrid_prefix_caching_default)."""
    if req.enable_prefix_caching is not None:
        return req.enable_prefix_caching
    hybrid = req.arch.attention_kind is AttentionKind.HYBRID_MAMBA
    return not hybrid or req.release.hybrid_prefix_caching_default


def _state_dtypes(req: PlanRequest, sources: dict[str, str]) -> tuple[int, int] | None:
    """A hybrid model's recurrent state element sizes (conv, SSM), None for no such state.

    The conv state takes ``--mamba-cache-dtype`` ("auto": the model dtype); the SSM state
    ``--mamba-ssm-cache-dtype``, where "auto" is what vLLM's per-model config update takes
    from the checkpoint (Release.config_ssm_dtype: Qwen3.5's float32), else the conv
    state's (mamba_utils.py::MambaStateDtypeCalculator._mamba_state_dtype). Neither
    follows ``--kv-cache-dtype``.
    """
    arch = req.arch
    if arch.attention_kind is not AttentionKind.HYBRID_MAMBA:
        return None
    model = DTYPE_BYTES[arch.dtype]
    conv = model if req.mamba_cache_dtype == "auto" else MAMBA_STATE_DTYPES[req.mamba_cache_dtype]
    if req.mamba_ssm_cache_dtype != "auto":
        ssm_name, origin = req.mamba_ssm_cache_dtype, "flag"
    else:
        from_config = req.release.config_ssm_dtype(
            arch.architectures, arch.mamba_ssm_dtype, arch.mamba_ssm_cache_dtype
        )
        ssm_name = from_config or ""
        origin = f"config ({req.release.label})" if from_config else "the conv state's"
    ssm = MAMBA_STATE_DTYPES.get(ssm_name, conv)
    sources["mamba_state"] = f"conv {conv} B, SSM {ssm} B per element ({origin})"
    return conv, ssm


def extensible_kv_cache(req: PlanRequest) -> bool:
    """Whether vLLM sizes this cache after warmup: as the flag or vLLM's resolved label
    says (vLLM refuses an explicit request it cannot meet), else the release's default on a
    GPU unless a set KV size or block count leaves nothing to measure
    (``Release.extensible_kv_cache``)."""
    if req.gpu.platform == "cpu" or not req.release.extensible_kv_cache:
        return False
    if req.extensible_kv_cache is not None:
        return req.extensible_kv_cache
    return req.kv_cache_memory_bytes is None and req.num_gpu_blocks_override is None


def _v2_runner(req: PlanRequest) -> bool:
    """Model Runner V2 serves this deployment: as ``VLLM_USE_V2_MODEL_RUNNER`` says where it
    is set (``VllmConfig.use_v2_model_runner`` reads the variable first), else by the
    release's default (``Release.v2_model_runner``)."""
    if req.model_runner is not None and req.release.version >= (0, 12, 0):
        # Before 0.12 the variable does not exist (vllm/envs.py): one runner.
        return req.model_runner == "v2"
    arch = req.arch
    return req.release.v2_model_runner(
        arch.architectures,
        moe=arch.moe is not None,
        quantized=req.quantization is not None or arch.quantization is not None,
        hybrid=any(layer.kind == LayerKind.MAMBA for layer in arch.layers),
    )


def _encoder_profile(
    req: PlanRequest,
    mnbt: int,
    max_seqs: int,
    dtype_bytes: int,
    runner: Literal["v0", "v1", "v2"],
    sources: dict[str, str],
) -> tuple[int, int]:
    """The encoder profile's share of the profile run: the vision tower's work (patches ×
    MLP width, all items) and the bytes it leaves allocated under the dummy forward and
    the sampler.

    ``GPUModelRunner.profile_run`` (0.32) skips the encoder with ``--skip-mm-profiling``
    or when ``--limit-mm-per-prompt`` allows no item of any modality; otherwise it
    encodes ``mm_max_items_per_batch`` dummy items of the modality with the most tokens
    at once (vllm/multimodal/encoder_budget.py::_get_max_items: the encoder budget, by
    default ``max_num_batched_tokens``, over the tokens of one item, at least one).
    Model Runner V2 profiles no encoder before 0.27 (``Release.v2_profiles_encoder``).

    What stays allocated until the profile run ends, read in each runner's
    ``profile_run`` (0.8.5-0.33): the outputs, in the encoder cache (``encoder_cache
    ["tmp"]``, from 0.13 ``["tmp_{i}"]``; V2's ``EncoderRunner.profile_encoder_cache``);
    the V1 runner's ``batched_dummy_mm_inputs``, the pixel values on the GPU in the
    model's dtype, a local of ``profile_run``; and in 0.11 each output copied into zeros
    of the encoder budget's rows (``Release.encoder_profile_pads_to_budget``), the last
    unpadded one still bound to the loop's ``output``. V0 keeps none of it.
    """
    arch, mm, rel = req.arch, req.mm_profile, req.release
    if not arch.vision_profile_elems:
        return 0, 0
    if mm.skip or mm.allows_none(("image", arch.vision_profile_modality)):
        sources["encoder_profile"] = (
            "skipped (--skip-mm-profiling)"
            if mm.skip
            else "none (--language-model-only or --limit-mm-per-prompt 0)"
        )
        return 0, 0
    if runner == "v2" and not rel.v2_profiles_encoder:
        sources["encoder_profile"] = (
            f"none (Model Runner V2 profiles no encoder before 0.27; this is "
            f"{format_version(rel.version)})"
        )
        return 0, 0
    arch = profiled_modality(arch, mm)
    image = "the largest image" if arch.vision_profile_modality == "image" else "the longest video"
    if mm.max_pixels:
        # --mm-processor-kwargs lowers (or raises) the largest image the processor takes.
        sized = profiled_arch(arch, mm)
        image = (
            f"the largest image under max_pixels {mm.max_pixels:,} "
            f"({sized.vision_item_tokens:,} tokens)"
            if sized is not arch
            else f"{image} (max_pixels {mm.max_pixels:,} does not resize a fixed-size tower)"
        )
        arch = sized
    items = encoder_profile_items(arch, mnbt, max_seqs, mm, req.max_model_len or arch.max_model_len)
    sources["encoder_profile"] = f"{items} dummy item(s) of {image}"
    tokens, width = arch.vision_item_tokens, arch.vision_output_width
    held = items * tokens * width
    if runner == "v1":
        held += items * arch.vision_input_elems
        budget = max(mnbt, tokens)
        if rel.encoder_profile_pads_to_budget and tokens < budget:
            held += items * (budget - tokens) * width + tokens * width  # + the last original
            sources["encoder_profile"] += f", each padded to the {budget:,}-token budget"
    elif runner == "v0":
        held = 0
    return arch.vision_profile_elems * items, held * dtype_bytes


def _stage_available(
    req: PlanRequest, stages: Sequence[StageMemory], sources: dict[str, str]
) -> list[int]:
    """KV bytes per stage: --kv-cache-memory-bytes, the printed figure, or the model."""
    if req.kv_cache_memory_bytes is not None:
        sources["kv_budget"] = "flag (--kv-cache-memory-bytes; ignores utilization)"
        return [req.kv_cache_memory_bytes] * len(stages)
    if req.gpu.platform == "cpu":
        raise InputError(
            "--kv-cache-memory-bytes",
            "",
            None,
            "is required with --gpu cpu: vLLM's CPU backend sizes its cache from "
            "VLLM_CPU_KVCACHE_SPACE (GiB), not from a memory profile",
        )
    if req.available_kv_bytes is not None:
        # vLLM prints the first stage's figure; later stages differ by their non-KV memory.
        base = stages[0].non_kv
        sources["kv_budget"] = "given (--available-kv-bytes, first stage)" + (
            "; other stages by their modelled non-KV difference" if len(stages) > 1 else ""
        )
        return [req.available_kv_bytes - (s.non_kv - base) for s in stages]
    if "weights" not in sources:
        raise InputError(
            req.arch.origin,
            "",
            None,
            "the weight size is unknown (the config lacks vocab_size/intermediate_size): pass "
            "--weights-bytes, a model dir with weights, or --available-kv-bytes",
        )
    sources["kv_budget"] = (
        "estimate after warmup (min(ceiling, total − context − margin) − weights − "
        "activation − non-torch − graphs)"
        if any(s.device_cap is not None for s in stages)
        else "estimate (ceiling − weights − activation − non-torch − graphs)"
    )
    return [s.available for s in stages]


def replan(base: Plan, **changes: object) -> Plan:
    """``base`` re-planned with some flags changed, every other flag kept.

    When the base was anchored to a printed budget, the alternative keeps the same offset
    between the printed and the modelled budget. Raises InputError where vLLM would refuse
    the flags themselves (a TP that does not divide the heads).
    """
    req = base.request
    new = replace(req, **changes)  # type: ignore[arg-type]
    if req.available_kv_bytes is not None:
        modelled = plan(replace(req, available_kv_bytes=None))
        offset = base.stage_available[0] - modelled.stage_available[0]
        alt = plan(replace(new, available_kv_bytes=None))
        new = replace(new, available_kv_bytes=alt.stage_available[0] + offset)
    return plan(new)


def why_not(p: Plan) -> str:
    """Why ``p`` would not start, in one line and in vLLM's terms ("" when it starts)."""
    failure = p.startup_failure
    if failure is None:
        return ""
    if failure.cause == "load_oom":
        return (
            f"CUDA OOM loading the weights: {gib(failure.needed_bytes):.2f} GiB per GPU, "
            f"{gib(failure.available_bytes):.2f} GiB free"
        )
    if failure.cause == "config":
        return f"vLLM {p.request.release.label} refuses --kv-cache-dtype {p.request.kv_cache_dtype}"
    if failure.cause == "no_kv_memory" or failure.estimated_max_model_len == 0:
        t = p.stages[p.cap.tightest_stage]
        if p.request.kv_cache_memory_bytes is not None or p.request.available_kv_bytes:
            return f"no room for one KV block ({gib(p.kv_budget_bytes):.2f} GiB for the cache)"
        return (
            f"no room for one KV block: weights and overhead {gib(t.non_kv):.2f} GiB "
            f"of the {gib(t.requested):.2f} GiB ceiling"
        )
    return (
        f"max_model_len {p.max_model_len:,} needs {gib(failure.needed_bytes):.2f} GiB of KV, "
        f"{gib(failure.available_bytes):.2f} GiB free (the longest: "
        f"{failure.estimated_max_model_len:,})"
    )


def gpu_count(p: Plan) -> int:
    return p.request.tensor_parallel_size * p.request.pipeline_parallel_size


@dataclass(frozen=True)
class WhatIf:
    label: str
    plan: Plan | None  # None when the change is not possible for this model
    reason: str = ""


def what_ifs(base: Plan) -> tuple[WhatIf, ...]:
    """The next questions a capacity planner asks, each answered with a full re-plan.

    When the base was anchored to a printed budget, each alternative keeps the same offset
    between the printed and the modelled budget.
    """
    req = base.request
    out: list[WhatIf] = []

    def rerun(label: str, **changes: object) -> None:
        try:
            out.append(WhatIf(label, replan(base, **changes)))
        except InputError as e:
            out.append(WhatIf(label, None, e.problem))

    if base.kv_dtype_bytes > 1:
        rerun("FP8 KV cache (--kv-cache-dtype fp8)", kv_cache_dtype="fp8")
    if req.kv_cache_memory_bytes is None and req.gpu.platform != "cpu":
        for delta in (+0.05, -0.05):
            u = round(base.utilization + delta, 4)
            if 0 < u <= 1:
                rerun(f"--gpu-memory-utilization {u:g}", gpu_memory_utilization=u)
    tp2 = req.tensor_parallel_size * 2
    heads = req.arch.num_attention_heads
    if heads is None or heads % tp2 == 0:
        rerun(f"--tensor-parallel-size {tp2}", tensor_parallel_size=tp2)
    else:
        out.append(WhatIf(f"--tensor-parallel-size {tp2}", None, f"{heads} heads do not split"))
    failure = base.startup_failure
    if failure is not None and 0 < failure.estimated_max_model_len < base.max_model_len:
        # A deployment that cannot start needs the longest context that fits, not a guess:
        # vLLM's own estimate, as its refusal prints it.
        longest = failure.estimated_max_model_len
        rerun(f"--max-model-len {longest} (the longest)", max_model_len=longest)
    elif (shorter := base.max_model_len // 2) >= base.block_size:
        rerun(f"--max-model-len {shorter}", max_model_len=shorter)
    # Half and twice the batch cap in force, whatever set it: halving is the lever that
    # stops preemption (fewer sequences to grow) at the cost of a queue; doubling frees a
    # queue that waits on the cap. Either moves the budget too (the sampler's warm-up
    # scales with it); with --traffic the rows say which way the traffic held moves.
    if base.max_num_seqs > 1:
        half = base.max_num_seqs // 2
        rerun(f"--max-num-seqs {half}", max_num_seqs=half)
    rerun(f"--max-num-seqs {base.max_num_seqs * 2}", max_num_seqs=base.max_num_seqs * 2)
    # The deployment flags of deploy_flags.py: what each costs, where it is given, and for
    # weights that do not load, the host memory that would let them.
    spec = req.speculative
    if spec is not None and (spec.kv_layers or spec.weights_bytes):
        rerun("without --speculative-config", speculative=None)
    if req.lora is not None:
        rerun("without --enable-lora", lora=None)
    if req.cpu_offload_gb > 0:
        rerun("--cpu-offload-gb 0", cpu_offload_gb=0.0)
    elif failure is not None and failure.cause == "load_oom":
        gib_short = math.ceil((failure.needed_bytes - failure.available_bytes) / GIB)
        offload = _offload_that_starts(base, gib_short)
        rerun(f"--cpu-offload-gb {offload:g}", cpu_offload_gb=float(offload))
    # One memory class down and up on the vendor's ladder, same flags (vLLM's defaults
    # for the batch follow the GPU). Not with --kv-cache-memory-bytes: the budget would
    # not follow the GPU's memory.
    if req.kv_cache_memory_bytes is None:
        for other in neighbours(req.gpu):
            if other is not None:
                rerun(f"--gpu {other.name}", gpu=other)
    return tuple(out)


def gib(n: float) -> float:
    return n / GIB


def _offload_that_starts(base: Plan, first: int) -> int:
    """The fewest whole GiB of ``--cpu-offload-gb`` from ``first`` (the weights' shortfall)
    with which ``base`` starts (the activation peak and the cache need room beside what
    stays on the GPU), found by bisection: more offload never leaves less room. All the
    weights of a GPU when even that does not start."""
    top = max(first, math.ceil(max(s.weights for s in base.stages) / GIB))

    def starts(offload: int) -> bool:
        try:
            return replan(base, cpu_offload_gb=float(offload)).startup_failure is None
        except InputError:
            return False

    lo, hi = max(1, first), top
    if not starts(hi):
        return hi
    while lo < hi:
        mid = (lo + hi) // 2
        if starts(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


# Tensor-parallel sizes the searches below try: one node's worth. vLLM's guidance is TP
# within a node and PP across nodes, so a deployment larger than 8 GPUs adds stages.
TP_SIZES = (1, 2, 4, 8)


@dataclass(frozen=True)
class Suggestion:
    """The smallest change on one dial that makes a deployment start, or why none does."""

    # tensor_parallel, parallel (fewest GPUs, stages too), gpu, gpu_tp, kv_cache_dtype,
    # max_model_len, utilization
    dial: str
    change: str  # the flags to pass; "" when no setting of the dial starts
    plan: Plan | None  # the deployment with the change; None when no setting starts
    why_not: str = ""  # when none starts: why the last one tried would not, in vLLM's terms


def _tp_sizes(arch: ModelArch) -> tuple[int, ...]:
    heads = arch.num_attention_heads
    return tuple(t for t in TP_SIZES if heads is None or heads % t == 0)


def _parallel_flags(tp: int, pp: int, base: PlanRequest) -> str:
    flags = []
    if tp != base.tensor_parallel_size:
        flags.append(f"--tensor-parallel-size {tp}")
    if pp != base.pipeline_parallel_size:
        flags.append(f"--pipeline-parallel-size {pp}")
    return " ".join(flags)


def _first_start(
    base: Plan, dial: str, tries: Sequence[tuple[str, dict[str, object]]]
) -> Suggestion:
    """The first of ``tries`` (cheapest first) whose re-plan starts; otherwise why the last
    one that could be planned would not."""
    reason = "nothing to try"
    for change, changes in tries:
        try:
            alt = replan(base, **changes)
        except InputError as e:
            reason = e.problem
            continue
        if alt.startup_failure is None:
            return Suggestion(dial, change, alt)
        reason = f"{change}: {why_not(alt)}"
    return Suggestion(dial, "", None, reason)


# The GPUs a search may name. Not GB10: its memory is shared with the CPU and vLLM checks
# the budget against the system's free memory, so a plan there comes with a note that the
# default utilization often fails; a search cannot name it as one that starts.
_SUGGESTABLE = tuple(g for g in GPU_CATALOGUE if g.name != "GB10")


def _same_vendor(gpu: Gpu) -> tuple[Gpu, ...]:
    """The table's GPUs a user of ``gpu`` could move to without changing vLLM's build (CUDA
    or ROCm), smallest memory first; every GPU of the table for one given by its size."""
    amd = gpu.family == "cdna3"
    known = gpu.family not in ("cpu", "unknown")
    pool = [g for g in _SUGGESTABLE if not known or (g.family == "cdna3") == amd]
    return tuple(sorted(pool, key=lambda g: g.total_bytes))


def what_would_work(base: Plan) -> tuple[Suggestion, ...]:
    """For a deployment vLLM would refuse: per dial, the smallest change that starts.

    Each answer is a re-plan with the same arithmetic and every other flag kept, searched
    cheapest first: fewest GPUs on this GPU (TP within a node, then stages), the smallest GPU
    of the table at this parallelism (and, when none, at the smallest TP that has one), an
    FP8 cache, the longest context, the lowest utilization above today's.
    """
    failure = base.startup_failure
    if failure is None:
        return ()
    req, arch = base.request, base.request.arch
    tp0, pp0 = req.tensor_parallel_size, req.pipeline_parallel_size
    out: list[Suggestion] = []
    if failure.cause == "config":
        out.append(
            _first_start(
                base, "kv_cache_dtype", [("--kv-cache-dtype auto", {"kv_cache_dtype": "auto"})]
            )
        )
        return tuple(out)

    by_tp = _first_start(
        base,
        "tensor_parallel",
        [
            (f"--tensor-parallel-size {tp}", {"tensor_parallel_size": tp})
            for tp in _tp_sizes(arch)
            if tp != tp0
        ],
    )
    out.append(by_tp)
    # Stages spread the weights as TP does, and reach GPU counts TP cannot (3, 12, 72):
    # the fewest GPUs of any TP × PP, shown where that is fewer than TP alone needs.
    shapes = sorted(
        (tp * pp, pp, tp)
        for tp in _tp_sizes(arch)
        for pp in range(1, max(arch.num_layers, 1) + 1)
        if (tp, pp) != (tp0, pp0)
    )
    fewest = _first_start(
        base,
        "parallel",
        [
            (
                _parallel_flags(tp, pp, req),
                {"tensor_parallel_size": tp, "pipeline_parallel_size": pp},
            )
            for _, pp, tp in shapes
        ],
    )
    if by_tp.plan is None or (
        fewest.plan is not None and gpu_count(fewest.plan) < gpu_count(by_tp.plan)
    ):
        out.append(fewest)

    if req.kv_cache_memory_bytes is not None or req.gpu.platform == "cpu":
        out.append(
            Suggestion("gpu", "", None, "the KV budget is given, so another GPU changes nothing")
        )
    else:
        others = [g for g in _same_vendor(req.gpu) if g.name != req.gpu.name]
        on_gpu = _first_start(base, "gpu", [(f"--gpu {g.name}", {"gpu": g}) for g in others])
        out.append(on_gpu)
        if on_gpu.plan is None:
            wider = [
                (
                    f"--gpu {g.name} --tensor-parallel-size {tp}",
                    {"gpu": g, "tensor_parallel_size": tp},
                )
                for tp in _tp_sizes(arch)
                if tp > tp0
                for g in others
            ]
            out.append(_first_start(base, "gpu_tp", wider))

    if base.kv_dtype_bytes > 1:
        out.append(
            _first_start(
                base, "kv_cache_dtype", [("--kv-cache-dtype fp8", {"kv_cache_dtype": "fp8"})]
            )
        )

    if failure.cause == "max_model_len" and failure.estimated_max_model_len > 0:
        longest = failure.estimated_max_model_len
        out.append(
            _first_start(
                base, "max_model_len", [(f"--max-model-len {longest}", {"max_model_len": longest})]
            )
        )
    else:
        out.append(Suggestion("max_model_len", "", None, why_not(base)))

    if req.kv_cache_memory_bytes is None and req.gpu.platform != "cpu":
        if failure.cause == "load_oom":
            out.append(Suggestion("utilization", "", None, why_not(base)))
        else:
            # vLLM refuses a budget above the memory free at start-up ("Free memory on
            # device ... is less than desired GPU memory utilization"), so stop there.
            top = int((req.gpu.total_bytes - CUDA_CONTEXT_BYTES) / req.gpu.total_bytes * 100)
            start = int(base.utilization * 100 + 1e-9) + 1  # the next whole percent up
            out.append(
                _first_start(
                    base,
                    "utilization",
                    [
                        (
                            f"--gpu-memory-utilization {u / 100:g}",
                            {"gpu_memory_utilization": u / 100},
                        )
                        for u in range(start, top + 1)
                    ],
                )
            )
    return tuple(out)


@dataclass(frozen=True)
class Fit:
    """One deployment that holds the sequences asked, with the flags that make it."""

    plan: Plan
    held: int  # sequences of the length asked held at once (blocks and max_num_seqs both)
    change: str  # the flags, beyond those given: --gpu, -tp, KV dtype, a raised max_num_seqs

    @property
    def gpus(self) -> int:
        return gpu_count(self.plan)


def fit(base: Plan, sequences: int, tokens: int) -> tuple[Fit, ...]:
    """Which deployments hold ``sequences`` sequences of ``tokens`` tokens at once.

    Every GPU of the table but GB10 × TP 1, 2, 4, 8 × KV dtype auto and fp8, every other flag as
    given (PP too); per GPU and KV dtype the smallest TP that starts and holds them, fewest
    GPUs first, then the smallest GPU. An FP8 row is kept only where it needs fewer GPUs
    than the model's own KV dtype on that GPU. ``max_model_len`` is the one given, or
    ``tokens``; a ``max_num_seqs`` left to vLLM's default is raised to ``sequences`` where
    the default is smaller, since vLLM would otherwise never run them all at once.
    """
    req = base.request
    if sequences < 1 or tokens < 1:
        raise InputError("--fit", "", f"{sequences}:{tokens}", "both must be greater than 0")
    max_len = req.max_model_len or tokens
    if max_len < tokens:
        raise InputError(
            "--fit",
            "",
            f"{sequences}:{tokens}",
            f"sequences of {tokens} tokens are longer than --max-model-len {max_len}",
        )
    context = (Context(str(tokens), tokens),)
    found: list[Fit] = []
    for gpu in _SUGGESTABLE:
        by_dtype: dict[str, Fit] = {}
        for kv in ("auto", "fp8"):
            for tp in _tp_sizes(req.arch):
                changes: dict[str, object] = {
                    "gpu": gpu,
                    "tensor_parallel_size": tp,
                    "kv_cache_dtype": kv,
                    "max_model_len": max_len,
                    "contexts": context,
                }
                try:
                    alt = replan(base, **changes)
                    raised = req.max_num_seqs is None and alt.max_num_seqs < sequences
                    if raised:
                        alt = replan(base, **changes, max_num_seqs=sequences)
                except InputError:
                    break  # this GPU or dtype is refused whatever the TP (an Octave dtype)
                held = min(alt.sequences[0][1], alt.max_num_seqs)
                if alt.startup_failure is None and held >= sequences:
                    flags = [f"--gpu {gpu.name}"]
                    if tp != req.tensor_parallel_size:
                        flags.append(f"--tensor-parallel-size {tp}")
                    if kv != req.kv_cache_dtype:
                        flags.append(f"--kv-cache-dtype {kv}")
                    if raised:
                        flags.append(f"--max-num-seqs {sequences}")
                    by_dtype[kv] = Fit(alt, held, " ".join(flags))
                    break
        auto, fp8 = by_dtype.get("auto"), by_dtype.get("fp8")
        if auto is not None:
            found.append(auto)
        if fp8 is not None and (auto is None or fp8.gpus < auto.gpus):
            found.append(fp8)
    found.sort(key=lambda f: (f.gpus, f.plan.request.gpu.total_bytes, f.plan.kv_dtype_bytes < 2))
    return tuple(found)
