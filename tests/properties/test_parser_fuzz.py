"""A bounded, reproducible fuzz run of the parser and of the poll pipeline behind it.

Real vLLM pages (every fixture) are mutated — bytes cut, text inserted, lines duplicated,
values swapped for NaN, ±Inf, negatives or garbage, pages truncated — and fed to the
parser and to a real Poller through the same page check the HTTP client applies. Nothing
may raise; what comes out stays within the parser's bounds; every rendering is a valid
exposition. ``derandomize`` makes the run the same on every machine: the README quotes
its case counts (PARSER_CASES + PIPELINE_CASES).
"""

from __future__ import annotations

import asyncio
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.config import Config
from exporter.poller import Poller, PollerDeps
from exporter.sources.records import ModelCard
from exporter.sources.vllm import SourceError, read_page
from exporter.sources.vllm_page import parse_page
from tests.conftest import FIXTURES
from tests.exposition import families_by_name
from tests.properties.test_parser_properties import assert_sane
from tests.sidecar.conftest import TINYLLAMA

PARSER_CASES = 2000
PIPELINE_CASES = 300
PAGES = [p.read_text() for p in sorted((FIXTURES / "vllm").glob("*.txt"))]
TOKENS = ["NaN", "+Inf", "-Inf", "-1", "1e400", "1e308", "0", "abc", "", '"', "{", "}", "\\"]


@st.composite
def mutated_page(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(PAGES))
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["cut", "insert", "duplicate", "value", "truncate"]))
        at = draw(st.integers(0, max(0, len(text) - 1)))
        if kind == "cut":
            text = text[:at] + text[at + draw(st.integers(1, 200)) :]
        elif kind == "insert":
            text = text[:at] + draw(st.text(max_size=30)) + text[at:]
        elif kind == "truncate":
            text = text[:at]
        else:
            lines = text.split("\n")
            i = draw(st.integers(0, max(0, len(lines) - 1)))
            if kind == "duplicate":
                lines.insert(i, lines[i])
            elif " " in lines[i]:
                head, _, _ = lines[i].rpartition(" ")
                lines[i] = f"{head} {draw(st.sampled_from(TOKENS))}"
            text = "\n".join(lines)
    return text


@settings(
    max_examples=PARSER_CASES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(mutated_page())
def test_mutated_real_pages_parse_within_bounds(text: str) -> None:
    assert_sane(parse_page(text))


class _PageClient:
    """vLLM's answers as the HTTP client hands them on: one page body per poll."""

    def __init__(self) -> None:
        self.body = b""

    async def metrics(self) -> object:
        return read_page(self.body)

    async def models(self) -> ModelCard:
        return ModelCard(("tinyllama",), 2048, "tinyllama")

    async def version(self) -> str:
        return "0.32.0"


CLIENT = _PageClient()
CLOCK = [1_800_000_000.0]
POLLER = Poller(
    Config(nvml_enabled=False, model_path=TINYLLAMA),
    CLIENT,  # type: ignore[arg-type]
    PollerDeps(clock=lambda: CLOCK[0], find_processes=lambda _p: []),
)


@settings(
    max_examples=PIPELINE_CASES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(mutated_page())
def test_mutated_pages_never_break_a_poll_or_the_exposition(text: str) -> None:
    # One poller across the run: the history carries every mutated page into later polls.
    CLIENT.body = text.encode()
    CLOCK[0] += 2.0
    try:
        read_page(CLIENT.body)
        usable = True
    except SourceError:
        usable = False
    snapshot = asyncio.run(POLLER.poll_once())
    vllm = snapshot.source("vllm")
    assert vllm is not None
    assert vllm.up == usable
    families = families_by_name(POLLER.rendered.decode())
    for samples in families.values():
        for _, v in samples:
            assert not math.isnan(v)
