"""A Hugging Face ``config.json`` → the model's KV layout, layer by layer.

vLLM decides per layer what kind of KV cache it keeps (vllm/v1/kv_cache_interface.py) and
this module reproduces that decision from the config alone: full attention (MHA/GQA/MQA),
sliding window, chunked local attention (Llama 4), MLA (DeepSeek), and the constant-size
state of Mamba / linear-attention layers in hybrid models. Pure: a dict in, a frozen
``ModelArch`` out; bad or missing keys raise ``InputError`` naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from exporter.errors import InputError


class LayerKind(StrEnum):
    FULL = "full"
    SLIDING = "sliding"
    CHUNKED = "chunked"
    MLA = "mla"
    MAMBA = "mamba"  # any constant-size recurrent state: Mamba1/2, GDN, linear attention


class AttentionKind(StrEnum):
    """What the model is, in one word, for the ``info`` metric and the plan header."""

    MHA = "mha"
    GQA = "gqa"
    MQA = "mqa"
    MLA = "mla"
    SLIDING = "sliding_window"
    HYBRID_SLIDING = "hybrid_sliding"  # sliding + full layers, several KV groups
    CHUNKED = "hybrid_chunked"  # chunked local + full (Llama 4)
    HYBRID_MAMBA = "hybrid_mamba"  # attention + Mamba/linear attention


@dataclass(frozen=True)
class StateShape:
    """A recurrent layer's per-sequence state, as element counts before TP sharding.

    ``conv`` and ``ssm`` are the two tensors vLLM keeps; both are split by heads across
    TP ranks.
    """

    conv_elems: int
    ssm_elems: int
    gated_delta: bool = False  # a Gated DeltaNet layer (Qwen3-Next, Qwen3.5)
    mamba2: bool = False  # a Mamba2 mixer (Nemotron-H, Granite-4, Bamba, Zamba2, Falcon-H1)


@dataclass(frozen=True)
class LayerKV:
    """One decoder layer's KV cache, before tensor parallelism."""

    kind: LayerKind
    num_kv_heads: int = 0  # total KV heads; MLA: 1 latent "head"
    head_size: int = 0  # K head size (MLA: kv_lora_rank + qk_rope_head_dim)
    head_size_v: int = 0  # V head size (MLA: 0, no separate V)
    window: int | None = None  # sliding window W or attention chunk C, in tokens
    state: StateShape | None = None  # MAMBA only
    # Reads an earlier layer's KV cache and keeps none (Gemma 4's num_kv_shared_layers:
    # vLLM's Attention with a kv_sharing_target_layer_name gets no KV cache spec).
    kv_shared: bool = False

    def bytes_per_token(self, tp: int, dtype_bytes: float) -> int:
        """Bytes one token costs in this layer on one GPU (0 for constant-size state)."""
        if self.kind is LayerKind.MAMBA or self.kv_shared:
            return 0
        return int(kv_heads_per_gpu(self, tp) * (self.head_size + self.head_size_v) * dtype_bytes)


def kv_heads_per_gpu(layer: LayerKV, tp: int) -> int:
    """KV heads one TP rank holds: ``max(1, heads // tp)``; MLA's latent is never sharded.

    When TP exceeds the KV heads each rank keeps one replicated head
    (vllm/config/model.py::get_num_kv_heads), so per-GPU bytes stop shrinking.
    """
    if layer.kind is LayerKind.MLA:
        return 1
    return max(1, layer.num_kv_heads // tp)


@dataclass(frozen=True)
class Quantization:
    method: str  # quant_method as the config spells it, lower case
    weight_bits: float  # bits per quantized weight, scales included
    experts_only: bool = False  # mxfp4 in gpt-oss quantizes only the MoE experts
    kv_cache_bits: int | None = None  # llm-compressor kv_cache_scheme, if any


@dataclass(frozen=True)
class ModelArch:
    """Everything the capacity engine needs to know about a model."""

    origin: str  # where it came from, for messages
    model_type: str
    architectures: tuple[str, ...]
    layers: tuple[LayerKV, ...]
    dtype: str  # serving dtype vLLM picks with --dtype auto
    config_dtype: str | None  # what the config says, if anything
    num_attention_heads: int | None
    hidden_size: int | None
    intermediate_size: int | None
    vocab_size: int | None
    tie_word_embeddings: bool
    max_model_len: int | None  # the longest context the config allows, as vLLM derives it
    moe: MoE | None
    mla: MLADims | None
    quantization: Quantization | None
    vision_params: int = 0  # a multimodal model's vision tower, loaded with it
    vision_profile_elems: int = 0  # patches of the largest image × the tower's MLP width
    vision_item_tokens: int = 0  # the language model's tokens for that image
    # What the profile run holds of that image while the language model runs (plan.
    # _encoder_profile): the encoder's output per token (its width into the language
    # model, deepstack levels included) and the image's pixel values (elements).
    vision_output_width: int = 0
    vision_input_elems: int = 0
    # A dynamic-resolution tower's (patch_size, spatial_merge_size, MLP width): the largest
    # image follows the processor's max_pixels (deploy_flags.image_at_max_pixels).
    dynamic_vision: tuple[int, int, int] | None = None
    # The modality the encoder profile encodes (the one with the most tokens per item) and,
    # where that is not an image, the largest image's (tokens, profile elems) for a start
    # whose --limit-mm-per-prompt allows none of it (deploy_flags.profiled_modality).
    vision_profile_modality: str = "image"
    vision_image_item: tuple[int, int] | None = None
    mtp_layers: int = 0  # multi-token-prediction modules the checkpoint ships
    partial_rotary_factor: float = 1.0  # share of each head's dims that take RoPE
    final_logit_softcapping: float | None = None  # Gemma 2: one more logits copy when sampling
    # The recurrent SSM state's dtype as the config asks for it, which vLLM applies per
    # architecture and release (plan._state_dtypes): Qwen3.5's text_config.mamba_ssm_dtype
    # and Nemotron-H's mamba_ssm_cache_dtype.
    mamba_ssm_dtype: str | None = None
    mamba_ssm_cache_dtype: str | None = None
    # Gemma 4's per-layer embeddings (vocab_size_per_layer_input × layers ×
    # hidden_size_per_layer_input, an embedding table) and its double-wide MLP on the
    # KV-shared layers (use_double_wide_mlp: model_executor/models/gemma4.py).
    per_layer_embed_params: int = 0
    double_wide_mlp: bool = False
    approximate: tuple[str, ...] = ()  # why the sizing is not exact, if it is not
    notes: tuple[str, ...] = ()

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def gated_delta(self) -> bool:
        """A layer keeps a Gated DeltaNet state (Qwen3-Next, Qwen3.5)."""
        return any(x.state is not None and x.state.gated_delta for x in self.layers)

    @property
    def attention_kind(self) -> AttentionKind:
        kinds = {layer.kind for layer in self.layers}
        if LayerKind.MAMBA in kinds:
            return AttentionKind.HYBRID_MAMBA
        if LayerKind.MLA in kinds:
            return AttentionKind.MLA
        if LayerKind.CHUNKED in kinds:
            return AttentionKind.CHUNKED
        if kinds == {LayerKind.SLIDING}:
            return AttentionKind.SLIDING
        if LayerKind.SLIDING in kinds:
            return AttentionKind.HYBRID_SLIDING
        kv = self.layers[0].num_kv_heads
        if kv == 1:
            return AttentionKind.MQA
        if self.num_attention_heads is not None and kv == self.num_attention_heads:
            return AttentionKind.MHA
        return AttentionKind.GQA

    @property
    def attention_layers(self) -> tuple[LayerKV, ...]:
        return tuple(layer for layer in self.layers if layer.kind is not LayerKind.MAMBA)


@dataclass(frozen=True)
class MoE:
    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    shared_intermediate_size: int  # 0 when there are no shared experts
    dense_layers: int  # leading layers with a dense MLP instead (DeepSeek first_k_dense_replace)


@dataclass(frozen=True)
class MLADims:
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None


# --- reading keys ---------------------------------------------------------------------------


@dataclass
class _Reader:
    """Typed access to a config dict that reports the exact key on error."""

    cfg: Mapping[str, Any]
    origin: str
    prefix: str = ""

    def path(self, key: str) -> str:
        return f"{self.prefix}{key}"

    def has(self, key: str) -> bool:
        return self.cfg.get(key) is not None

    def raw(self, key: str) -> Any:
        return self.cfg.get(key)

    def int_(self, *keys: str, required: bool = False, positive: bool = True) -> int | None:
        """The first of ``keys`` that is set, as an int; ``required`` names the first key."""
        for key in keys:
            value = self.cfg.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InputError(self.origin, self.path(key), value, "must be an integer")
            if isinstance(value, float) and not value.is_integer():
                raise InputError(self.origin, self.path(key), value, "must be an integer")
            if positive and value <= 0:
                raise InputError(self.origin, self.path(key), value, "must be greater than 0")
            return int(value)
        if required:
            names = " or ".join(self.path(k) for k in keys)
            raise InputError(self.origin, names, None, "is required to size the KV cache")
        return None

    def bool_(self, key: str, default: bool) -> bool:
        value = self.cfg.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise InputError(self.origin, self.path(key), value, "must be true or false")
        return value

    def str_(self, key: str) -> str | None:
        value = self.cfg.get(key)
        if value is None:
            return None
        if not isinstance(value, str):
            raise InputError(self.origin, self.path(key), value, "must be a string")
        return value


_DTYPES = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
}

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def serving_dtype(config_dtype: str | None, requested: str, where: str = "--dtype") -> str:
    """The dtype vLLM runs the model in (vllm/config/model.py::_get_and_verify_dtype).

    ``auto`` keeps a 16-bit config dtype and turns float32 (or a missing dtype, which
    transformers reads as float32) into bfloat16; anything else is taken as asked.
    """
    if requested == "auto":
        if config_dtype in (None, "float32"):
            return "bfloat16"
        return config_dtype
    dtype = _DTYPES.get(requested.lower())
    if dtype is None:
        raise InputError(where, "", requested, "use auto, bfloat16, float16 or float32")
    return dtype


_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
_HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads")
_HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model")
_KV_HEAD_KEYS = ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num")
_LEN_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)

# transformers' config defaults for keys a config may omit (only where vLLM relies on them).
_MODEL_DEFAULTS: dict[str, dict[str, object]] = {
    "gemma3_text": {
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "sliding_window": 4096,
        "sliding_window_pattern": 6,
        "max_position_embeddings": 131072,
        "vocab_size": 262208,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "tie_word_embeddings": True,
    },
    "gemma2": {
        "head_dim": 256,
        "sliding_window": 4096,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,  # Gemma ties its LM head to the embedding
    },
    "llama4_text": {
        "attention_chunk_size": 8192,
        "no_rope_layer_interval": 4,
        "max_position_embeddings": 4096 * 32,
    },
    "gpt_oss": {"sliding_window": 128, "head_dim": 64},
}

_MLA_MODEL_TYPES = frozenset(
    {
        "deepseek_v2",
        "deepseek_v3",
        "deepseek_v32",
        "deepseek_mtp",
        "kimi_k2",
        "kimi_vl",
        "kimi_linear",
        "longcat_flash",
        "pangu_ultra_moe",
        "glm4_moe_lite",
        "glm_moe_dsa",  # GLM-5: DeepSeek-V3.2-style MLA with a sparse-attention indexer
        "mistral_large_3",
    }
)


def with_hf_quant_config(
    config: Mapping[str, Any], hf_quant_config: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The config vLLM serves: a ModelOpt ``hf_quant_config.json`` (ModelOpt 0.29 and before
    keep the quantization there) becomes ``quantization_config`` when config.json has none
    (vllm/transformers_utils/config.py::get_config)."""
    if hf_quant_config is None or config.get("quantization_config") is not None:
        return dict(config)
    return {**config, "quantization_config": dict(hf_quant_config)}


def text_config(config: Mapping[str, Any], origin: str) -> tuple[Mapping[str, Any], str]:
    """The language model's config: ``text_config`` (or ``llm_config``) of a multimodal model.

    Top-level keys vLLM reads from the outer config (dtype, quantization) are kept when the
    inner one lacks them.
    """
    for key in ("text_config", "llm_config", "language_config"):
        inner = config.get(key)
        if inner is None:
            continue
        if not isinstance(inner, Mapping):
            raise InputError(origin, key, type(inner).__name__, "must be an object")
        merged = dict(inner)
        for outer_key in ("torch_dtype", "dtype", "quantization_config", "tie_word_embeddings"):
            if outer_key in config and outer_key not in merged:
                merged[outer_key] = config[outer_key]
        if "model_type" not in merged and isinstance(config.get("model_type"), str):
            merged["model_type"] = f"{config['model_type']}_text"
        return merged, f"{key}."
    return config, ""


def parse_config(
    config: Mapping[str, Any], origin: str, *, dtype: str = "auto", name: str | None = None
) -> ModelArch:
    """Read a Hugging Face config into the KV layout vLLM would build for it."""
    if not isinstance(config, Mapping):
        raise InputError(origin, "", type(config).__name__, "a config.json must be a JSON object")
    inner, prefix = text_config(config, origin)
    architectures = tuple(str(a) for a in (config.get("architectures") or ()))
    model_type = str(inner.get("model_type") or config.get("model_type") or "")
    defaults = _MODEL_DEFAULTS.get(model_type, {})
    cfg = {**defaults, **{k: v for k, v in inner.items() if v is not None}}
    r = _Reader(cfg, origin, prefix)

    num_layers = r.int_(*_LAYER_KEYS, required=True)
    assert num_layers is not None
    num_heads = r.int_(*_HEAD_KEYS)
    hidden = r.int_(*_HIDDEN_KEYS)
    approximate: list[str] = []
    notes: list[str] = []

    config_dtype_raw = r.str_("torch_dtype") or r.str_("dtype")
    config_dtype = _DTYPES.get(config_dtype_raw.lower()) if config_dtype_raw else None
    if config_dtype_raw and config_dtype is None:
        raise InputError(origin, r.path("torch_dtype"), config_dtype_raw, "unknown dtype")
    run_dtype = serving_dtype(config_dtype, dtype)

    mla = _mla_dims(r, model_type, architectures)
    head_size = _head_size(r, num_heads, hidden)
    kv_heads = 1 if mla is not None else _kv_heads(r, num_heads)
    if num_heads is not None and kv_heads > num_heads:
        raise InputError(
            origin,
            r.path("num_key_value_heads"),
            kv_heads,
            f"is larger than num_attention_heads ({num_heads}); the config contradicts itself",
        )
    if num_heads is not None and kv_heads and num_heads % kv_heads:
        raise InputError(
            origin,
            r.path("num_key_value_heads"),
            kv_heads,
            f"does not divide num_attention_heads ({num_heads}); GQA needs whole groups",
        )

    kinds = _layer_kinds(r, model_type, num_layers, approximate, notes)
    if isinstance(config.get("audio_config"), Mapping):
        approximate.append(
            "the audio tower (audio_config) is not in the weights estimate: pass --weights-bytes"
        )
    if mla is not None and r.has("index_topk"):
        approximate.append(
            "sparse attention (DSA): the indexer's own key cache (about index_head_dim bytes per "
            "token per layer) is not counted"
        )
    layers: list[LayerKV] = []
    # Gemma 4 (vllm/transformers_utils/configs/gemma4.py::gemma4_layer_config, 0.28): full
    # attention layers take global_head_dim and, with attention_k_eq_v, the global KV
    # heads; the last num_kv_shared_layers layers read the KV of the last earlier layer
    # of their type (model_executor/models/gemma4.py::Gemma4Attention) and keep none.
    global_head = r.int_("global_head_dim")
    global_kv = r.int_("num_global_key_value_heads") if r.bool_("attention_k_eq_v", False) else None
    shared_from = num_layers - (r.int_("num_kv_shared_layers", positive=False) or 0)
    if shared_from < num_layers and len(kinds) != num_layers:
        raise InputError(
            origin,
            r.path("num_kv_shared_layers"),
            num_layers - shared_from,
            "KV sharing is modelled only where every layer is an attention layer",
        )
    for i, (kind, window) in enumerate(kinds):
        if kind is LayerKind.MAMBA:
            layers.append(LayerKV(LayerKind.MAMBA, state=_state_shape(r, hidden, approximate)))
        elif mla is not None:
            layers.append(
                LayerKV(LayerKind.MLA, 1, mla.kv_lora_rank + mla.qk_rope_head_dim, 0, None)
            )
        else:
            if head_size is None:
                raise InputError(
                    origin,
                    r.path("head_dim"),
                    None,
                    "is needed (or hidden_size and num_attention_heads to derive it)",
                )
            size, heads = head_size, kv_heads
            if kind is LayerKind.FULL:
                size, heads = global_head or head_size, global_kv or kv_heads
            layers.append(LayerKV(kind, heads, size, size, window, kv_shared=i >= shared_from))

    return ModelArch(
        origin=name or origin,
        model_type=model_type,
        architectures=architectures,
        layers=tuple(layers),
        dtype=run_dtype,
        config_dtype=config_dtype,
        num_attention_heads=num_heads,
        hidden_size=hidden,
        intermediate_size=r.int_("intermediate_size", "ffn_hidden_size", "n_inner"),
        vocab_size=r.int_("vocab_size", "padded_vocab_size"),
        tie_word_embeddings=r.bool_("tie_word_embeddings", False),
        max_model_len=_max_model_len(r),
        moe=_moe(r),
        mla=mla,
        quantization=_quantization(config, inner, origin),
        per_layer_embed_params=(r.int_("vocab_size_per_layer_input") or 0)
        * num_layers
        * (r.int_("hidden_size_per_layer_input", positive=False) or 0),
        double_wide_mlp=r.bool_("use_double_wide_mlp", False),
        mamba_ssm_dtype=_state_dtype(r, "mamba_ssm_dtype"),
        mamba_ssm_cache_dtype=_state_dtype(r, "mamba_ssm_cache_dtype"),
        vision_params=vision_params(config),
        vision_profile_elems=vision_profile_elems(config),
        vision_item_tokens=vision_item_tokens(config),
        vision_output_width=vision_output_width(config, hidden),
        vision_input_elems=vision_input_elems(config),
        dynamic_vision=dynamic_vision(config),
        vision_profile_modality="video" if _gemma4_video(config) else "image",
        vision_image_item=_gemma4_image(config),
        mtp_layers=mtp_layers(config),
        partial_rotary_factor=_rotary_factor(r),
        final_logit_softcapping=_softcap(r),
        approximate=tuple(dict.fromkeys(approximate)),
        notes=tuple(dict.fromkeys(notes)),
    )


def _head_size(r: _Reader, num_heads: int | None, hidden: int | None) -> int | None:
    """``head_dim`` if set and > 0, else ``hidden_size_per_head``, else hidden // heads."""
    value = r.raw("head_dim")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    per_head = r.int_("hidden_size_per_head")
    if per_head is not None:
        return per_head
    if num_heads and hidden:
        if hidden % num_heads:
            raise InputError(
                r.origin,
                r.path("hidden_size"),
                hidden,
                f"is not a multiple of num_attention_heads ({num_heads}) and head_dim is not set",
            )
        return hidden // num_heads
    return None


def _kv_heads(r: _Reader, num_heads: int | None) -> int:
    """vllm/config/model.py::get_total_num_kv_heads, for the keys configs use."""
    if r.bool_("multi_query", False) and not r.bool_("new_decoder_architecture", False):
        return 1  # Falcon-7B style MQA
    attn_config = r.raw("attn_config")
    if isinstance(attn_config, Mapping) and attn_config.get("kv_n_heads") is not None:
        sub = _Reader(attn_config, r.origin, r.path("attn_config."))
        value = sub.int_("kv_n_heads", required=True)
        assert value is not None
        return value
    kv = r.int_(*_KV_HEAD_KEYS)
    if kv is not None:
        return kv
    if num_heads is not None:
        return num_heads
    raise InputError(
        r.origin,
        r.path("num_key_value_heads"),
        None,
        "is required (or num_attention_heads, for multi-head attention)",
    )


def _mla_dims(r: _Reader, model_type: str, architectures: Sequence[str]) -> MLADims | None:
    if not r.has("kv_lora_rank"):
        return None
    if model_type not in _MLA_MODEL_TYPES and not any("Deepseek" in a for a in architectures):
        return None
    kv_lora_rank = r.int_("kv_lora_rank", required=True)
    rope = r.int_("qk_rope_head_dim", required=True)
    assert kv_lora_rank is not None
    assert rope is not None
    return MLADims(
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=rope,
        qk_nope_head_dim=r.int_("qk_nope_head_dim") or 0,
        v_head_dim=r.int_("v_head_dim") or 0,
        q_lora_rank=r.int_("q_lora_rank"),
    )


_WINDOWED = {"sliding_attention": LayerKind.SLIDING, "chunked_attention": LayerKind.CHUNKED}
_RECURRENT = ("mamba", "linear_attention", "conv", "gated_delta", "lightning", "ssm")


def _layer_kinds(
    r: _Reader, model_type: str, num_layers: int, approximate: list[str], notes: list[str]
) -> list[tuple[LayerKind, int | None]]:
    """Per layer: which spec vLLM gives it, and its window or chunk size."""
    window = r.int_("sliding_window")
    chunk = r.int_("attention_chunk_size")
    full: tuple[LayerKind, int | None] = (LayerKind.FULL, None)

    # Qwen2-family configs carry a sliding_window that is off unless use_sliding_window.
    if r.raw("use_sliding_window") is False:
        window = None

    types = _explicit_layer_types(r, num_layers)
    if types is None:
        types = _implied_layer_types(r, model_type, num_layers, window, chunk, notes)

    kinds: list[tuple[LayerKind, int | None]] = []
    for i, t in enumerate(types):
        name = t.lower()
        if name in ("full_attention", "attention", "global", "full"):
            kinds.append(full)
        elif name == "sliding_attention":
            if window is None:
                raise InputError(
                    r.origin,
                    r.path(f"layer_types[{i}]"),
                    t,
                    "names a sliding layer but sliding_window is not set",
                )
            kinds.append((LayerKind.SLIDING, window))
        elif name == "chunked_attention":
            if chunk is None:
                raise InputError(
                    r.origin,
                    r.path(f"layer_types[{i}]"),
                    t,
                    "names a chunked layer but attention_chunk_size is not set",
                )
            kinds.append((LayerKind.CHUNKED, chunk))
        elif any(tag in name for tag in _RECURRENT):
            kinds.append((LayerKind.MAMBA, None))
        elif name in ("mlp", "moe", "-", "e"):
            continue  # a block without attention or state keeps no cache
        else:
            raise InputError(
                r.origin,
                r.path(f"layer_types[{i}]"),
                t,
                "is not a layer type this planner knows (full_attention, sliding_attention, "
                "chunked_attention, mamba, linear_attention)",
            )
    if any(k is LayerKind.MAMBA for k, _ in kinds):
        approximate.append(
            "hybrid attention + recurrent (Mamba/linear-attention) model: the state page and "
            "vLLM's attention block-size alignment are modelled, kernel alignment is not"
        )
    if not kinds:
        raise InputError(r.origin, r.path("layer_types"), None, "no layer keeps a KV cache")
    return kinds


def _explicit_layer_types(r: _Reader, num_layers: int) -> list[str] | None:
    for key in ("layer_types", "layers_block_type"):
        value = r.raw(key)
        if value is None:
            continue
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise InputError(r.origin, r.path(key), value, "must be a list of layer type names")
        if len(value) != num_layers:
            raise InputError(
                r.origin,
                r.path(key),
                f"{len(value)} entries",
                f"must have one entry per layer (num_hidden_layers = {num_layers})",
            )
        return list(value)
    pattern = r.raw("hybrid_override_pattern")  # Nemotron-H: M = Mamba, * = attention
    if pattern is not None:
        if not isinstance(pattern, str):
            raise InputError(r.origin, r.path("hybrid_override_pattern"), pattern, "not a string")
        names = {"M": "mamba", "*": "full_attention", "-": "mlp", "E": "moe"}
        out = []
        for i, c in enumerate(pattern):
            if c not in names:
                raise InputError(
                    r.origin,
                    r.path(f"hybrid_override_pattern[{i}]"),
                    c,
                    "unknown block; expected M, *, - or E",
                )
            out.append(names[c])
        return out
    return None


def _implied_layer_types(
    r: _Reader,
    model_type: str,
    num_layers: int,
    window: int | None,
    chunk: int | None,
    notes: list[str],
) -> list[str]:
    """Layer types transformers derives when the config does not list them."""
    full, sliding = "full_attention", "sliding_attention"
    interval = r.int_("full_attention_interval")  # Qwen3-Next: every Nth layer is attention
    if interval is not None:
        return [full if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers)]
    period = r.int_("attn_layer_period")  # Jamba: attention every period, at offset
    if period is not None:
        offset = r.int_("attn_layer_offset", positive=False) or 0
        return [full if i % period == offset else "mamba" for i in range(num_layers)]
    if chunk is not None and model_type.startswith("llama4"):
        no_rope = r.raw("no_rope_layers")
        if isinstance(no_rope, list) and len(no_rope) == num_layers:
            return [_llama4_layer(uses_rope=bool(flag)) for flag in no_rope]
        every = r.int_("no_rope_layer_interval") or 4
        return ["chunked_attention" if (i + 1) % every else full for i in range(num_layers)]
    if window is None:
        return [full] * num_layers
    if model_type in ("gemma2", "gpt_oss"):
        return [sliding if i % 2 == 0 else full for i in range(num_layers)]
    if model_type in ("gemma3", "gemma3_text", "cohere2"):
        default = 6 if model_type != "cohere2" else 4
        pattern = r.int_("sliding_window_pattern") or default
        return [sliding if (i + 1) % pattern else full for i in range(num_layers)]
    if model_type.startswith(("qwen2", "qwen3")):
        first = r.int_("max_window_layers", positive=False)
        first = num_layers if first is None else first
        return [sliding if i >= first else full for i in range(num_layers)]
    notes.append(
        f"sliding_window = {window} on every layer: vLLM keeps a window per layer "
        "(one sliding-window group)"
    )
    return [sliding] * num_layers


def _llama4_layer(*, uses_rope: bool) -> str:
    """Llama 4's ``no_rope_layers``: 1 marks a RoPE layer (chunked), 0 a NoPE layer (full)."""
    return "chunked_attention" if uses_rope else "full_attention"


_STATE_DTYPES = ("float32", "float16", "bfloat16")


def _state_dtype(r: _Reader, key: str) -> str | None:
    value = r.str_(key)
    if value is not None and value not in _STATE_DTYPES:
        raise InputError(r.origin, r.path(key), value, f"must be one of {', '.join(_STATE_DTYPES)}")
    return value


def _state_shape(r: _Reader, hidden: int | None, approximate: list[str]) -> StateShape:
    """Per-sequence recurrent state, by family (the shapes vLLM's model classes declare)."""
    # Gated DeltaNet (Qwen3-Next, Qwen3.5): conv over q, k, v; state per value head.
    if r.has("linear_num_value_heads"):
        k_heads = r.int_("linear_num_key_heads", required=True) or 0
        v_heads = r.int_("linear_num_value_heads", required=True) or 0
        k_dim = r.int_("linear_key_head_dim", required=True) or 0
        v_dim = r.int_("linear_value_head_dim", required=True) or 0
        kernel = r.int_("linear_conv_kernel_dim") or 4
        conv_dim = 2 * k_heads * k_dim + v_heads * v_dim
        return StateShape((kernel - 1) * conv_dim, v_heads * k_dim * v_dim, gated_delta=True)
    # Mamba2 (Nemotron-H, Granite-4, Bamba, Zamba2, Falcon-H1).
    if r.has("mamba_n_heads") or r.has("mamba_num_heads") or r.has("ssm_state_size"):
        state = r.int_("ssm_state_size", "mamba_d_state", "state_size", required=True) or 0
        n_heads = r.int_("mamba_n_heads", "mamba_num_heads")
        head_dim = r.int_("mamba_head_dim", "mamba_d_head")
        groups = r.int_("n_groups", "mamba_n_groups") or 1
        kernel = r.int_("conv_kernel", "mamba_d_conv") or 4
        if n_heads and head_dim:
            inner = n_heads * head_dim
        else:
            expand = r.int_("mamba_expand", "expand") or 2
            inner = expand * (hidden or 0)
            head_dim = head_dim or 64
            n_heads = inner // head_dim
        conv_dim = inner + 2 * groups * state
        return StateShape((kernel - 1) * conv_dim, n_heads * head_dim * state, mamba2=True)
    # Mamba1 (Jamba).
    if r.has("mamba_d_state"):
        state = r.int_("mamba_d_state", required=True) or 0
        expand = r.int_("mamba_expand") or 2
        kernel = r.int_("mamba_d_conv") or 4
        inner = expand * (hidden or 0)
        return StateShape((kernel - 1) * inner, inner * state)
    approximate.append("recurrent layer state shape unknown for this config: counted as 0 bytes")
    return StateShape(0, 0)


def _max_model_len(r: _Reader) -> int | None:
    """The longest context the config allows (vllm/config/model.py::_get_and_verify_max_len).

    The smallest of the length keys present, times a RoPE scaling factor for the types that
    extend it (not for ``llama3``/``longrope``/``su``, whose length is already final).
    """
    lengths = [v for k in _LEN_KEYS if (v := r.int_(k)) is not None]
    if not lengths:
        return None
    length = min(lengths)
    scaling = r.raw("rope_scaling")
    if isinstance(scaling, Mapping):
        rope_type = str(scaling.get("rope_type") or scaling.get("type") or "")
        factor = scaling.get("factor")
        if rope_type not in ("", "su", "longrope", "llama3", "default", "mrope") and (
            isinstance(factor, int | float) and factor > 1
        ):
            if rope_type == "yarn":
                original = scaling.get("original_max_position_embeddings")
                base = original if isinstance(original, int) else length
                length = int(base * factor)
            else:
                length = int(length * factor)
    return length


def _rotary_factor(r: _Reader) -> float:
    value = r.raw("partial_rotary_factor")
    if value is None:
        params = r.raw("rope_parameters")
        value = params.get("partial_rotary_factor") if isinstance(params, Mapping) else None
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= 1:
        return float(value)
    return 1.0


def _softcap(r: _Reader) -> float | None:
    value = r.raw("final_logit_softcapping")
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None


def _moe(r: _Reader) -> MoE | None:
    # 0 experts is how dense members of MoE families (Granite 4 dense-hybrid) say "no MoE".
    experts = r.int_(
        "num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", positive=False
    )
    if not experts or experts <= 1:
        return None
    per_token = r.int_("num_experts_per_tok", "moe_top_k", "top_k", "num_experts_per_token") or 2
    inter = r.int_("moe_intermediate_size", "intermediate_size") or 0
    shared = r.int_("shared_expert_intermediate_size", positive=False) or 0
    n_shared = r.int_("n_shared_experts", "num_shared_experts")
    if not shared and n_shared:
        shared = n_shared * inter
    dense = r.int_("first_k_dense_replace", positive=False) or 0
    return MoE(experts, per_token, inter, shared, dense)


_QUANT_BITS = {
    "fp8": 8.0,
    "fbgemm_fp8": 8.0,
    "modelopt": 8.0,
    "ptpc_fp8": 8.0,
    "experts_int8": 8.0,
    "bitsandbytes": 4.5,
    "mxfp4": 4.25,  # 4-bit values + one 8-bit scale per 32
    "modelopt_fp4": 4.5,
    "nvfp4": 4.5,
}


def _quantization(
    config: Mapping[str, Any], inner: Mapping[str, Any], origin: str
) -> Quantization | None:
    q = inner.get("quantization_config") or config.get("quantization_config")
    if q is None:
        return None
    if not isinstance(q, Mapping):
        raise InputError(origin, "quantization_config", q, "must be an object")
    method = str(q.get("quant_method") or "").lower()
    modelopt = _modelopt_method(q, origin)
    if modelopt is not None:
        method = modelopt
    kv_bits = None
    kv_scheme = q.get("kv_cache_scheme")
    if isinstance(kv_scheme, Mapping) and isinstance(kv_scheme.get("num_bits"), int):
        kv_bits = int(kv_scheme["num_bits"])
    if method.startswith("modelopt") and _modelopt_kv_is_fp8(q):
        kv_bits = 8
    if method in _QUANT_BITS:
        bits = _QUANT_BITS[method]
    elif method in ("gptq", "awq", "gptq_marlin", "awq_marlin", "auto-round", "hqq"):
        raw_bits = q.get("bits") or q.get("w_bit") or 4
        group = q.get("group_size") or q.get("q_group_size") or 128
        bits = float(raw_bits) + (16.0 + float(raw_bits)) / max(int(group), 1)
    elif method == "compressed-tensors":
        bits = _compressed_tensors_bits(q)
    else:
        bits = 16.0
    experts_only = method == "mxfp4" or not _quantizes_attention(q)
    return Quantization(method or "unknown", bits, experts_only, kv_bits)


# ModelOpt FP8 flavours vLLM serves as ``modelopt`` (transformers_utils/
# model_arch_config_convertor.py::_normalize_quantization_config).
_MODELOPT_FP8_ALGOS = frozenset({"FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO"})


def _modelopt_method(q: Mapping[str, Any], origin: str) -> str | None:
    """vLLM's ``quant_method`` for a NVIDIA ModelOpt checkpoint, None for any other.

    ModelOpt 0.29 and before wrote ``hf_quant_config.json`` (``producer.name`` modelopt,
    ``quantization.quant_algo``) with no ``quant_method``; vLLM names the method from the
    algorithm and refuses an algorithm it does not know.
    """
    producer = q.get("producer")
    inner = q.get("quantization")
    legacy = isinstance(inner, Mapping) and "modelopt_quant_config" in inner
    is_modelopt = isinstance(producer, Mapping) and producer.get("name") == "modelopt"
    if not (is_modelopt or legacy) or not isinstance(inner, Mapping):
        return None
    algo = inner.get("quant_algo")
    if algo is None:
        return None
    upper = str(algo).upper()
    if upper in _MODELOPT_FP8_ALGOS:
        return "modelopt"
    if upper == "NVFP4":
        return "modelopt_fp4"
    raise InputError(
        origin,
        "quantization_config.quantization.quant_algo",
        algo,
        "is not a ModelOpt "
        "algorithm vLLM serves (FP8, FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO, NVFP4)",
    )


def _modelopt_kv_is_fp8(q: Mapping[str, Any]) -> bool:
    """ModelOpt's KV scheme: with ``--kv-cache-dtype auto`` vLLM 0.32 takes an FP8 one
    (vllm/utils/torch_utils.py::get_kv_cache_quant_algo_string)."""
    inner = q.get("quantization")
    inner = inner if isinstance(inner, Mapping) else q
    algo = (
        inner.get("kv_cache_scheme")
        or q.get("kv_cache_scheme")
        or inner.get("kv_cache_quant_algo")
        or q.get("kv_cache_quant_algo")
    )
    if isinstance(algo, Mapping):
        return (
            algo.get("dynamic") is False
            and algo.get("num_bits") == 8
            and algo.get("type") == "float"
        )
    return isinstance(algo, str) and algo.lower() == "fp8"


def _compressed_tensors_bits(q: Mapping[str, Any]) -> float:
    """Bits per weight of the first group that quantizes weights, its group scales included."""
    groups = q.get("config_groups")
    if isinstance(groups, Mapping):
        for group in groups.values():
            weights = group.get("weights") if isinstance(group, Mapping) else None
            if isinstance(weights, Mapping) and isinstance(weights.get("num_bits"), int):
                bits = float(weights["num_bits"])
                size = weights.get("group_size")
                if weights.get("strategy") == "group" and isinstance(size, int) and size > 0:
                    bits += 16.0 / size  # one 16-bit scale per group
                return bits
    return 16.0


def _quantizes_attention(q: Mapping[str, Any]) -> bool:
    """False when the checkpoint leaves attention in the model dtype (an ignore entry for it).

    Kimi-K2.5's int4 release, for one, quantizes only the routed experts.
    """
    ignore = q.get("ignore") or q.get("modules_to_not_convert") or ()
    if not isinstance(ignore, list):
        return True
    return not any(isinstance(x, str) and "self_attn" in x and "re:" in x for x in ignore)


# Qwen-VL processors' default max_pixels (12,845,056 = 65,536 patches of 14²): towers
# without a fixed image_size take images up to this many patches.
_DYNAMIC_RES_PATCHES = 65_536


# Gemma 4's dummy video (vllm/model_executor/models/gemma4_mm.py, 0.28): _VIDEO_MAX_FRAMES
# frames of _VIDEO_MAX_SOFT_TOKENS soft tokens each, plus a begin and an end token and about
# six timestamp tokens a frame (get_mm_max_tokens_per_item).
_GEMMA4_VIDEO_FRAMES = 32
_GEMMA4_FRAME_SOFT_TOKENS = 70
_GEMMA4_FRAME_TEXT_TOKENS = 2 + 6


def _gemma4_pooling(config: Mapping[str, Any]) -> tuple[int, int] | None:
    """Gemma 4's vision tower ``(pooling_kernel_size, default_output_length)``; None for
    any other model. A frame or image of ``t`` soft tokens is ``t × kernel²`` patches
    (gemma4_mm.py::get_num_image_tokens: ``max_patches = max_soft_tokens ×
    pooling_kernel_size²``)."""
    vc = config.get("vision_config")
    if config.get("model_type") != "gemma4" or not isinstance(vc, Mapping):
        return None
    kernel, out = vc.get("pooling_kernel_size"), vc.get("default_output_length")
    if not (isinstance(kernel, int) and isinstance(out, int)) or min(kernel, out) <= 0:
        return None
    return kernel, out


def _gemma4_video(config: Mapping[str, Any]) -> tuple[int, int] | None:
    """``(patches, tokens)`` of the item Gemma 4's encoder profile encodes: the modality
    with the most tokens per item (gemma4_mm.py::get_mm_max_tokens_per_item, 0.28) is the
    video, 32 × 78 = 2,496 tokens against an image's ``default_output_length`` (280) and
    the audio tower's ``audio_seq_length``; every frame goes through the vision tower at
    70 soft tokens."""
    pooling = _gemma4_pooling(config)
    if pooling is None:
        return None
    kernel, _ = pooling
    patches = _GEMMA4_VIDEO_FRAMES * _GEMMA4_FRAME_SOFT_TOKENS * kernel * kernel
    tokens = _GEMMA4_VIDEO_FRAMES * (_GEMMA4_FRAME_SOFT_TOKENS + _GEMMA4_FRAME_TEXT_TOKENS)
    return patches, tokens


def _gemma4_image(config: Mapping[str, Any]) -> tuple[int, int] | None:
    """Gemma 4's largest image, ``(tokens, profile elems)``: ``default_output_length`` soft
    tokens, that many × kernel² patches through the tower's MLP."""
    pooling = _gemma4_pooling(config)
    vc = config.get("vision_config")
    inter = vc.get("intermediate_size") if isinstance(vc, Mapping) else None
    if pooling is None or not isinstance(inter, int):
        return None
    kernel, out = pooling
    return out, out * kernel * kernel * inter


def vision_profile_elems(config: Mapping[str, Any]) -> int:
    """What vLLM's encoder profile run pushes through one MLP: patches × intermediate width.

    vLLM profiles the encoder with the largest item of the modality with the most tokens;
    for an image tower that is the largest image the processor allows: a fixed-size tower
    (SigLIP in Gemma 3: image_size / patch_size squared) sees that many patches, a
    dynamic-resolution one (Qwen-VL) up to the processor's max_pixels. Gemma 4's is a
    video (``_gemma4_video``).
    """
    vc = config.get("vision_config")
    if not isinstance(vc, Mapping):
        return 0
    inter = vc.get("intermediate_size") or vc.get("mlp_dim")
    hidden = vc.get("hidden_size") or vc.get("embed_dim")
    if not isinstance(inter, int) or not isinstance(hidden, int):
        return 0
    video = _gemma4_video(config)
    if video is not None:
        return video[0] * inter
    image, patch = vc.get("image_size"), vc.get("patch_size") or 14
    if isinstance(image, int) and isinstance(patch, int) and patch > 0:
        patches = (image // patch) ** 2
    else:
        patches = _DYNAMIC_RES_PATCHES
    return patches * inter


def vision_output_width(config: Mapping[str, Any], text_hidden: int | None) -> int:
    """Elements per image token of what the encoder returns to the language model: the
    merger's ``out_hidden_size`` (Qwen-VL) or the text model's width the projector maps
    into (Gemma 3, Llama 4, Pixtral), times one plus the deepstack levels Qwen3-VL
    concatenates to it (vllm/model_executor/models/qwen3_vl.py::
    Qwen3_VisionTransformer.forward: ``torch.cat([hidden_states] + deepstack_features, 1)``).
    0 without a vision tower."""
    vc = config.get("vision_config")
    if not isinstance(vc, Mapping) or not vision_profile_elems(config):
        return 0
    out = vc.get("out_hidden_size")
    width = out if isinstance(out, int) and out > 0 else (text_hidden or 0)
    deepstack = vc.get("deepstack_visual_indexes")
    return width * (1 + (len(deepstack) if isinstance(deepstack, list) else 0))


def vision_input_elems(config: Mapping[str, Any]) -> int:
    """Pixel values of the largest image (``vision_profile_elems``'s): patches × channels ×
    patch² × frames a patch spans (Qwen-VL's ``temporal_patch_size``; 1 for an image
    tower). 0 without a vision tower."""
    vc = config.get("vision_config")
    elems = vision_profile_elems(config)
    if not isinstance(vc, Mapping) or not elems:
        return 0
    sizes = (
        vc.get("intermediate_size") or vc.get("mlp_dim"),
        vc.get("patch_size") or 14,
        vc.get("in_channels") or vc.get("num_channels") or 3,
        vc.get("temporal_patch_size") or 1,
    )
    ints = [x for x in sizes if isinstance(x, int) and x > 0]
    if len(ints) < len(sizes):
        return 0
    inter, patch, channels, frames = ints
    return elems // inter * channels * patch * patch * frames


def dynamic_vision(config: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """``(patch_size, spatial_merge_size, MLP width)`` of a tower that takes images of any
    size up to the processor's ``max_pixels`` (Qwen2-VL, 2.5-VL, 3-VL: no ``image_size``),
    the towers ``vision_profile_elems`` sizes at ``_DYNAMIC_RES_PATCHES``; None otherwise."""
    vc = config.get("vision_config")
    if not isinstance(vc, Mapping) or not vision_profile_elems(config) or _gemma4_pooling(config):
        return None
    image, patch = vc.get("image_size"), vc.get("patch_size") or 14
    if isinstance(image, int) and isinstance(patch, int) and patch > 0:
        return None
    merge = vc.get("spatial_merge_size") or 1
    inter = vc.get("intermediate_size") or vc.get("mlp_dim")
    if not (isinstance(patch, int) and isinstance(merge, int) and isinstance(inter, int)):
        return None
    if min(patch, merge, inter) <= 0:
        return None
    return (patch, merge, inter)


def mtp_layers(config: Mapping[str, Any]) -> int:
    """The MTP modules a checkpoint ships (DeepSeek/GLM/MiMo ``num_nextn_predict_layers``,
    Qwen3-Next ``mtp_num_hidden_layers``); vLLM's MTP drafters build every one
    (vllm/config/speculative.py::hf_config_override: ``n_predict``)."""
    inner = config.get("text_config")
    for cfg in (config, inner if isinstance(inner, Mapping) else {}):
        for key in ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers"):
            value = cfg.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return 0


def vision_item_tokens(config: Mapping[str, Any]) -> int:
    """The language model's tokens for the largest image (0 without a vision tower).

    ``mm_tokens_per_image`` where the config gives it (Gemma 3: 256, pooled from 4,096
    patches); otherwise the patches of ``vision_profile_elems`` over the tower's
    ``spatial_merge_size`` squared (Qwen-VL merges 2 × 2 patches into one token); for
    Gemma 4 the tokens of the video its profile encodes (``_gemma4_video``).
    """
    fixed = config.get("mm_tokens_per_image")
    if isinstance(fixed, int) and not isinstance(fixed, bool) and fixed > 0:
        return fixed
    video = _gemma4_video(config)
    if video is not None:
        return video[1]
    vc = config.get("vision_config")
    elems = vision_profile_elems(config)
    if not isinstance(vc, Mapping) or not elems:
        return 0
    inter = vc.get("intermediate_size") or vc.get("mlp_dim")
    merge = vc.get("spatial_merge_size") or 1
    if not isinstance(inter, int) or not isinstance(merge, int) or inter <= 0 or merge <= 0:
        return 0
    return max(1, elems // inter // (merge * merge))


def vision_params(config: Mapping[str, Any]) -> int:
    """Parameters of a vision tower from ``vision_config`` (0 when there is none).

    Per block: the q, k, v, o projections (4·h²) and a gated (3·h·i) or plain (2·h·i) MLP,
    plus the patch embedding; a projector into the language model's width is small next to
    them. An estimate: vLLM loads the tower with the model, so it takes GPU memory.
    """
    vc = config.get("vision_config")
    if not isinstance(vc, Mapping):
        return 0

    def num(*keys: str) -> int:
        for key in keys:
            value = vc.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return 0

    h = num("hidden_size", "embed_dim", "width")
    depth = num("depth", "num_hidden_layers", "num_layers")
    inter = num("intermediate_size", "mlp_dim") or 4 * h
    if not h or not depth:
        return 0
    gated = str(vc.get("hidden_act") or "") in ("silu", "swiglu")
    mlp = (3 if gated else 2) * h * inter
    patch = num("patch_size") or 14
    channels = num("in_chans", "num_channels") or 3
    temporal = num("temporal_patch_size") or 1
    out = num("out_hidden_size") or h
    return depth * (4 * h * h + mlp) + patch * patch * channels * temporal * h + h * out
