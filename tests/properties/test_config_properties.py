"""Properties of the configuration loader: whatever the file, environment and flags hold,
it returns a Config or raises one ConfigError whose problems are one line each and say
where they came from; durations read back as written; flags beat env beat file."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.config import _SPECS, Config, ConfigError, load_config

KEYS = [s.key for s in _SPECS]
SECTIONS = sorted({k.partition(".")[0] for k in KEYS})
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=True),
    st.text(max_size=20),
)
yaml_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)
leaf_names = st.sampled_from([k.partition(".")[2] for k in KEYS]) | st.text(max_size=10)
documents = st.one_of(
    yaml_values,
    st.dictionaries(
        st.sampled_from(SECTIONS) | st.text(max_size=8),
        st.dictionaries(leaf_names, yaml_values, max_size=4) | yaml_values,
        max_size=4,
    ),
)


def problems(loading: Callable[[], object]) -> tuple[str, ...]:
    """The problems a load reports; () when it succeeds. Anything else it raises fails."""
    try:
        loading()
    except ConfigError as e:
        return e.problems
    return ()


def load(document: Any, env: dict[str, str] | None = None, **flags: object) -> Config:
    text = yaml.safe_dump(document)

    def read_text(path: str) -> str:
        if path != "/etc/kv.yaml":  # a web config file the document names, say
            raise FileNotFoundError(path)
        return text

    return load_config({"config.file": "/etc/kv.yaml", **flags}, env or {}, read_text=read_text)


@settings(derandomize=True, database=None, max_examples=300, deadline=None)
@given(documents)
def test_any_yaml_document_loads_or_fails_with_one_line_problems(document: Any) -> None:
    for problem in problems(lambda: load(document)):
        assert "\n" not in problem
        assert problem.startswith("/etc/kv.yaml")


@settings(derandomize=True, database=None, max_examples=200, deadline=None)
@given(
    st.dictionaries(st.text(max_size=30).map(lambda s: "KV_HEADROOM_" + s), st.text(max_size=20))
)
def test_any_environment_loads_or_fails_with_one_line_problems(env: dict[str, str]) -> None:
    for problem in problems(lambda: load_config({}, env)):
        assert "\n" not in problem
        assert problem.startswith("env ")


@settings(derandomize=True, database=None)
@given(
    st.integers(0, 99),
    st.integers(0, 59),
    st.integers(0, 59),
    st.integers(0, 999),
)
def test_a_written_duration_reads_back_in_seconds(h: int, m: int, s: int, ms: int) -> None:
    text = f"{h}h{m}m{s}s{ms}ms"
    total = h * 3600 + m * 60 + s + ms / 1000
    if total == 0:
        return
    # The poll settings are made long enough that any timeout is in order with them.
    poll = {"interval": "200h", "window": "200h", "history": "200h"}
    config = load({"vllm": {"timeout": text}, "poll": poll})
    assert abs(config.vllm_timeout_seconds - total) < 1e-6


durations = st.integers(3, 500)


@settings(derandomize=True, database=None)
@given(durations, durations, durations)
def test_a_flag_beats_the_environment_which_beats_the_file(
    in_file: int, in_env: int, in_flag: int
) -> None:
    document = {"poll": {"interval": f"{in_file}s"}}
    env = {"KV_HEADROOM_POLL_INTERVAL": f"{in_env}s"}
    assert load(document).poll_interval_seconds == in_file
    assert load(document, env).poll_interval_seconds == in_env
    flagged = load(document, env, **{"poll.interval": f"{in_flag}s"})
    assert flagged.poll_interval_seconds == in_flag
