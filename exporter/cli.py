"""``kv-headroom``: the command line. Subcommands live in their own modules."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from exporter import __version__, demo_cli, plan_cli, serve_cli
from exporter.errors import InputError

EXIT_BAD_INPUT = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kv-headroom",
        description="KV-cache capacity and headroom for vLLM: plan before a deploy, "
        "watch while it serves.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve_cli.add_parser(sub)
    demo_cli.add_parser(sub)
    plan_cli.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except InputError as e:
        print(f"kv-headroom {args.command}: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return code


if __name__ == "__main__":
    sys.exit(main())
