"""``kv-headroom serve``: the sidecar. Prometheus-style flags, each also settable in the
YAML file (``--config.file``) or the environment (``KV_HEADROOM_<SECTION>_<KEY>``)."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from typing import Any

from aiohttp import web

from exporter.config import Config, ConfigError, describe, load_config
from exporter.log import configure, get_logger
from exporter.server import create_app

EXIT_OK, EXIT_RUNTIME, EXIT_BAD_CONFIG = 0, 1, 2

# argparse dest → dotted config key
_FLAGS = {
    "config_file": "config.file",
    "vllm_url": "vllm.url",
    "vllm_timeout": "vllm.timeout",
    "web_listen_address": "web.listen_address",
    "poll_interval": "poll.interval",
    "poll_window": "poll.window",
    "model_path": "model.path",
    "log_format": "log.format",
    "log_level": "log.level",
    "nvml_enabled": "nvml.enabled",
}


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="run the sidecar next to a vLLM server",
        description="Watch a vLLM server and export its KV-cache capacity, headroom and risk.",
    )
    p.add_argument("--config.file", dest="config_file", help="YAML configuration file")
    p.add_argument("--vllm.url", dest="vllm_url", help="default http://127.0.0.1:8000")
    p.add_argument("--vllm.timeout", dest="vllm_timeout", help="per request, e.g. 1.5s")
    p.add_argument("--web.listen-address", dest="web_listen_address", help="default :9847")
    p.add_argument("--poll.interval", dest="poll_interval", help="default 2s")
    p.add_argument("--poll.window", dest="poll_window", help="context window, default 10m")
    p.add_argument("--model.path", dest="model_path", help="model dir or config.json")
    p.add_argument("--log.format", dest="log_format", help="json | console | auto")
    p.add_argument("--log.level", dest="log_level", help="debug | info | warning | error")
    p.add_argument(
        "--nvml.enabled", dest="nvml_enabled", action=argparse.BooleanOptionalAction, default=None
    )
    p.add_argument(
        "--check-config", action="store_true", help="validate the configuration and exit"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    flags = {key: getattr(args, dest) for dest, key in _FLAGS.items()}
    try:
        config = load_config(flags, os.environ)
    except ConfigError as e:
        print(f"kv-headroom serve: {e}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    if args.check_config:
        rows = describe(config)
        width = max(len(key) for key, _, _ in rows)
        for key, value, source in rows:
            print(f"{key:<{width}}  {value}  ({source})")
        return EXIT_OK
    configure(config.log_level, config.log_format)
    return asyncio.run(serve(config))


async def serve(config: Config, ready: asyncio.Event | None = None) -> int:
    """Run until SIGTERM/SIGINT. Returns the exit code; binding errors are one log event."""
    log = get_logger()
    app = create_app(config)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, config.listen_host or None, config.listen_port)
    try:
        await site.start()
    except OSError as e:
        log.error(
            "listen_failed",
            address=f"{config.listen_host}:{config.listen_port}",
            error=e.strerror or str(e),
        )
        await runner.cleanup()
        return EXIT_RUNTIME
    log.info(
        "serving",
        address=f"{config.listen_host or '*'}:{config.listen_port}",
        vllm=config.vllm_url,
        interval_seconds=config.poll_interval_seconds,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        log.info("stopping")
        await runner.cleanup()
    return EXIT_OK
