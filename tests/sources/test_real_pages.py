"""Real /metrics pages from other projects, read the way the sidecar reads them.

The pages live in ``tests/fixtures/vllm/real/`` (first line of each: source, commit, licence,
what was trimmed; ``tests/fixtures/README.md`` lists them). Every figure asserted here was
read off the page text by hand, so a series the parser misreads fails the test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.sources.vllm import SourceError, read_page
from exporter.sources.vllm_page import VllmPage
from tests.conftest import FIXTURES

REAL = FIXTURES / "vllm" / "real"
RAY_WORKER = "6ad5887a3c1c6cefcfa31b4f9a55bdca247686ca9bcd217726128dc8"


def real_page(name: str) -> bytes:
    return (REAL / name).read_bytes()


@dataclass(frozen=True)
class Seen:
    """One engine's figures as the page states them."""

    engine: str
    model_name: str
    running: float
    waiting: float
    kv_usage: float
    preemptions: float | None
    prompt_tokens: float
    generation_tokens: float
    requests_finished: float | None
    # cache_config_info's figures; None where the page has no cache_config_info
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    dialect: str = "vllm"


# Pages the sidecar must read, and what they say.
READABLE: dict[str, tuple[Seen, ...]] = {
    # V0 (~0.5.0): no engine label (engine "0"), gpu_cache_usage_perc, swapped requests,
    # a cache_config_info without model_name or engine.
    "datadog-v0-0.5-opt125m.txt": (Seen("0", "facebook/opt-125m", 0, 0, 0, 0, 5, 7, 1, 16, 7281),),
    # V1 (>= 0.20, before 0.32): engine label, _created series, speculative decoding,
    # waiting_by_reason, a 29-label cache_config_info with an underscore-led label.
    "lmswitch-v1-deepseek-v4-specdecode.txt": (
        Seen(
            "0",
            "deepseek-v4-flash-vision-exp-ablit-dual",
            0,
            0,
            0,
            0,
            3_675_428,
            44_995,
            26,
            4,
            15_998,
        ),
    ),
    # NVIDIA NIM: vLLM's V0 series without the vllm: prefix, no cache_config_info.
    "datadog-nvidia-nim-llama3.1-8b.txt": (
        Seen(
            "0",
            "meta/llama-3.1-8b-instruct",
            1,
            0,
            0.0002848191398461977,
            None,
            109,
            174,
            5,
            dialect="nim",
        ),
    ),
    # Ray Serve 2.32: every series as ray_vllm:<name> with Ray's labels; one worker, which
    # is the engine. The excerpt keeps neither the preemption counter nor
    # request_success_total.
    "datadog-ray-serve-vllm-excerpt.txt": (
        Seen(
            RAY_WORKER,
            "neuralmagic/Meta-Llama-3.1-70B-Instruct-FP8",
            0,
            0,
            5.882698982295764e-05,
            None,
            58,
            300,
            None,
            dialect="ray-serve",
        ),
    ),
}

# Datadog saved the 0.5 scrape without its final newline. A server never ends a page so;
# the sidecar reads a missing final newline as a body cut short and refuses the page
# (exporter/sources/vllm.py::incomplete), which is the right call for a live scrape.
NO_FINAL_NEWLINE = {"datadog-v0-0.5-opt125m.txt", "datadog-nvidia-nim-llama3.1-8b.txt"}


def served(name: str) -> bytes:
    """The page as the server sent it: the saved copy plus its final newline if lost."""
    body = real_page(name)
    return body + b"\n" if name in NO_FINAL_NEWLINE else body


def test_every_real_page_is_listed() -> None:
    on_disk = {p.name for p in REAL.glob("*.txt")}
    assert on_disk == READABLE.keys()


@pytest.mark.parametrize("name", sorted(READABLE))
def test_real_page_is_read_whole(name: str) -> None:
    page = read_page(served(name))
    assert page.problems == ()
    assert dict(page.limited) == {}
    assert [e.engine for e in page.engines] == [s.engine for s in READABLE[name]]
    assert {page.dialect} == {s.dialect for s in READABLE[name]}
    without_config = any(s.block_size is None for s in READABLE[name])
    assert page.missing == (("cache_config_info",) if without_config else ())
    for seen in READABLE[name]:
        e = page.engine(seen.engine)
        assert e is not None
        assert e.model_name == seen.model_name
        assert (e.running, e.waiting, e.kv_usage) == (seen.running, seen.waiting, seen.kv_usage)
        assert e.preemptions == seen.preemptions
        assert (e.prompt_tokens, e.generation_tokens) == (
            seen.prompt_tokens,
            seen.generation_tokens,
        )
        assert e.requests_finished == seen.requests_finished
        if seen.block_size is None:
            assert e.cache_config is None
            continue
        assert e.cache_config is not None
        assert (e.cache_config.block_size, e.cache_config.num_gpu_blocks) == (
            seen.block_size,
            seen.num_gpu_blocks,
        )


@pytest.mark.parametrize("name", sorted(READABLE))
def test_real_page_agrees_with_prometheus_clients_parser(name: str) -> None:
    text = served(name).decode()
    reference: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if "le" not in s.labels:
                # Each server's name and engine for vLLM's (see exporter/sources/dialects.py).
                name = "vllm:" + s.name.removeprefix("ray_vllm:").removeprefix("vllm:")
                engine = s.labels.get("engine") or s.labels.get("WorkerId") or "0"
                reference[(name, engine)] = s.value
    page = read_page(text.encode())
    for e in page.engines:
        for metric, value in (
            ("vllm:num_requests_running", e.running),
            ("vllm:num_requests_waiting", e.waiting),
            ("vllm:num_preemptions_total", e.preemptions),
            ("vllm:prompt_tokens_total", e.prompt_tokens),
            ("vllm:generation_tokens_total", e.generation_tokens),
        ):
            expected = reference.get((metric, e.engine))
            if expected is None:  # a series this page does not have
                assert value is None, metric
                continue
            assert not math.isnan(expected)
            assert value == expected, metric


def test_a_saved_page_without_its_final_newline_reads_as_truncated() -> None:
    with pytest.raises(SourceError) as info:
        read_page(real_page("datadog-v0-0.5-opt125m.txt"))
    assert info.value.kind == "incomplete"
    assert "ends mid-line" in str(info.value)


def test_v0_05_page_details() -> None:
    page = read_page(served("datadog-v0-0.5-opt125m.txt"))
    (e,) = page.engines
    assert e.swapped == 0
    assert e.waiting_for_capacity is None  # num_requests_waiting_by_reason is 0.20+
    assert page.process_start_time == pytest.approx(1.7181405583e9)
    assert e.prompt_len is not None
    assert (e.prompt_len.count, e.prompt_len.sum, e.prompt_len.bounds[-1]) == (1, 5, 2000)
    assert e.cache_config is not None
    assert e.cache_config.gpu_memory_utilization == pytest.approx(0.9)
    assert e.cache_config.kv_cache_size_tokens is None  # labelled from 0.24 on


def test_v1_spec_decode_page_details() -> None:
    page: VllmPage = read_page(served("lmswitch-v1-deepseek-v4-specdecode.txt"))
    (e,) = page.engines
    assert e.swapped is None  # V1 has no swapping
    assert e.waiting_for_capacity == 0
    assert (e.prefix_queries, e.prefix_hits) == (3_675_428, 3_241_216)
    assert page.process_start_time == pytest.approx(1.78885983325e9)
    cc = e.cache_config
    assert cc is not None
    # vLLM's own token count: not num_gpu_blocks x block_size on this compressed MLA cache.
    assert cc.kv_cache_size_tokens == 1_428_520
    assert cc.cache_dtype == "nvfp4_ds_mla"
    assert cc.enable_prefix_caching is True
    assert cc.gpu_memory_utilization == pytest.approx(0.835)
    assert cc["_block_size_resolved"] == "True"
    assert len(cc) == 28  # 29 labels on the page, less engine
    # Buckets written "1e+06" are read as a bound like any other.
    assert e.prompt_len is not None
    assert e.prompt_len.bounds[-1] == 1e6
    assert (e.prompt_len.count, e.prompt_len.sum) == (26, 3_675_428)
    assert e.max_tokens_param is not None
    assert e.max_tokens_param.sum == 17_876_221


def without_series(text: str, name: str) -> str:
    """The page with every sample of ``name`` removed (its HELP and TYPE lines kept), as an
    exporter that never sets the gauge serves it."""
    return "".join(
        line for line in text.splitlines(keepends=True) if not line.startswith(name + "{")
    )


def test_an_old_page_without_running_requests_is_read_for_what_it_has() -> None:
    page_text = served("datadog-v0-0.5-opt125m.txt").decode()
    text = without_series(page_text, "vllm:num_requests_running")
    assert "vllm:num_requests_running{" not in text  # the fixture's one sample is gone
    page = read_page(text.encode())
    (e,) = page.engines
    (seen,) = READABLE["datadog-v0-0.5-opt125m.txt"]
    assert e.running is None
    assert (e.waiting, e.kv_usage, e.preemptions) == (seen.waiting, seen.kv_usage, seen.preemptions)
    assert page.missing == ("num_requests_running",)
