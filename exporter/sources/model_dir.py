"""Find and read a model: a ``config.json``, a model dir, a Hugging Face cache entry, or a
catalogue name; and the checkpoint's size from its weight files.

The Hugging Face cache keeps ``models--ORG--NAME/snapshots/REV/`` with ``refs/main``
naming the current revision; the files there are links into ``blobs/``, so sizes are read
through the links.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from exporter.capacity.catalogue import CatalogueModel, find_model, parse_catalogue
from exporter.errors import InputError

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
_INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


@dataclass(frozen=True)
class ModelSource:
    """A model's config and, when a directory holds them, its weights."""

    name: str
    config: dict[str, Any]
    config_path: str  # a file path, or ``catalogue:NAME``
    weights_bytes: int | None
    weights_source: str
    notes: tuple[str, ...] = ()


def load_catalogue() -> tuple[CatalogueModel, ...]:
    text = resources.files("exporter.capacity").joinpath("data/models.json").read_text("utf-8")
    doc = json.loads(text)
    return parse_catalogue(doc)


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


def load_model(spec: str) -> ModelSource:
    """``--model``: a path to ``config.json`` or a model dir, else a catalogue name."""
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
        weights, source = checkpoint_bytes(model_dir)
        return ModelSource(model_name(config_path), config, str(config_path), weights, source)
    found = find_model(load_catalogue(), spec)
    if found is None:
        raise InputError(
            "--model",
            "",
            spec,
            "is neither a path nor a catalogue model; see `kv-headroom plan --list-models`",
        )
    return ModelSource(
        found.name,
        dict(found.config),
        f"catalogue:{found.name}",
        found.checkpoint_bytes,
        f"published checkpoint ({found.checkpoint_source})" if found.checkpoint_bytes else "",
        found.notes,
    )
