"""Blocks, groups and what vLLM prints: the KV cache of one deployment, exactly.

Mirrors vllm/v1/kv_cache_interface.py (page sizes) and vllm/v1/core/kv_cache_utils.py
(groups, ``num_blocks``, concurrency, the startup check) for the release asked. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from exporter.capacity.arch import DTYPE_BYTES, LayerKind, LayerKV, ModelArch, kv_heads_per_gpu
from exporter.capacity.releases import ConcurrencyLine, MambaCacheMode, Release, TokenLine
from exporter.errors import InputError

OCTAVE_KV_DTYPES = ("octave_k3v4", "octave_k3v3", "octave_k3v3_compact")
KV_CACHE_DTYPES = (
    "auto",
    "fp16",
    "float16",
    "bf16",
    "bfloat16",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
    *OCTAVE_KV_DTYPES,
)
_KV_DTYPE_BYTES = {
    "fp16": 2,
    "float16": 2,
    "bf16": 2,
    "bfloat16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
    "int8": 1,
}

# Attention kernels need block sizes in these steps when vLLM raises the attention block to
# cover a Mamba page (vllm/platforms/interface.py::_align_hybrid_block_size).
_HYBRID_BLOCK_ALIGNMENT = 16
ALL_STATES = 0  # Spec.mamba_blocks for mode "all": one state block per block of tokens
MAMBA_STATE_DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2}  # --mamba(-ssm)-cache-dtype


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def kv_dtype_bytes(kv_cache_dtype: str, model_dtype: str, arch: ModelArch) -> float:
    """Bytes per cached element: ``auto`` follows the model (or the checkpoint's KV scheme).

    The Octave formats pack a token's K and V for one head into one slot; their figure is
    that slot over ``2 × head_size`` elements (exact: slots and heads are powers of two).
    """
    name = kv_cache_dtype.lower()
    if name == "auto":
        q = arch.quantization
        if q is not None and q.kv_cache_bits == 8:
            return 1  # llm-compressor kv_cache_scheme applies when the user set no dtype
        return DTYPE_BYTES[model_dtype]
    if name in OCTAVE_KV_DTYPES:
        head = arch.attention_layers[0].head_size
        return octave_slot_bytes(name, head, int(head * arch.partial_rotary_factor)) / (2 * head)
    if name not in _KV_DTYPE_BYTES:
        raise InputError(
            "--kv-cache-dtype", "", kv_cache_dtype, f"use one of {', '.join(KV_CACHE_DTYPES)}"
        )
    return _KV_DTYPE_BYTES[name]


# vllm/v1/attention/ops/rocm_octave.py (0.33): Hadamard blocks of 64 dims, RoPE dims of K
# at 4 bits and the rest at 3, V at 4 (k3v4) or 3 bits, one fp16 scale per K block (one
# for all of K when compact) plus one for V, the slot padded to 8 bytes (4 when compact).
_OCTAVE_V_BITS = {"octave_k3v4": 4, "octave_k3v3": 3, "octave_k3v3_compact": 3}
_OCTAVE_BLOCK, _OCTAVE_ROPE_BITS, _OCTAVE_NOPE_BITS = 64, 4, 3
OCTAVE_HEAD_SIZE, OCTAVE_ROPE_DIM = 256, 64  # the only shape ROCM_OCTAVE's kernels take


def octave_slot_bytes(kv_cache_dtype: str, head_size: int, rope_dim: int) -> int:
    """Bytes of one packed K+V slot (one token, one KV head) of an Octave KV cache."""
    compact = kv_cache_dtype.endswith("_compact")
    wide = 0 if compact else rope_dim
    k_bytes = (wide * _OCTAVE_ROPE_BITS + (head_size - wide) * _OCTAVE_NOPE_BITS) // 8
    v_bytes = head_size * _OCTAVE_V_BITS[kv_cache_dtype] // 8
    scales = (1 if compact else head_size // _OCTAVE_BLOCK) + 1
    align = 4 if compact else 8
    return cdiv(k_bytes + v_bytes + 2 * scales, align) * align


@dataclass(frozen=True)
class Spec:
    """One layer's KV spec on one GPU (hashable: equal specs share groups)."""

    kind: LayerKind
    block_size: int
    page_bytes: int  # bytes one block of this layer occupies
    window: int | None = None
    # State blocks a request holds: 1, or 2 + checkpoints with prefix caching ("align"), or
    # ALL_STATES, one per block of tokens (mamba_cache_mode "all").
    mamba_blocks: int = 1

    def blocks_per_request(self, length: int, in_flight_tokens: int) -> int:
        """Blocks one request of ``length`` tokens may pin (``max_memory_usage_bytes``)."""
        bs = self.block_size
        if self.kind is LayerKind.MAMBA:
            return cdiv(length, bs) if self.mamba_blocks == ALL_STATES else self.mamba_blocks
        if self.kind is LayerKind.SLIDING:
            assert self.window is not None
            return cdiv(min(self.window - 1 + in_flight_tokens, length), bs) + 1
        if self.kind is LayerKind.CHUNKED:
            assert self.window is not None
            return cdiv(min(self.window + in_flight_tokens, length), bs)
        return cdiv(length, bs)


@dataclass(frozen=True)
class Group:
    """A KV cache group: layers that share one block table (vLLM ``KVCacheGroupSpec``)."""

    spec: Spec
    layers: tuple[int, ...]  # global layer indices, in vLLM's ``layers[i::n]`` order


@dataclass(frozen=True)
class Layout:
    """The whole model's groups, and how they fall onto pipeline stages."""

    groups: tuple[Group, ...]
    block_size: int
    page_bytes: int
    padding_layers: int  # layers vLLM adds so groups are equal-sized (memory it wastes)
    stage_layers: tuple[range, ...]  # the layers each PP stage holds
    # Bytes each block id also costs on the last stage: the pages of layers with another
    # page size in a uniform-type group (a drafter's full-attention layers beside the
    # target's: vllm/v1/kv_cache_interface.py::UniformTypeKVCacheSpecs sums the pages).
    extra_block_bytes: int = 0
    # Slots the scheduler reserves past each running sequence for a drafter's tokens
    # (VllmConfig.num_lookahead_tokens), capped at max_model_len as allocate_slots caps it.
    lookahead_tokens: int = 0
    max_model_len: int | None = None

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    def stage_bytes_per_block(self, stage: int) -> int:
        """Bytes one block id costs on ``stage``: page × its largest projected group."""
        held = self.stage_layers[stage]
        largest = max(sum(1 for i in g.layers if i in held) for g in self.groups)
        extra = self.extra_block_bytes if stage == len(self.stage_layers) - 1 else 0
        return self.page_bytes * largest + extra

    def blocks_per_request(self, length: int, in_flight_tokens: int) -> int:
        return sum(g.spec.blocks_per_request(length, in_flight_tokens) for g in self.groups)

    def running_tokens(self, length: int) -> int:
        """The slots a running sequence of ``length`` tokens holds: its tokens and the
        drafter's lookahead (vllm/v1/core/kv_cache_manager.py::allocate_slots), no more
        than max_model_len unless the sequence itself is longer."""
        if not self.lookahead_tokens:
            return length
        cap = max(self.max_model_len or 0, length) if self.max_model_len else None
        grown = length + self.lookahead_tokens
        return min(grown, cap) if cap is not None else grown


def pp_partition(num_layers: int, pp: int) -> tuple[range, ...]:
    """Layers per pipeline stage (vllm/distributed/utils.py::get_pp_indices).

    An even split; remainder layers go to the stages before the last, from the
    second-to-last backwards (the last one holds the final norm and LM head).
    """
    sizes = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        sizes[-i] += 1
    out, start = [], 0
    for n in sizes:
        out.append(range(start, start + n))
        start += n
    return tuple(out)


def layer_page_bytes(layer: LayerKV, block_size: int, tp: int, dtype_bytes: float) -> int:
    """``page_size_bytes`` of one attention layer (MLA: one latent head, no V)."""
    heads = kv_heads_per_gpu(layer, tp)
    return int(block_size * heads * (layer.head_size + layer.head_size_v) * dtype_bytes)


def mamba_page_bytes(layer: LayerKV, tp: int, conv_bytes: int, ssm_bytes: int) -> int:
    """One request's recurrent state in one layer on one GPU: the conv state in
    ``--mamba-cache-dtype`` and the SSM state in ``--mamba-ssm-cache-dtype``, neither of
    which follows ``--kv-cache-dtype`` (vllm/model_executor/layers/mamba/mamba_utils.py::
    MambaStateDtypeCalculator, 0.16-0.33)."""
    assert layer.state is not None
    return (layer.state.conv_elems * conv_bytes + layer.state.ssm_elems * ssm_bytes) // tp


def build_layout(
    arch: ModelArch,
    *,
    release: Release,
    block_size: int,
    tp: int,
    pp: int,
    dtype_bytes: float,
    hybrid_manager: bool = True,
    mamba_cache_mode: MambaCacheMode = "none",
    state_bytes: tuple[int, int] | None = None,
    gdn_checkpoint_alignment: int | None = None,
) -> tuple[Layout, int]:
    """Group the layers as vLLM does; returns the layout and the attention block size used.

    ``block_size`` is the configured one; hybrid Mamba models raise it so an attention page
    covers a Mamba page. Without the hybrid manager (old releases or
    ``--disable-hybrid-kv-cache-manager``) sliding and chunked layers are sized as full.
    ``state_bytes`` is the recurrent state's (conv, SSM) element size, the model dtype's by
    default. The Mamba cache mode is what a request holds of its state
    (vllm/v1/kv_cache_interface.py::MambaSpec.max_memory_usage_bytes, 0.16-0.33): "none"
    one block; "align" (prefix caching) two, three when the layers export prefill
    checkpoints (Mamba2 from 0.32; Gated DeltaNet with ``gdn_checkpoint_alignment``, and the
    attention block is then a multiple of that alignment); "all" a block per block of
    tokens, like attention.
    """
    if pp > arch.num_layers:
        raise InputError(
            "--pipeline-parallel-size",
            "",
            pp,
            f"is larger than the model's {arch.num_layers} layers",
        )
    layers = arch.layers
    unify = not (hybrid_manager and release.hybrid_kv_cache_manager)
    if unify:
        layers = tuple(
            replace(x, kind=LayerKind.FULL, window=None)
            if x.kind in (LayerKind.SLIDING, LayerKind.CHUNKED)
            else x
            for x in layers
        )

    attn = [x for x in layers if x.kind is not LayerKind.MAMBA]
    mamba = [x for x in layers if x.kind is LayerKind.MAMBA]
    conv_bytes, ssm_bytes = state_bytes or (DTYPE_BYTES[arch.dtype],) * 2
    gdn_checkpoints = gdn_checkpoint_alignment is not None and arch.gated_delta
    checkpoints = gdn_checkpoints or (
        release.mamba2_prefill_checkpoint
        and any(x.state is not None and x.state.mamba2 for x in mamba)
    )
    mamba_blocks = {"none": 1, "align": 3 if checkpoints else 2, "all": ALL_STATES}[
        mamba_cache_mode
    ]
    if mamba and attn:
        mamba_page = max(mamba_page_bytes(x, tp, conv_bytes, ssm_bytes) for x in mamba)
        per_token = max(layer_page_bytes(x, 1, tp, dtype_bytes) for x in attn)
        align = max(_HYBRID_BLOCK_ALIGNMENT, block_size)
        if gdn_checkpoints and gdn_checkpoint_alignment is not None:
            align = math.lcm(align, gdn_checkpoint_alignment)
        needed = align * cdiv(mamba_page, align * per_token)
        needed = cdiv(needed, _HYBRID_BLOCK_ALIGNMENT) * _HYBRID_BLOCK_ALIGNMENT
        block_size = max(block_size, needed)

    specs: dict[int, Spec] = {}  # by layer index; a layer that shares another's KV has none
    for i, x in enumerate(layers):
        if x.kv_shared:
            continue
        if x.kind is LayerKind.MAMBA:
            page = mamba_page_bytes(x, tp, conv_bytes, ssm_bytes)
            specs[i] = Spec(LayerKind.MAMBA, block_size, page, mamba_blocks=mamba_blocks)
        else:
            page = layer_page_bytes(x, block_size, tp, dtype_bytes)
            specs[i] = Spec(x.kind, block_size, page, x.window)
    page = max(s.page_bytes for s in specs.values())
    # One page size for every group (kv_cache_utils.py::unify_kv_cache_spec_page_size):
    # Mamba pages are padded up to the largest page; an attention layer with a smaller page
    # (Gemma 4's sliding layers beside its 512-dim full ones) takes a block that many times
    # longer, where its page divides the largest.
    for i, s in specs.items():
        if s.kind is LayerKind.MAMBA:
            specs[i] = Spec(s.kind, s.block_size, page, s.window, s.mamba_blocks)
        elif s.page_bytes != page and page % s.page_bytes == 0:
            specs[i] = Spec(s.kind, s.block_size * (page // s.page_bytes), page, s.window)
    if len({s.page_bytes for s in specs.values()}) > 1:
        raise InputError(
            arch.origin,
            "layer_types",
            sorted({s.page_bytes for s in specs.values()}),
            "layers whose KV pages do not divide the largest are not supported by this planner",
        )

    buckets: dict[Spec, list[int]] = {}
    for i, s in specs.items():
        buckets.setdefault(s, []).append(i)
    stage_layers = pp_partition(len(layers), pp)
    if len(buckets) == 1:
        ((spec, members),) = buckets.items()
        group = Group(spec, tuple(members))
        return Layout((group,), block_size, page, 0, stage_layers), block_size

    sizes = [len(v) for v in buckets.values()]
    group_size = min(sizes)
    ratio = release.hybrid_group_ratio
    if ratio is not None and max(sizes) < group_size * ratio:
        group_size = max(sizes)
    groups: list[Group] = []
    padding = 0
    for spec, members in buckets.items():
        n = cdiv(len(members), group_size)
        padding += n * group_size - len(members)
        groups.extend(Group(spec, tuple(members[i::n])) for i in range(n))
    return Layout(tuple(groups), block_size, page, padding, stage_layers), block_size


@dataclass(frozen=True)
class Capacity:
    """What vLLM computes and prints once it knows the memory of every worker."""

    num_blocks: int  # after the override and the minimum over workers
    computed_blocks: int  # before --num-gpu-blocks-override
    tightest_stage: int
    blocks_per_request: int  # at max_model_len
    max_concurrency: float  # "Maximum concurrency for L tokens per request: X×"
    capacity_tokens: int  # "KV cache size: N tokens" as this release prints it
    pool_tokens: int  # num_blocks × block_size: slots in the shared pool
    token_line: TokenLine
    concurrency_line: ConcurrencyLine


def capacity(
    layout: Layout,
    stage_available: Sequence[int],
    *,
    release: Release,
    max_model_len: int,
    in_flight_tokens: int,
    num_gpu_blocks_override: int | None,
) -> Capacity:
    """``num_blocks`` = min over stages of available // bytes per block, then the figures."""
    per_stage = [
        max(0, avail) // layout.stage_bytes_per_block(stage)
        for stage, avail in enumerate(stage_available)
    ]
    computed = min(per_stage)
    tightest = per_stage.index(computed)
    blocks = num_gpu_blocks_override if num_gpu_blocks_override is not None else computed
    per_request = layout.blocks_per_request(max_model_len, in_flight_tokens)
    bs = layout.block_size
    if release.concurrency_line is ConcurrencyLine.BLOCKS_OVER_REQUEST:
        concurrency = blocks / per_request
    else:
        concurrency = blocks * bs / max_model_len
    line = release.token_line
    if line is TokenLine.CONCURRENCY_TIMES_LEN:
        tokens = int(concurrency * max_model_len)
    elif line is TokenLine.PER_GROUP:
        tokens = blocks // layout.num_groups * bs
    else:
        tokens = blocks * bs
    return Capacity(
        num_blocks=blocks,
        computed_blocks=computed,
        tightest_stage=tightest,
        blocks_per_request=per_request,
        max_concurrency=concurrency,
        capacity_tokens=tokens,
        pool_tokens=blocks * bs,
        token_line=line,
        concurrency_line=release.concurrency_line,
    )


def sequences_that_fit(layout: Layout, num_blocks: int, context: int, in_flight_tokens: int) -> int:
    """Whole sequences of ``context`` tokens the pool holds at once.

    One block is vLLM's reserved null block and never holds a token, so this is
    ``(num_blocks - 1) // blocks per sequence`` — e.g. 48 blocks of 128 at 2,048 tokens:
    vLLM prints 3.00× but only 2 such sequences fit.
    """
    per_seq = layout.blocks_per_request(layout.running_tokens(max(1, context)), in_flight_tokens)
    return max(0, num_blocks - 1) // per_seq


# Why vLLM would not start, in the order its start-up meets them: the config is validated
# ("config"), the weights are loaded ("load_oom": CUDA runs out of memory), the profile
# leaves nothing for the cache ("no_kv_memory"), or one request at max_model_len does not
# fit in what is left ("max_model_len").
FailureCause = Literal["config", "load_oom", "no_kv_memory", "max_model_len"]


@dataclass(frozen=True)
class StartupFailure:
    """vLLM's refusal to start, with its message and which check refused."""

    needed_bytes: int
    available_bytes: int
    estimated_max_model_len: int
    message: str
    cause: FailureCause = "max_model_len"


def startup_check(
    layout: Layout,
    stage: int,
    available: int,
    *,
    release: Release,
    max_model_len: int,
    in_flight_tokens: int,
) -> StartupFailure | None:
    """``_check_enough_kv_cache_memory`` on one worker, with vLLM's message."""
    per_block = layout.stage_bytes_per_block(stage)
    usable = available - per_block if release.version >= (0, 32, 0) else available
    if available <= 0:
        return StartupFailure(
            0,
            available,
            0,
            "No available memory for the cache blocks. Try increasing "
            "`gpu_memory_utilization` when initializing the engine.",
            "no_kv_memory",
        )
    needed = per_block * layout.blocks_per_request(max_model_len, in_flight_tokens)
    if needed <= usable:
        return None
    lo, hi, best = 1, max_model_len, 0
    while lo <= hi:
        mid = (lo + hi) // 2
        if per_block * layout.blocks_per_request(mid, in_flight_tokens) <= usable:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    gib = 1 << 30
    estimate = (
        f"Based on the available memory, the estimated maximum model length is {best}. "
        if best > 0
        else ""
    )
    return StartupFailure(
        needed,
        usable,
        best,
        f"To serve at least one request with the model's max seq len ({max_model_len}), "
        f"({needed / gib:.2f} GiB KV cache is needed, which is larger than the available "
        f"KV cache memory ({usable / gib:.2f} GiB). {estimate}Try increasing "
        "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
    )
