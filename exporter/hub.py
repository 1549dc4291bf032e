"""A model on the Hugging Face Hub, by its id: ``config.json`` (with its quantization config)
and the weights' exact size from the Hub's safetensors metadata, never the weights themselves.

``huggingface_hub`` does the talking, so ``HF_ENDPOINT``, ``HF_TOKEN``, ``HF_HOME`` /
``HF_HUB_CACHE`` and ``HF_HUB_OFFLINE`` mean what they mean to vLLM, which resolves a model id
with the same library. Files land in the hub's own cache; the safetensors summary (one API
call, not a file) is kept beside it in the hub's assets cache, so a model planned once plans
again with ``HF_HUB_OFFLINE=1``. Everything is read from the environment at call time, not at
import, so one process can plan against two endpoints (the tests' stand-in Hub does).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.errors import InputError

# A Hub id is ``namespace/name``; anything else (a typo'd path, a bare name) is not asked for.
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_LIBRARY = "vllm-kv-headroom"
_SUMMARY = "safetensors.json"
_TRUE = {"1", "ON", "YES", "TRUE"}  # huggingface_hub's own reading of a boolean variable

# Bytes per element of each safetensors dtype (the format's own list). Packed 4- and 6-bit
# types hold fractions of a byte per element.
DTYPE_BYTES: dict[str, float] = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F6_E2M3": 0.75,
    "F6_E3M2": 0.75,
    "F4": 0.5,
}


@dataclass(frozen=True)
class HubModel:
    repo_id: str
    config: dict[str, Any]
    config_path: str  # the cached file
    weights_bytes: int | None
    weights_source: str
    notes: tuple[str, ...] = ()


def looks_like_repo_id(spec: str) -> bool:
    return bool(_REPO_ID.match(spec)) and ".." not in spec


def offline(env: Mapping[str, str]) -> bool:
    flag = env.get("HF_HUB_OFFLINE") or env.get("TRANSFORMERS_OFFLINE") or ""
    return flag.upper() in _TRUE


def endpoint(env: Mapping[str, str]) -> str:
    return (env.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def hub_cache(env: Mapping[str, str]) -> Path:
    """Where huggingface_hub keeps repositories, by the variables it reads."""
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"])
    return _hf_home(env) / "hub"


def assets_cache(env: Mapping[str, str]) -> Path:
    if env.get("HF_ASSETS_CACHE"):
        return Path(env["HF_ASSETS_CACHE"])
    return _hf_home(env) / "assets"


def _hf_home(env: Mapping[str, str]) -> Path:
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser()
    xdg = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME", "~")) / ".cache")
    return Path(xdg).expanduser() / "huggingface"


def weights_from_parameters(parameters: Mapping[str, int]) -> tuple[int | None, str]:
    """The checkpoint's tensor bytes from the Hub's per-dtype parameter counts.

    None where a dtype is unknown, or where most parameters are fp32/fp64: vLLM casts such a
    checkpoint to 16 bits on load, so its file size is not what the GPU holds.
    """
    unknown = sorted(set(parameters) - set(DTYPE_BYTES))
    counts = ", ".join(f"{n:,} {dtype}" for dtype, n in sorted(parameters.items()))
    if unknown or not parameters:
        return None, f"safetensors metadata: unknown dtype {', '.join(unknown) or 'none'}"
    total = sum(parameters.values())
    wide = sum(n for dtype, n in parameters.items() if dtype in ("F32", "F64"))
    if wide * 2 > total:
        return None, f"safetensors metadata: an fp32 checkpoint ({counts}), cast on load"
    size = sum(n * DTYPE_BYTES[dtype] for dtype, n in parameters.items())
    return round(size), f"exact (safetensors metadata on the Hub: {counts} parameters)"


def load_from_hub(
    repo_id: str, env: Mapping[str, str] | None = None, did_you_mean: str = ""
) -> HubModel:
    """``config.json``, ``hf_quant_config.json`` where the repo has one, and the safetensors
    summary, or an ``InputError`` that says in one line what to do instead (``did_you_mean``,
    the catalogue's close names, joins a not-found message)."""
    env = os.environ if env is None else env
    # Imported here: the library is heavy, and a plan from a path or the catalogue needs none.
    try:
        from huggingface_hub import HfApi, hf_hub_download
    except ImportError:
        raise InputError(
            "--model",
            "",
            repo_id,
            f"is neither a path nor a catalogue model; {did_you_mean}planning a model by its "
            "Hugging Face id needs huggingface_hub (pip install 'vllm-kv-headroom[hub]'), "
            "or --model PATH to a directory with its config.json",
        ) from None
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    is_offline = offline(env)
    token = env.get("HF_TOKEN") or None  # None: a token saved by `hf auth login`, if any
    url = endpoint(env)
    cache = hub_cache(env)
    summary_dir = assets_cache(env) / _LIBRARY / repo_id.replace("/", "--")
    where = "the Hugging Face cache (HF_HUB_OFFLINE=1)" if is_offline else f"the Hub ({url})"

    def fail(problem: str) -> InputError:
        return InputError("--model", "", repo_id, problem)

    def download(filename: str) -> str:
        path: str = hf_hub_download(
            repo_id,
            filename,
            cache_dir=cache,
            endpoint=url,
            token=token,
            local_files_only=is_offline,
        )
        return path

    parameters: dict[str, int] | None = None
    try:
        if not is_offline:
            info = HfApi(endpoint=url, token=token).model_info(
                repo_id, expand=["safetensors", "sha"]
            )
            if info.safetensors is not None:
                parameters = dict(info.safetensors.parameters)
                summary_dir.mkdir(parents=True, exist_ok=True)
                (summary_dir / _SUMMARY).write_text(
                    json.dumps({"sha": info.sha, "parameters": parameters}), encoding="utf-8"
                )
        config_path = download("config.json")
    except GatedRepoError:
        how = "HF_TOKEN has no access to it" if token else "set HF_TOKEN to a token with access"
        raise fail(
            f"is gated on the Hugging Face Hub: accept its terms on its page, and {how}"
        ) from None
    except RepositoryNotFoundError:
        raise fail(
            f"is neither a path, a catalogue model nor a model on {where}; {did_you_mean}"
            "a private model needs HF_TOKEN, and a model you have downloaded plans from its files: "
            "--model PATH (its dir or config.json)"
        ) from None
    except LocalEntryNotFoundError:
        # Offline, or the Hub did not answer: either way the cache has no copy.
        reason = "HF_HUB_OFFLINE=1" if is_offline else f"{url} did not answer"
        raise fail(
            f"is neither a path, a catalogue model nor in the Hugging Face cache ({reason}); "
            f"{did_you_mean}a model you have downloaded plans from its files: --model PATH "
            "(its dir or config.json)"
        ) from None
    except EntryNotFoundError:
        raise fail(
            f"has no config.json on {where} (a GGUF or adapter repository?): plan the base "
            "model, or --model PATH with its config.json"
        ) from None
    except Exception as e:  # the client's transport errors have no common base: one line each
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise fail(f"could not be read from {where}: {first}") from None

    config = _read_object(Path(config_path))
    notes: list[str] = []
    if config.get("quantization_config") is None:
        # ModelOpt 0.29 and before keep the quantization beside config.json; vLLM reads it.
        try:
            quant_path = download("hf_quant_config.json")
        except (EntryNotFoundError, HfHubHTTPError, OSError):
            quant_path = None
        if quant_path is not None:
            from exporter.capacity.arch import with_hf_quant_config

            config = with_hf_quant_config(config, _read_object(Path(quant_path)))
            notes.append("quantization from hf_quant_config.json")
    if parameters is None and is_offline:
        parameters = _cached_parameters(summary_dir / _SUMMARY)
    weights, source = (None, "") if parameters is None else weights_from_parameters(parameters)
    if weights is None and source:
        notes.append(source)
    return HubModel(repo_id, config, config_path, weights, source if weights else "", tuple(notes))


def _read_object(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(str(path), "", None, f"cannot be read as JSON: {e}") from None
    if not isinstance(doc, dict):
        raise InputError(str(path), "", None, "must hold a JSON object")
    return doc


def _cached_parameters(path: Path) -> dict[str, int] | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # planned offline before any online run: the estimate stands in
    parameters = doc.get("parameters") if isinstance(doc, dict) else None
    if not isinstance(parameters, dict):
        return None
    return {str(k): int(v) for k, v in parameters.items() if isinstance(v, int)}
