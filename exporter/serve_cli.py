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

from exporter.config import SPECS_BY_KEY, Config, ConfigError, check_paths, describe, load_config
from exporter.log import configure, get_logger
from exporter.poller import PollerDeps
from exporter.server import HANDLER_LIMITS, POLLER, create_app
from exporter.settings import parse_bool
from exporter.sources.registry import REGISTRY
from exporter.sources.vllm import redact
from exporter.webconfig import WebConfigError, ssl_context

EXIT_OK, EXIT_RUNTIME, EXIT_BAD_CONFIG = 0, 1, 2

# The settings serve takes as flags; every other key is for the file or the environment.
# A registered source adds the flags it declares, after these.
_CORE_FLAGS = (
    "vllm.url",
    "vllm.timeout",
    "web.listen_address",
    "web.config_file",
    "poll.interval",
    "poll.window",
    "model.path",
    "log.format",
    "log.level",
    "nvml.enabled",
)
SERVE_FLAGS = (*_CORE_FLAGS, *(key for plugin in REGISTRY for key in plugin.flags))
_DEFAULTS = {key: value for key, value, _ in describe(Config())}


def add_config_flag(p: argparse.ArgumentParser, key: str, *aliases: str, default: str = "") -> None:
    """The flag for a config key, spelt as ``serve`` spells it, so every subcommand that
    takes the setting speaks one vocabulary; ``aliases`` keep older spellings working."""
    spec = SPECS_BY_KEY[key]
    shown = default or _DEFAULTS[key]
    help_text = f"{spec.help} (default: {shown})" if shown != "(not set)" else spec.help
    dest = _dest(key)
    if spec.parse is parse_bool:
        p.add_argument(
            spec.flag,
            dest=dest,
            action=argparse.BooleanOptionalAction,
            default=None,
            help=help_text,
        )
        return
    p.add_argument(
        spec.flag, *aliases, dest=dest, metavar=key.rpartition(".")[2].upper(), help=help_text
    )


def _dest(key: str) -> str:
    return key.replace(".", "_")


def config_flags(args: argparse.Namespace, keys: tuple[str, ...]) -> dict[str, object]:
    return {key: getattr(args, _dest(key), None) for key in keys}


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="run the sidecar next to a vLLM server",
        description="Watch a vLLM server and export its KV-cache capacity, headroom and risk. "
        "Each flag is also a key in the YAML file (--config.file) and a KV_HEADROOM_* variable; "
        "flags win over the environment, which wins over the file.",
    )
    p.add_argument(
        "--config.file", dest="config_file", metavar="FILE", help="YAML configuration file"
    )
    for key in SERVE_FLAGS:
        add_config_flag(p, key)
    p.add_argument(
        "--check-config",
        action="store_true",
        help="validate the configuration and the paths it names, print it, and exit",
    )
    p.set_defaults(func=run)


def config_error(command: str, e: ConfigError) -> None:
    """One line per problem, each naming the file, variable or flag it came from."""
    for problem in e.problems:
        print(f"kv-headroom {command}: {problem}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    flags = {"config.file": args.config_file, **config_flags(args, SERVE_FLAGS)}
    try:
        config = load_config(flags, os.environ)
    except ConfigError as e:
        config_error("serve", e)
        return EXIT_BAD_CONFIG
    if args.check_config:
        problems = check_paths(config)
        if problems:
            config_error("serve", ConfigError(problems))
            return EXIT_BAD_CONFIG
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
