"""Weight memory: how many bytes of the checkpoint each GPU loads.

vLLM shards every linear layer and the (vocab-parallel) embedding and LM head over TP,
and gives each PP stage its own layers, the embedding to the first stage and the final
norm and LM head to the last. When the checkpoint size is known (``--weights-bytes``, the
safetensors index, the weight files) it is split in those proportions; otherwise the size
is estimated from the config's parameter count and the quantization. Weight quantization
changes these bytes only: it never changes the KV bytes per token.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.capacity.arch import DTYPE_BYTES, LayerKind, LayerKV, ModelArch
from exporter.capacity.kvcache import pp_partition


@dataclass(frozen=True)
class LayerParams:
    attention: int  # q, k, v, o projections (or MLA's low-rank factors)
    mlp: int  # dense MLP, or shared experts + router
    norms: int
    experts: int = 0  # the routed experts of an MoE layer


@dataclass(frozen=True)
class ParamCount:
    """Parameters by place, so a checkpoint can be split as vLLM loads it."""

    embed: int
    lm_head: int
    layers: tuple[LayerParams, ...]
    final_norm: int
    vision: int = 0  # a vision tower, loaded with the first stage
    expert_share: float = 1.0  # the share of routed experts one token is sent to

    @property
    def total(self) -> int:
        body = sum(p.attention + p.mlp + p.norms + p.experts for p in self.layers)
        return self.embed + self.lm_head + body + self.final_norm + self.vision

    @property
    def active(self) -> int:
        """The parameters one text token passes through: of the routed experts only those
        it is sent to, and not the vision tower."""
        routed = sum(p.experts for p in self.layers)
        return round(self.total - self.vision - routed * (1.0 - self.expert_share))


def count_params(arch: ModelArch) -> ParamCount | None:
    """The parameter count from the config, or None if the config lacks the sizes.

    Needs hidden_size, intermediate_size (or MoE sizes), vocab_size and the head counts;
    catalogue entries derived from logs often lack them.
    """
    h, vocab, heads = arch.hidden_size, arch.vocab_size, arch.num_attention_heads
    if not h or not vocab or not heads:
        return None
    if arch.moe is None and not arch.intermediate_size:
        return None
    layers = []
    for i, layer in enumerate(arch.layers):
        mlp, experts = _mlp_params(arch, i, h)
        if arch.double_wide_mlp and layer.kv_shared:
            mlp *= 2  # Gemma 4: the KV-shared layers' MLP is twice as wide
        layers.append(LayerParams(_attention_params(arch, layer, h, heads), mlp, 2 * h, experts))
    embed = vocab * h + arch.per_layer_embed_params
    lm_head = 0 if arch.tie_word_embeddings else embed
    share = arch.moe.experts_per_token / arch.moe.num_experts if arch.moe else 1.0
    return ParamCount(embed, lm_head, tuple(layers), h, arch.vision_params, min(1.0, share))


def _attention_params(arch: ModelArch, layer: LayerKV, h: int, heads: int) -> int:
    if layer.kind is LayerKind.MAMBA:
        # In-projection, out-projection and the small conv/ssm parameters of a Mamba mixer,
        # at the usual expand of 2: about 6·h² (its state is counted in the KV pool).
        return 6 * h * h
    mla = arch.mla
    if mla is not None:
        qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        q = (
            h * mla.q_lora_rank + mla.q_lora_rank * heads * qk
            if mla.q_lora_rank
            else h * heads * qk
        )
        kv_a = h * (mla.kv_lora_rank + mla.qk_rope_head_dim)
        kv_b = mla.kv_lora_rank * heads * (mla.qk_nope_head_dim + mla.v_head_dim)
        return q + kv_a + kv_b + heads * mla.v_head_dim * h
    hd = layer.head_size
    return h * heads * hd + 2 * h * layer.num_kv_heads * hd + heads * hd * h


def _mlp_params(arch: ModelArch, index: int, h: int) -> tuple[int, int]:
    """(dense MLP or shared experts + router, routed experts) of one layer."""
    moe = arch.moe
    dense = 3 * h * (arch.intermediate_size or 0)  # gate, up and down projections
    if moe is None or index < moe.dense_layers:
        return dense, 0
    experts = moe.num_experts * 3 * h * moe.expert_intermediate_size
    return 3 * h * moe.shared_intermediate_size + h * moe.num_experts, experts


@dataclass(frozen=True)
class WeightBytes:
    """Loaded bytes by place (embedding and norms at the model dtype, linears quantized)."""

    embed: int
    lm_head: int
    layers: tuple[int, ...]
    final_norm: int
    vision: int = 0

    @property
    def total(self) -> int:
        return self.embed + self.lm_head + sum(self.layers) + self.final_norm + self.vision


# MXFP4 keeps one 8-bit E8M0 scale per 32 values. Without native FP4 (before Blackwell) and
# not on Marlin (``_marlin_padding``), the Triton path loads more than 4.25 bits a weight:
# gpt-oss-120b on one H100 loads 64.38 GiB under vLLM 0.14.1 (issue 33155) against 60.7
# GiB at 4.25 bits, which 4.5 bits a weight (scales held at 16 bits) matches; a figure
# from that one start, not from the kernel's code.
_MXFP4_UPCAST_BITS = 4.0 + 16.0 / 32


def _marlin_padding(arch: ModelArch, tp: int) -> float:
    """How much larger the MXFP4 experts load for Marlin: vLLM's ``Mxfp4MoEMethod.
    create_weights`` (vllm/model_executor/layers/quantization/mxfp4.py) pads each TP
    partition's expert intermediate size to a multiple of 128 and the hidden size to a
    multiple of 256 ("the moe marlin kernel requires that for each linear n % 256 == 0 and
    k % 128 == 0"), its uint8 E8M0 scales staying 8-bit (4.25 bits a weight). gpt-oss-120b
    (2,880 → 2,944 and 3,072): 65.82 GiB on one GPU, where an H100 under 0.10.1 loaded
    65.97 (issue 23278); 17.13 GiB a GPU at TP 4 (720 → 768), where A100s under 0.10.1.1
    loaded 17.22 (tests/fixtures/sizing, dennislee22/vLLM-benchmarking)."""
    moe, h = arch.moe, arch.hidden_size or 0
    if moe is None or not h or not moe.expert_intermediate_size:
        return 1.0
    inter = moe.expert_intermediate_size
    part = -(-(inter // tp) // 128) * 128
    hidden = -(-h // 256) * 256
    return (part * tp * hidden) / (inter * h)


def weight_bytes(
    arch: ModelArch,
    params: ParamCount,
    dtype: str,
    quantization: str | None,
    *,
    native_fp4: bool = True,
    marlin_tp: int = 0,
) -> WeightBytes:
    """Bytes per place. ``quantization`` is vLLM's ``--quantization`` (online, e.g. fp8);
    without it the config's ``quantization_config`` decides. ``native_fp4``: the GPU
    computes in FP4 (Blackwell), so MX scales stay 8-bit. ``marlin_tp``: MXFP4 experts
    load for the Marlin kernel (``Release.mxfp4_marlin_on``) at this TP size, padded as
    ``_marlin_padding`` says; 0 otherwise."""
    dt = DTYPE_BYTES[dtype]
    bits = float(dt * 8)
    q = arch.quantization
    expert_scale = 1.0
    if quantization in ("fp8", "fbgemm_fp8", "ptpc_fp8"):
        bits = 8.0
    elif q is not None and q.weight_bits < bits:
        bits = q.weight_bits
        if q.method == "mxfp4" and marlin_tp > 0:
            expert_scale = _marlin_padding(arch, marlin_tp)
        elif q.method == "mxfp4" and not native_fp4:
            bits = _MXFP4_UPCAST_BITS
    # An experts-only scheme (gpt-oss mxfp4, Kimi-K2.5 int4) keeps attention, dense MLPs
    # and shared experts in the model dtype; quantizing a dense model, all of them count.
    rest_bits = dt * 8 if q is not None and q.experts_only else bits
    layers = tuple(
        int((p.attention + p.mlp) * rest_bits / 8 + p.experts * expert_scale * bits / 8)
        + p.norms * dt
        for p in params.layers
    )
    return WeightBytes(
        params.embed * dt, params.lm_head * dt, layers, params.final_norm * dt, params.vision * dt
    )


def estimate_weights_bytes(
    arch: ModelArch,
    dtype: str,
    quantization: str | None,
    *,
    native_fp4: bool = True,
    marlin_tp: int = 0,
) -> int | None:
    """The whole checkpoint as vLLM loads it, from the config; None when sizes are missing."""
    params = count_params(arch)
    if params is None:
        return None
    return weight_bytes(
        arch, params, dtype, quantization, native_fp4=native_fp4, marlin_tp=marlin_tp
    ).total


# Model types that place tokens without rotary embeddings (learned positions or ALiBi).
_NO_ROPE = frozenset({"opt", "gpt2", "gpt_bigcode", "bloom", "mpt", "jais"})


def rotary_cache_bytes(arch: ModelArch) -> int:
    """The rotary embedding's cos/sin table every GPU holds beside the weights.

    vLLM's ``RotaryEmbedding`` (vllm/model_executor/layers/rotary_embedding) computes the
    cos and sin of every position up to the model's longest context once, casts the table
    (positions × rotary dims) to the model dtype and registers it as a non-persistent
    buffer: not in the checkpoint, not sharded over TP, created with the model and so in
    "Model loading took". ``get_rope`` shares one instance across the layers. Printed
    weights agree: Llama-3.1-8B 14.99 GiB = 14.958 + 0.031 (131,072 positions × 128 × 2 B;
    issue 10517), Llama-3.2-3B 6.016 = 5.984 + 0.031, Qwen3-14B 27.52 = 27.508 + 0.010.
    The length is the config's (YaRN and llama3 scaling included); one table a model
    (Gemma 3's local and global pair count once).
    """
    if arch.model_type in _NO_ROPE or not arch.attention_layers or not arch.max_model_len:
        return 0
    if arch.mla is not None:
        dims = arch.mla.qk_rope_head_dim
    else:
        dims = int(arch.attention_layers[0].head_size * arch.partial_rotary_factor)
    return arch.max_model_len * dims * DTYPE_BYTES[arch.dtype]


def stage_weight_bytes(
    arch: ModelArch,
    total_bytes: int,
    *,
    tp: int,
    pp: int,
    dtype: str,
    quantization: str | None,
    native_fp4: bool = True,
    marlin_tp: int = 0,
) -> tuple[int, ...]:
    """Bytes each GPU of each PP stage loads: ``total_bytes`` split as vLLM places it.

    With PP and tied embeddings the last stage holds its own copy of the embedding as the
    LM head, so the stages together load more than the checkpoint. Without a parameter
    breakdown the split is by layer count alone.
    """
    stages = pp_partition(arch.num_layers, pp)
    params = count_params(arch)
    if params is None:
        return tuple(total_bytes * len(r) // (arch.num_layers * tp) for r in stages)
    wb = weight_bytes(arch, params, dtype, quantization, native_fp4=native_fp4, marlin_tp=marlin_tp)
    scale = total_bytes / wb.total
    if pp == 1:
        return (total_bytes // tp,)
    out = []
    for s, held in enumerate(stages):
        share = sum(wb.layers[i] for i in held)
        if s == 0:
            share += wb.embed + wb.vision
        if s == pp - 1:
            share += wb.final_norm + (wb.lm_head or wb.embed)
        out.append(int(share * scale) // tp)
    return tuple(out)
