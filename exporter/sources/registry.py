"""The sources, by name, in the order the poller runs them and exports their health.

Each source module declares its ``PLUGIN`` (``sources.base.Plugin``): its settings, its
enable flag and how to make it; the configuration, ``serve``'s flags, the docs and the poll
loop all read this list. Adding a source is one new module under ``exporter/sources/`` and
one line in ``MODULES``.
"""

from __future__ import annotations

import importlib

from exporter.sources.base import Plugin

MODULES = (
    "vllm",
    "cmdline",
    "nvml",
    "model_dir",
    "dcgm",
)


def _plugin(module: str) -> Plugin:
    plugin = getattr(importlib.import_module(f"exporter.sources.{module}"), "PLUGIN", None)
    if not isinstance(plugin, Plugin):  # a module listed without its declaration: a bug here
        raise TypeError(f"exporter/sources/{module}.py declares no PLUGIN = Plugin(...)")
    return plugin


REGISTRY: tuple[Plugin, ...] = tuple(_plugin(module) for module in MODULES)
BY_NAME = {plugin.name: plugin for plugin in REGISTRY}
