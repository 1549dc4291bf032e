"""Find and read a model: a ``config.json``, a model dir, a Hugging Face cache entry, a
catalogue name, or a Hugging Face Hub id (``exporter.hub``); and the checkpoint's size from
its weight files. ``ModelDirSource`` is the sidecar's ``model`` source: where the running
vLLM's model is, read once per location.

The Hugging Face cache keeps ``models--ORG--NAME/snapshots/REV/`` with ``refs/main``
naming the current revision; the files there are links into ``blobs/``, so sizes are read
through the links.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from exporter.capacity.arch import ModelArch, parse_config, with_hf_quant_config
from exporter.capacity.catalogue import (
    CatalogueModel,
    close_models,
    find_model,
    parse_catalogue,
    parse_restored,
)
from exporter.deployment import Deployment
from exporter.errors import InputError
from exporter.hub import load_from_hub, looks_like_repo_id
from exporter.log import get_logger
from exporter.sources.base import Jobs, Outcome, Plugin, Readings, Slot, SourceContext, Stage
from exporter.sources.cmdline import PROCESS
from exporter.sources.records import ModelSource

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
_INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
# ModelOpt 0.29 and before keep the quantization here, beside config.json; vLLM reads it.
_HF_QUANT_CONFIG = "hf_quant_config.json"


def _catalogue_doc() -> Any:
    text = resources.files("exporter.capacity").joinpath("data/models.json").read_text("utf-8")
    return json.loads(text)


def load_catalogue() -> tuple[CatalogueModel, ...]:
    return parse_catalogue(_catalogue_doc())


def load_restored() -> tuple[CatalogueModel, ...]:
    """Names an earlier catalogue listed, each planned again (``resolves_to`` a sibling's
    config, or its own)."""
    doc = _catalogue_doc()
    return parse_restored(doc, parse_catalogue(doc))


def read_json(path: Path) -> Any:
    """A JSON file, or an ``InputError`` naming the file and the line of the mistake."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(str(path), "", None, "file not found") from None
    except OSError as e:
        raise InputError(str(path), "", None, f"cannot be read: {e.strerror}") from None
    except UnicodeDecodeError:
        raise InputError(str(path), "", None, "is not UTF-8 text") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(
            str(path), "", None, f"is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})"
        ) from None


def resolve_snapshot(path: Path) -> Path:
    """A model dir itself, or the current snapshot of a ``models--ORG--NAME`` cache dir."""
    if (path / "config.json").is_file():
        return path
    snapshots = path / "snapshots"
    if snapshots.is_dir():
        ref = path / "refs" / "main"
        if ref.is_file():
            current = snapshots / ref.read_text(encoding="utf-8").strip()
            if (current / "config.json").is_file():
                return current
        candidates = sorted(
            (p for p in snapshots.iterdir() if (p / "config.json").is_file()),
            key=lambda p: p.stat().st_mtime,
        )
        if candidates:
            return candidates[-1]
    raise InputError(
        str(path),
        "config.json",
        None,
        "no config.json here (nor in a Hugging Face cache snapshot below it); point at the "
        "model directory or its config.json",
    )


def checkpoint_bytes(model_dir: Path) -> tuple[int | None, str]:
    """The checkpoint's size: the safetensors index's ``total_size``, else the weight files."""
    for index_name in _INDEX_FILES:
        index = model_dir / index_name
        if index.is_file():
            doc = read_json(index)
            total = doc.get("metadata", {}).get("total_size") if isinstance(doc, dict) else None
            if isinstance(total, int) and total > 0:
                return total, f"{index}: metadata.total_size"
    files = [p for p in model_dir.iterdir() if p.suffix in _WEIGHT_SUFFIXES and p.is_file()]
    # A dir with safetensors and .bin copies holds the same weights twice; vLLM loads one.
    safetensors = [p for p in files if p.suffix == ".safetensors"]
    chosen = safetensors or files
    if not chosen:
        return None, ""
    return sum(p.stat().st_size for p in chosen), f"{model_dir}: {len(chosen)} weight files"


def model_name(config_path: Path) -> str:
    """``org/model/config.json`` → ``model``; ``tinyllama.config.json`` → ``tinyllama``;
    a Hugging Face snapshot → ``ORG/NAME`` from its ``models--ORG--NAME`` folder."""
    if config_path.name != "config.json":
        return config_path.name.removesuffix(".json").removesuffix(".config")
    for parent in config_path.parents:
        if parent.name.startswith("models--"):
            return "/".join(parent.name.split("--")[1:])
    return config_path.parent.resolve().name


def load_model(spec: str, env: Mapping[str, str] | None = None) -> ModelSource:
    """``--model``: a path to ``config.json`` or a model dir, else a catalogue name, else a
    Hugging Face Hub id (``env``: the ``HF_*`` variables; the process's own by default)."""
    path = Path(spec).expanduser()
    if path.exists():
        if path.is_file():
            config_path, model_dir = path, path.parent
        else:
            model_dir = resolve_snapshot(path)
            config_path = model_dir / "config.json"
        config = read_json(config_path)
        if not isinstance(config, dict):
            raise InputError(str(config_path), "", None, "must hold a JSON object")
        quant_path = model_dir / _HF_QUANT_CONFIG
        if config.get("quantization_config") is None and quant_path.is_file():
            quant = read_json(quant_path)
            if not isinstance(quant, dict):
                raise InputError(str(quant_path), "", None, "must hold a JSON object")
            config = with_hf_quant_config(config, quant)
        weights, source = checkpoint_bytes(model_dir)
        return ModelSource(model_name(config_path), config, str(config_path), weights, source)
    catalogue = load_catalogue()
    # The catalogue first: it plans with no network and no cache, as the tests and an
    # air-gapped laptop need; the Hub only for what it does not hold.
    found = find_model(catalogue, spec) or find_model(load_restored(), spec)
    if found is None:
        close = close_models(catalogue, spec)
        guess = f"did you mean {' or '.join(close)}? " if close else ""
        if looks_like_repo_id(spec.strip()):
            hub = load_from_hub(spec.strip(), env, did_you_mean=guess)
            return ModelSource(
                hub.repo_id,
                hub.config,
                hub.config_path,
                hub.weights_bytes,
                hub.weights_source,
                hub.notes,
            )
        # The model people plan is often a fine-tune or a repack the catalogue cannot
        # hold: its downloaded config.json is all plan needs, so say that first.
        raise InputError(
            "--model",
            "",
            spec,
            f"is neither a path nor a catalogue model; {guess}A model you have downloaded "
            "plans from its files: --model PATH (its dir or config.json); "
            "`kv-headroom plan --list-models` lists the catalogue",
        )
    return ModelSource(
        found.name,
        found.serving_config,
        f"catalogue:{found.name}",
        found.checkpoint_bytes,
        f"published checkpoint ({found.checkpoint_source})" if found.checkpoint_bytes else "",
        found.notes,
        resolution=(
            f"{found.name} plans with {found.resolves_to}'s config.json: {found.notes[0]}"
            if found.resolves_to
            else ""
        ),
    )


@dataclass(frozen=True)
class LoadedModel:
    """A model as the sidecar read it, and what it was read for."""

    key: tuple[str, str]  # (where, dtype)
    source: ModelSource
    arch: ModelArch


def hf_caches(env: Mapping[str, str]) -> list[Path]:
    """Where a Hugging Face hub cache may be, as vLLM's environment says."""
    roots = []
    if env.get("HF_HUB_CACHE"):
        roots.append(Path(env["HF_HUB_CACHE"]))
    if env.get("HF_HOME"):
        roots.append(Path(env["HF_HOME"]) / "hub")
    roots.append(Path(env.get("HOME", "/root")) / ".cache" / "huggingface" / "hub")
    return roots


def locate_model(
    configured: str | None, deployment: Deployment, env: Mapping[str, str]
) -> str | None:
    """``model.path``; else vLLM's ``--model`` when that path is visible here too, directly
    or as an entry of a Hugging Face cache named by ``env`` (vLLM's, when visible)."""
    if configured:
        return configured
    model = deployment.model
    if model and Path(model).exists():
        return model
    if model and "/" in model:
        for root in hf_caches(env):
            candidate = root / ("models--" + model.replace("/", "--"))
            if candidate.is_dir():
                return str(candidate)
    return None


# What this source reads: the model vLLM serves, once per location.
MODEL: Slot[LoadedModel] = Slot("model")


class ModelDirSource:
    """The model's ``config.json`` and checkpoint size, read again only when the location
    or dtype changes. Down (``not_configured``) without a model path: a choice, not an error.
    """

    name = "model"
    stage = Stage.AFTER_DEPLOYMENT
    reports_health = True

    def __init__(
        self,
        *,
        configured: str | None,
        env: Mapping[str, str],
        load: Callable[[str], ModelSource],
        within: float,
    ) -> None:
        self._configured, self._env, self._load, self._within = configured, env, load, within
        self._jobs = Jobs()
        self._log = get_logger()

    def due(self, now: float) -> bool:
        return True  # a cheap check: the model is loaded again only when it moved

    async def poll(self, now: float, readings: Readings) -> Outcome:
        deployment = readings.deployment
        process = readings.get(PROCESS)
        env = process.environ if process is not None else self._env
        where = locate_model(self._configured, deployment, env)
        if where is None:
            readings.put(MODEL, self.name, None)
            return "not_configured", "no model path: set model.path"
        dtype = deployment.dtype or "auto"
        key = (where, dtype)
        loaded = readings.get(MODEL)
        if loaded is not None and loaded.key == key:
            return None
        load = self._load

        def read() -> tuple[ModelSource, ModelArch]:
            source = load(where)
            return source, parse_config(
                source.config, source.config_path, dtype=dtype, name=source.name
            )

        readings.put(MODEL, self.name, None)
        try:
            # A model dir on a slow mount may take a few polls; the same read is awaited
            # again next poll rather than started twice.
            source, arch = await self._jobs.run(f"model:{where}:{dtype}", read, self._within)
        except TimeoutError:
            return "timeout", f"reading {where} did not finish in time"
        except InputError as e:
            return "bad_model", str(e)
        except (OSError, ValueError, RecursionError) as e:
            return "bad_model", f"{where}: {type(e).__name__}: {e}"
        readings.put(MODEL, self.name, LoadedModel(key, source, arch))
        self._log.info(
            "model_loaded",
            path=source.config_path,
            model=source.name,
            attention_kind=arch.attention_kind.value,
            approximate=list(arch.approximate),
        )
        return None

    async def on_restart(self, now: float, readings: Readings) -> None:
        return None


def _make(context: SourceContext) -> ModelDirSource:
    deps = context.deps
    return ModelDirSource(
        configured=context.config.model_path,
        env=deps.env,
        load=deps.load_model or load_model,
        within=context.within,
    )


PLUGIN = Plugin("model", _make)
