"""Argument types shared by the subcommands' parsers.

A type raises ``argparse.ArgumentTypeError`` with the value and what is allowed;
``cli.Parser`` turns that into one line naming the flag and exit 2.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def bounded_float(high: float, what: str, example: str) -> Callable[[str], float]:
    """A float in (0, ``high``]: ``what`` names it in the error ("a fraction"), and
    ``example`` is a value that would do."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not 0 < value <= high:  # NaN fails this too
            raise argparse.ArgumentTypeError(
                f"{text!r}: must be {what} in (0, {high:g}], e.g. {example}"
            )
        return value

    return parse
