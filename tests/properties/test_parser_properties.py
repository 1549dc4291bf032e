"""Properties of the /metrics parser over generated pages: what is written is read back,
and whatever arrives, what comes out is bounded and sane."""

from __future__ import annotations

import math
from typing import Literal

from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.cache_config import MAX_VALUE
from exporter.labels import MAX_ENGINES, MAX_LABEL_VALUE_LENGTH
from exporter.sources.vllm_page import MAX_PROBLEMS, VllmPage, parse_labels, parse_page

# Text as label values carry it: anything printable or not, but no lone surrogates.
NO_SURROGATES: tuple[Literal["Cs"]] = ("Cs",)
label_text = st.text(st.characters(exclude_categories=NO_SURROGATES), max_size=40)
label_names = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,12}", fullmatch=True)
counts = st.floats(min_value=0, max_value=MAX_VALUE, allow_nan=False)


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def labels_text(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{escape(v)}"' for k, v in labels.items())


@settings(derandomize=True, database=None)
@given(st.dictionaries(label_names, label_text, max_size=6))
def test_escaped_labels_read_back_as_written(labels: dict[str, str]) -> None:
    assert parse_labels(labels_text(labels)) == labels


@st.composite
def engine_series(draw: st.DrawFn) -> tuple[str, dict[str, float], str]:
    engine = draw(st.from_regex(r"[0-9a-z]{1,3}", fullmatch=True))
    values = {
        "vllm:num_requests_running": draw(counts),
        "vllm:num_requests_waiting": draw(counts),
        "vllm:kv_cache_usage_perc": draw(st.floats(0, 1)),
        "vllm:num_preemptions_total": draw(counts),
    }
    model = draw(label_text)
    return engine, values, model


_FIELDS = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_usage",
    "vllm:num_preemptions_total": "preemptions",
}


@settings(derandomize=True, database=None)
@given(
    st.lists(engine_series(), min_size=1, max_size=4, unique_by=lambda e: e[0]),
    st.lists(st.sampled_from(["# HELP x y", "", "other_metric 1", "# TYPE vllm:x gauge"])),
    st.randoms(use_true_random=False),
)
def test_a_generated_page_reads_back_every_engine_and_value(
    engines: list[tuple[str, dict[str, float], str]], noise: list[str], rnd: object
) -> None:
    lines = list(noise)
    for engine, values, model in engines:
        base = labels_text({"engine": engine, "model_name": model})
        lines += [f"{name}{{{base}}} {v!r}" for name, v in values.items()]
        lines.append(f'vllm:cache_config_info{{block_size="16",engine="{engine}"}} 1.0')
    rnd.shuffle(lines)  # type: ignore[attr-defined]
    page = parse_page("\n".join(lines) + "\n")
    assert {e.engine for e in page.engines} == {e for e, _, _ in engines}
    for engine, values, model in engines:
        read = page.engine(engine)
        assert read is not None
        assert read.model_name == model[:MAX_LABEL_VALUE_LENGTH] or len(model) > 256
        for name, v in values.items():
            assert getattr(read, _FIELDS[name]) == v


def assert_sane(page: VllmPage) -> None:
    assert len(page.engines) <= MAX_ENGINES
    assert len(page.problems) <= MAX_PROBLEMS + 1
    for e in page.engines:
        assert len(e.engine) <= MAX_LABEL_VALUE_LENGTH
        for name in ("running", "waiting", "kv_usage", "preemptions", "prompt_tokens"):
            v = getattr(e, name)
            assert v is None or (math.isfinite(v) and 0 <= v <= MAX_VALUE)
        assert e.kv_usage is None or e.kv_usage <= 1
        for hist in (e.prompt_len, e.generation_len, e.n_param, e.max_tokens_param):
            assert hist is None or all(math.isfinite(c) and c >= 0 for c in hist.counts)
        for v in (e.cache_config or {}).values():
            assert len(v) <= MAX_LABEL_VALUE_LENGTH


@settings(derandomize=True, database=None, max_examples=300)
@given(st.text(max_size=2000))
def test_arbitrary_text_never_raises_and_reads_sane(text: str) -> None:
    assert_sane(parse_page(text))


values = st.sampled_from(["NaN", "+Inf", "-Inf", "-1", "1e400", "0x10", "", "1 2 3", "5"])


@settings(derandomize=True, database=None)
@given(st.lists(st.tuples(st.sampled_from(list(_FIELDS)), values), max_size=20))
def test_bad_values_read_as_missing_never_as_numbers_out_of_range(
    samples: list[tuple[str, str]],
) -> None:
    text = "".join(f'{name}{{engine="0"}} {v}\n' for name, v in samples)
    assert_sane(parse_page(text))
