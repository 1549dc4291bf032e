"""The plain records the sources read and the poller injects: a vLLM process and its flags,
a model's config, ``/v1/models``' card, and the shape of a vLLM client. They live apart
from the sources that fill them so that ``sources/base.py`` can type the poller's
dependencies without importing the sources it is the base of.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from exporter.sources.vllm_page import VllmPage


@dataclass(frozen=True)
class VllmProcess:
    pid: int
    argv: tuple[str, ...]
    environ: Mapping[str, str]  # from /proc/PID/environ ({} when not readable)


@dataclass(frozen=True)
class Flags:
    values: Mapping[str, object]  # canonical key -> typed value
    origin: Mapping[str, str]  # canonical key -> "cmdline" | "config file <path>"
    model: str | None
    problems: tuple[str, ...]  # flags skipped, unreadable --config: each a one-line message


@dataclass(frozen=True)
class ModelSource:
    """A model's config and, when a directory holds them, its weights."""

    name: str
    config: dict[str, Any]
    config_path: str  # a file path, or ``catalogue:NAME``
    weights_bytes: int | None
    weights_source: str
    notes: tuple[str, ...] = ()
    resolution: str = ""  # which config a name resolves to, where it is another name's


@dataclass(frozen=True)
class ModelCard:
    """What ``/v1/models`` says: the served names and the context limit."""

    names: tuple[str, ...]
    max_model_len: int | None
    root: str | None  # the model path or hub id vLLM loaded


class VllmApi(Protocol):
    """What the sidecar asks of a vLLM server: ``VllmClient`` over HTTP, or the replay's
    simulation answering in-process."""

    async def metrics(self) -> VllmPage: ...

    async def models(self) -> ModelCard: ...

    async def version(self) -> str | None: ...
