import argparse

import pytest

from exporter.cli_args import bounded_float

FRACTION = bounded_float(1, "a fraction", "0.9")


def test_a_bounded_float_accepts_its_upper_bound() -> None:
    assert FRACTION("1") == 1.0


@pytest.mark.parametrize("text", ["0", "1.01", "-0.5", "nan", "abc", ""])
def test_a_bounded_float_refuses_what_is_outside_zero_to_its_bound(text: str) -> None:
    with pytest.raises(
        argparse.ArgumentTypeError, match=r"must be a fraction in \(0, 1\], e.g. 0.9"
    ):
        FRACTION(text)


def test_a_bounded_float_names_a_whole_bound_without_a_decimal_point() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"in \(0, 1000\], e.g. 5$"):
        bounded_float(1000, "a number", "5")("1001")
