"""``kv-headroom serve``: the sidecar. Prometheus-style flags, each also settable in the
YAML file (``--config.file``) or the environment (``KV_HEADROOM_<SECTION>_<KEY>``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from ssl import SSLContext
from typing import Any

from aiohttp import web

from exporter.config import Config, ConfigError, describe, load_config
from exporter.log import configure, get_logger
from exporter.poller import PollerDeps
from exporter.server import HANDLER_LIMITS, POLLER, create_app
from exporter.sources.vllm import redact
from exporter.webconfig import WebConfigError, ssl_context

EXIT_OK, EXIT_RUNTIME, EXIT_BAD_CONFIG = 0, 1, 2

# argparse dest → dotted config key
_FLAGS = {
    "config_file": "config.file",
    "vllm_url": "vllm.url",
    "vllm_timeout": "vllm.timeout",
    "web_listen_address": "web.listen_address",
    "web_config_file": "web.config_file",
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
    p.add_argument(
        "--web.config.file",
        dest="web_config_file",
        help="exporter-toolkit web config (TLS, basic auth), as node-exporter reads it",
    )
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
    try:
        tls = (
            ssl_context(config.web_config) if config.web_config and config.web_config.tls else None
        )
    except WebConfigError as e:  # checked at load; a file changed since then lands here
        print(f"kv-headroom serve: {e}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    configure(config.log_level, config.log_format)
    try:
        return asyncio.run(serve(config, ssl=tls))
    except KeyboardInterrupt:  # Ctrl-C before the loop's own handler was in place
        return EXIT_OK


async def serve(
    config: Config,
    ready: asyncio.Event | None = None,
    *,
    ssl: SSLContext | None = None,
    deps: PollerDeps | None = None,
) -> int:
    """Run until SIGTERM/SIGINT. Returns the exit code; binding errors are one log event.

    The port is bound before the first poll: when it is taken, the one line said is
    ``listen_failed``, not a poll's worth of source events before it.
    """
    log = get_logger()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):  # first: a signal during start-up counts too
        loop.add_signal_handler(sig, stop.set)
    app = create_app(config, deps, poll=False)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, **HANDLER_LIMITS)
    try:
        await runner.setup()
        site = web.TCPSite(runner, config.listen_host or None, config.listen_port, ssl_context=ssl)
        try:
            await site.start()
        except OSError as e:
            log.error(
                "listen_failed",
                address=config.listen_address,
                error=e.strerror or str(e),
                hint="another process holds the port, or the address is not this host's; "
                "set --web.listen-address",
            )
            return EXIT_RUNTIME
        web_config = config.web_config
        log.info(
            "serving",
            address=f"{config.listen_host or '*'}:{config.listen_port}",
            tls=ssl is not None,
            basic_auth=bool(web_config and web_config.users),
            vllm=redact(config.vllm_url),
            interval_seconds=config.poll_interval_seconds,
        )
        polling = asyncio.create_task(app[POLLER].run(stop), name="poll-loop")
        if ready is not None:
            ready.set()
        await stop.wait()
        log.info("stopping")
        # A poll in flight is abandoned: a vLLM that hangs must not hold up the exit.
        polling.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await polling
        return EXIT_OK
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await runner.cleanup()
