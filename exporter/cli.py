"""``kv-headroom``: the command line. Subcommands live in their own modules.

Every subcommand's parser is a ``Parser``: a bad argument answers with one line naming the
flag and exit 2 (argparse's own habit is a usage dump), help shows each default, and a
closed pipe (``plan … | head -1``) ends the command quietly.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from exporter import __version__, demo_cli, serve_cli
from exporter.errors import InputError
from exporter.plan import cli as plan_cli

EXIT_OK, EXIT_BAD_INPUT = 0, 2
_TYPE_ERROR = re.compile(r"^argument (\S+): ('.*)$", re.S)


class HelpFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` where a flag has a default worth showing.

    argparse's ArgumentDefaultsHelpFormatter also prints ``(default: None)`` and
    ``(default: False)``, which say nothing; serve's flags default to None at this layer
    (the config file and environment fill them), so their help text names the default.
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "%(default)" in text
            or "default" in text
            or default is None
            or default is argparse.SUPPRESS
            or isinstance(default, bool)
            or default == []
            or not action.option_strings
        ):
            return text
        return f"{text} (default: %(default)s)".strip()


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line and whose values may start with '-',
    and which names a mistyped flag (with the flag meant) before anything else."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        # argparse reads "-80GB" as an unknown option and answers "expected one argument";
        # read it as the value it is, so the flag's own check can say what is wrong with it.
        self._negative_number_matcher = re.compile(r"^-\.?\d[\d.]*[a-zA-Z]*$")
        self._seen: list[str] = []

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._seen = list(sys.argv[1:] if args is None else args)
        parsed, extras = super().parse_known_args(self._seen, namespace)
        # A subcommand's parser hands what it did not know back to the top parser, whose
        # answer ("unrecognized arguments") cannot say which flag was meant.
        unknown = self._unknown_flag(extras)
        if unknown:
            self.error(unknown)
        return parsed, extras

    def _unknown_flag(self, args: Sequence[str]) -> str | None:
        """For the first argument that looks like a flag this parser lacks: "unknown flag
        --modle; did you mean --model?"; else None."""
        for arg in args:
            if arg == "--":
                return None  # what follows is positional
            if not arg.startswith("-") or self._negative_number_matcher.match(arg):
                continue
            flag = arg.partition("=")[0]
            if flag in self._option_string_actions or (
                flag.startswith("--") and any(o.startswith(flag) for o in self._long_flags())
            ):
                continue  # a flag, or an abbreviation argparse resolves
            close = difflib.get_close_matches(flag, self._long_flags(), n=1, cutoff=0.6)
            return f"unknown flag {flag}" + (f"; did you mean {close[0]}?" if close else "")
        return None

    def _long_flags(self) -> list[str]:
        return [o for o in self._option_string_actions if o.startswith("--")]

    def error(self, message: str) -> NoReturn:
        # A missing required flag is often a mistyped one (`plan --modle X`): name the typo,
        # which is what the user has to fix, not the flag argparse found missing.
        if "required" in message:
            message = self._unknown_flag(self._seen) or message
        # "argument --gpu: '-80GB': …" from a flag's own check reads as every other bad
        # input does: "--gpu = '-80GB': …".
        m = _TYPE_ERROR.match(message)
        if m:
            message = f"{m.group(1).partition('/')[0]} = {m.group(2)}"
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
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


def _quiet_stdout() -> None:
    """After the reader of a pipe has gone: point stdout at /dev/null so the interpreter's
    final flush cannot raise BrokenPipeError again on the way out."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, --version, or a bad argument already answered
        return e.code if isinstance(e.code, int) else EXIT_BAD_INPUT
    try:
        code: int = args.func(args)
        sys.stdout.flush()
    except InputError as e:
        print(f"kv-headroom {args.command}: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        # `plan … | head -1`: the reader took what it wanted. Not an error, and not exit 1,
        # which plan uses for "vLLM would refuse to start".
        _quiet_stdout()
        return EXIT_OK
    return code


if __name__ == "__main__":
    sys.exit(main())
