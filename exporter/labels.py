"""Labels from outside, bounded: the cardinality limits and the two rules for a label value
(``cut_label`` on the way in, ``escape_label`` on the way out), in one place that both the
sources, which read labels, and ``metrics``, which writes them, import. Pure."""

from __future__ import annotations

__all__ = [
    "MAX_CACHE_CONFIG_LABELS",
    "MAX_ENGINES",
    "MAX_GPUS",
    "MAX_LABEL_VALUE_LENGTH",
    "cut_label",
    "escape_label",
]

# Cardinality bounds: a data-parallel vLLM runs a handful of engines and 0.32's
# cache_config_info has 37 labels, so these only bite on a page that is broken or hostile,
# and then keep one page from turning into thousands of series or megabytes of history.
MAX_ENGINES = 64
MAX_CACHE_CONFIG_LABELS = 128
MAX_LABEL_VALUE_LENGTH = 256
# One vLLM spans at most one node's GPUs (8-16); the cap bounds series and NVML calls.
MAX_GPUS = 64


def cut_label(value: str) -> str:
    """A label value from outside, at most ``MAX_LABEL_VALUE_LENGTH`` characters (``…``
    marks a cut): the one rule for the page, /v1/models, /version and the collector."""
    if len(value) <= MAX_LABEL_VALUE_LENGTH:
        return value
    return value[: MAX_LABEL_VALUE_LENGTH - 1] + "…"


def escape_label(value: str) -> str:
    """A label value as the exposition format writes it (the inverse of the page parser's
    unescaping)."""
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return value
