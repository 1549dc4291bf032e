"""The built-in model catalogue: popular models' KV-relevant config fields, with sources.

The data (``data/models.json``) is copied from the project's shared fixtures; each entry
keeps the public source it was read from and notes any normalisation. Pure: the caller
supplies the parsed JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exporter.errors import InputError


@dataclass(frozen=True)
class CatalogueModel:
    name: str
    config: Mapping[str, Any]
    source: str
    notes: tuple[str, ...]


def parse_catalogue(doc: Mapping[str, Any]) -> tuple[CatalogueModel, ...]:
    models = doc.get("models")
    if not isinstance(models, Mapping):
        raise InputError("catalogue", "models", type(models).__name__, "must be an object")
    return tuple(
        CatalogueModel(
            name, entry["config"], entry.get("source", ""), tuple(entry.get("notes", ()))
        )
        for name, entry in models.items()
    )


def find_model(catalogue: tuple[CatalogueModel, ...], name: str) -> CatalogueModel | None:
    """By full id (``Qwen/Qwen3-14B``) or by the part after the slash, case ignored.

    Returns None when nothing matches; raises when a short name matches several models.
    """
    wanted = name.strip().lower()
    for model in catalogue:
        if model.name.lower() == wanted:
            return model
    short = [m for m in catalogue if m.name.split("/")[-1].lower() == wanted]
    if len(short) > 1:
        names = ", ".join(m.name for m in short)
        raise InputError("--model", "", name, f"matches several catalogue models: {names}")
    return short[0] if short else None
