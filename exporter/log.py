"""Structured logs: JSON lines for machines, a readable console format on a terminal.

One event per state change (a source going down or coming back, vLLM restarting, the
deployment or model changing) — never one per poll.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}
_LEVELS["error"] = logging.ERROR


def configure(level: str = "info", fmt: str = "auto", stream: TextIO | None = None) -> None:
    """``fmt``: json, console, or auto (console when ``stream`` is a terminal)."""
    out = stream or sys.stdout
    console = fmt == "console" or (fmt == "auto" and out.isatty())
    renderer: Any = (
        structlog.dev.ConsoleRenderer(colors=False)
        if console
        else structlog.processors.JSONRenderer(sort_keys=False)
    )
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )


def get_logger() -> Any:
    return structlog.get_logger("kv-headroom")
