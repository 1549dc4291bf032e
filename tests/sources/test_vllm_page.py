"""The /metrics parser reads what the sidecar needs from every release's pages."""

from __future__ import annotations

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.sources.vllm_page import _WANTED_LINES, WANTED_SERIES, parse_labels, parse_page
from tests.conftest import FIXTURES

PAGES = sorted(p.name for p in (FIXTURES / "vllm").glob("*.txt"))


def page(name: str) -> str:
    return (FIXTURES / "vllm" / name).read_text()


def with_second_engine(text: str) -> str:
    """The 0.32 page as a data-parallel server with engines 0 and 1 would expose it."""
    lines = []
    for line in text.splitlines():
        lines.append(line)
        if line.startswith("vllm:") and 'engine="0"' in line:
            lines.append(line.replace('engine="0"', 'engine="1"'))
    return "\n".join(lines) + "\n"


def test_v1_032_page_reads_preemptions_usage_and_cache_config() -> None:
    p = parse_page(page("vllm-0.32-cpu-preempted.txt"))
    (e,) = p.engines
    assert e.model_name == "tinyllama"
    assert e.preemptions == 29
    assert e.requests_finished == 40
    assert e.kv_usage == 0
    assert e.cache_config is not None
    assert e.cache_config["num_gpu_blocks"] == "48"
    assert e.cache_config["kv_cache_size_tokens"] == "6144"


def test_cache_config_info_is_typed_by_the_parser() -> None:
    (e,) = parse_page(page("vllm-0.32-cpu-preempted.txt")).engines
    cc = e.cache_config
    assert cc is not None
    assert (cc.num_gpu_blocks, cc.block_size, cc.kv_cache_size_tokens) == (48, 128, 6144)
    assert cc.num_gpu_blocks_override == 48  # the capture pinned the block count
    assert cc.gpu_memory_utilization == pytest.approx(0.92)
    assert cc.cache_dtype == "auto"


@pytest.mark.parametrize("text", ["128.5", "1e400", "nan", "lots"])
def test_a_cache_config_count_that_is_no_count_reads_as_unset(text: str) -> None:
    line = f'vllm:cache_config_info{{block_size="16",engine="0",num_gpu_blocks="{text}"}} 1.0\n'
    (e,) = parse_page(line).engines
    assert e.cache_config is not None
    assert e.cache_config.num_gpu_blocks is None
    assert e.cache_config["num_gpu_blocks"] == text


def test_token_histograms_keep_buckets_sum_and_count() -> None:
    (e,) = parse_page(page("vllm-0.32-cpu-preempted.txt")).engines
    assert e.prompt_len is not None
    assert e.prompt_len.bounds[-1] == 2000
    assert e.prompt_len.counts[-1] == e.prompt_len.count == 40
    assert e.prompt_len.sum == 17416
    assert e.n_param is not None
    assert e.n_param.sum / e.n_param.count == 1


def test_v0_page_reads_the_deprecated_names() -> None:
    (e,) = parse_page(page("vllm-v0-aibrix-partial.txt")).engines
    assert e.kv_usage == 0
    assert e.swapped == 0
    assert e.cache_config is not None
    assert e.cache_config["num_gpu_blocks"] == "81767"


def test_current_name_wins_over_the_deprecated_one() -> None:
    text = (
        'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.9\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.4\n'
    )
    assert parse_page(text).engines[0].kv_usage == 0.4


def test_data_parallel_engines_are_read_separately() -> None:
    p = parse_page(with_second_engine(page("vllm-0.32-cpu-preempted.txt")))
    assert [e.engine for e in p.engines] == ["0", "1"]
    assert p.engines[1].preemptions == 29
    assert p.engines[1].cache_config is not None


def test_nan_is_read_as_missing() -> None:
    text = 'vllm:kv_cache_usage_perc{engine="0",model_name="m"} NaN\n'
    (e,) = parse_page(text).engines
    assert e.kv_usage is None


def test_duplicate_series_keeps_the_last_value_and_says_so() -> None:
    text = (
        'vllm:num_requests_running{engine="0",model_name="m"} 1\n'
        'vllm:num_requests_running{engine="0",model_name="m"} 2\n'
    )
    p = parse_page(text)
    assert p.engines[0].running == 2
    assert any("duplicate series" in problem for problem in p.problems)


def test_a_page_cut_mid_line_keeps_what_came_before() -> None:
    text = page("vllm-0.32-cpu-preempted.txt")
    cut = text.index("vllm:num_preemptions_total") + 40
    p = parse_page(text[:cut])
    assert p.engines[0].running == 0
    assert p.engines[0].cache_config is None


def test_garbage_has_no_engines() -> None:
    assert parse_page("<html><body>502 Bad Gateway</body></html>").engines == ()


def test_labels_with_escapes_commas_and_braces() -> None:
    labels = parse_labels(r'a="x\"y",b="1,2}",c="line\nbreak"')
    assert labels == {"a": 'x"y', "b": "1,2}", "c": "line\nbreak"}


def test_malformed_labels_are_rejected() -> None:
    assert parse_labels('a="1"b="2"') is None
    assert parse_labels("a=1") is None


@pytest.mark.parametrize("name", PAGES)
def test_values_agree_with_prometheus_clients_own_parser(name: str) -> None:
    text = page(name)
    reference: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("vllm:") and "le" not in s.labels:
                reference[(s.name, s.labels.get("engine", "0"))] = s.value
    p = parse_page(text)
    checked = 0
    for e in p.engines:
        for metric, attr in (
            ("vllm:num_requests_running", "running"),
            ("vllm:num_requests_waiting", "waiting"),
            ("vllm:num_preemptions_total", "preemptions"),
            ("vllm:generation_tokens_total", "generation_tokens"),
        ):
            expected = reference.get((metric, e.engine))
            if expected is not None and not math.isnan(expected):
                assert getattr(e, attr) == expected
                checked += 1
    assert checked > 0


def test_a_series_whose_name_begins_or_ends_like_a_wanted_one_is_not_read() -> None:
    text = (
        'vllm:num_requests_waiting{engine="0"} 3\n'
        'vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 2\n'
        'vllm:num_requests_waiting_total{engine="0"} 99\n'
        'vllm:num_requests_waitin{engine="0"} 98\n'
        'vllm:num_requests_running{engine="0"} 1\n'
        'vllm:kv_cache_usage_perc{engine="0"} 0.5\n'
    )
    (e,) = parse_page(text).engines
    assert (e.waiting, e.waiting_for_capacity, e.running) == (3, 2, 1)
    assert not parse_page(text).problems


@pytest.mark.parametrize("name", sorted(WANTED_SERIES))
def test_every_wanted_series_is_picked_out_of_a_page_by_name(name: str) -> None:
    line = f'{name}{{engine="0"}} 1\n'
    assert _WANTED_LINES.findall("\n" + line) == [(name, '{engine="0"} 1')]
    assert _WANTED_LINES.findall(f"\n{name}x{{}} 1\n\n{name[:-1]}{{}} 1\n") == []


def test_a_blank_between_a_name_and_its_labels_is_no_series_and_no_problem() -> None:
    text = (
        'vllm:num_requests_running {engine="0"} 7\n'
        'vllm:num_requests_running{engine="0"} 1\n'
        'vllm:kv_cache_usage_perc{engine="0"} 0.5\n'
    )
    p = parse_page(text)
    assert p.engines[0].running == 1
    assert not p.problems
