"""vLLM's ``/metrics`` page → the few numbers the sidecar needs, per engine. Pure and fast.

A 0.32 page is ~50 KB and 600 series, of which we need about 60: the parser looks at a
line's metric name first and parses labels only for names it wants, which makes it an
order of magnitude faster than a general exposition parser (``benchmarks/poll.py``).

It understands every release's names (V0 ``gpu_cache_usage_perc``/``num_requests_swapped``,
V1 ``kv_cache_usage_perc``, ``cache_config_info`` with whatever labels the release has),
several engines (the ``engine`` label of data-parallel servers; V0 has none and is engine
"0"), NaN (read as missing), duplicate series (last wins, reported) and pages cut short.

Whatever the page holds, what comes out is bounded and sane: every value is a finite count
no larger than 2**53 (±Inf, negatives and a usage above 1 are read as missing, like NaN), at
most ``MAX_ENGINES`` engines, ``MAX_CACHE_CONFIG_LABELS`` cache_config labels per engine,
label values cut to ``MAX_LABEL_VALUE_LENGTH`` characters, and ``MAX_PROBLEMS`` problems.
What was left out is counted in ``VllmPage.limited``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from exporter.cache_config import MAX_VALUE, CacheConfig
from exporter.capacity.histogram import Histogram
from exporter.labels import (
    MAX_CACHE_CONFIG_LABELS,
    MAX_ENGINES,
    MAX_LABEL_VALUE_LENGTH,
    cut_label,
)


@dataclass(frozen=True)
class EngineMetrics:
    """One engine core's figures, as read (counters are raw: they reset when vLLM restarts)."""

    engine: str
    model_name: str | None = None
    running: float | None = None
    waiting: float | None = None
    waiting_for_capacity: float | None = None  # num_requests_waiting_by_reason (0.20+)
    swapped: float | None = None  # V0 only
    kv_usage: float | None = None  # 0-1, blocks held by live requests ÷ (blocks − 1)
    preemptions: float | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    requests_finished: float | None = None  # request_success_total over every reason
    prefix_queries: float | None = None  # tokens (blocks before 0.9)
    prefix_hits: float | None = None
    prompt_len: Histogram | None = None
    generation_len: Histogram | None = None
    max_tokens_param: Histogram | None = None
    n_param: Histogram | None = None
    cache_config: CacheConfig | None = None


MAX_PROBLEMS = 20
# The labels the sidecar reads; kept first when cache_config_info has too many.
_CACHE_CONFIG_KEPT = (
    "block_size",
    "num_gpu_blocks",
    "num_gpu_blocks_override",
    "kv_cache_size_tokens",
    "kv_cache_memory_bytes",
    "cpu_kvcache_space_bytes",
    "cache_dtype",
    "gpu_memory_utilization",
    "enable_prefix_caching",
    "enable_extensible_kv_cache",
    "mamba_cache_dtype",
    "mamba_ssm_cache_dtype",
)


@dataclass(frozen=True)
class VllmPage:
    engines: tuple[EngineMetrics, ...]
    process_start_time: float | None = None
    problems: tuple[str, ...] = field(default=())
    # What a limit left out: engines, cache_config_labels, label_values (cut short).
    limited: Mapping[str, int] = field(default_factory=dict)
    # Series the sidecar reads that this page lacks, by name (e.g. cache_config_info):
    # the page is used for what it has.
    missing: tuple[str, ...] = ()
    # Whose page: "vllm", or a server that re-exports vLLM's series (sources/dialects.py).
    dialect: str = "vllm"

    def engine(self, name: str) -> EngineMetrics | None:
        return next((e for e in self.engines if e.engine == name), None)


# Exposed name → field, for plain samples. Several releases' names map to one field.
_SCALARS: dict[str, str] = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:num_requests_swapped": "swapped",
    "vllm:kv_cache_usage_perc": "kv_usage",
    "vllm:gpu_cache_usage_perc": "kv_usage",
    "vllm:num_preemptions_total": "preemptions",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:generation_tokens_total": "generation_tokens",
    "vllm:prefix_cache_queries_total": "prefix_queries",
    "vllm:prefix_cache_hits_total": "prefix_hits",
    "vllm:gpu_prefix_cache_queries_total": "prefix_queries",
    "vllm:gpu_prefix_cache_hits_total": "prefix_hits",
}
# V1 0.9.2-0.11 expose both names; the current one wins over the deprecated one.
_DEPRECATED = frozenset(
    {
        "vllm:gpu_cache_usage_perc",
        "vllm:gpu_prefix_cache_queries_total",
        "vllm:gpu_prefix_cache_hits_total",
    }
)
_SUMMED = {"vllm:request_success_total": "requests_finished"}
_HISTOGRAMS = {
    "vllm:request_prompt_tokens": "prompt_len",
    "vllm:request_generation_tokens": "generation_len",
    "vllm:request_params_max_tokens": "max_tokens_param",
    "vllm:request_params_n": "n_param",
}
_HIST_PARTS = {
    f"{base}{suffix}": (base, suffix)
    for base in _HISTOGRAMS
    for suffix in ("_bucket", "_sum", "_count")
}
_USAGE = frozenset({"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"})
_CACHE_CONFIG = "vllm:cache_config_info"
_WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"
_START_TIME = "process_start_time_seconds"
_WANTED = frozenset(
    [*_SCALARS, *_SUMMED, *_HIST_PARTS, _CACHE_CONFIG, _WAITING_BY_REASON, _START_TIME]
)


def _alternatives(names: Iterable[str]) -> str:
    """A regex matching exactly ``names``, written as a trie: names that share a prefix
    share its branch (``num_requests_(?:running|waiting)``). Python's regex engine tries a
    flat alternation's branches one by one at each line; the trie decides by a character
    or two, which halved the page scan (85 → 45 µs on vLLM 0.32's page)."""
    by_first: dict[str, list[str]] = {}
    for name in sorted(set(names)):
        by_first.setdefault(name[:1], []).append(name[1:])
    ends = "" in by_first  # a name ends here; others go on
    branches = [re.escape(c) + _alternatives(rest) for c, rest in by_first.items() if c]
    if not branches:
        return ""
    body = branches[0] if len(branches) == 1 and not ends else f"(?:{'|'.join(branches)})"
    return f"{body}?" if ends else body


# A line that starts with a wanted name, then its labels or a blank. The leading newline is
# a literal the regex engine scans for in C (the text gets one prepended for its first
# line). The blank or brace after the name ends it, so a name that ends where a longer
# one goes on (``num_requests_waiting``, ``..._by_reason``) matches only whole.
_VLLM_NAMES = _alternatives(n.removeprefix("vllm:") for n in _WANTED if n.startswith("vllm:"))
_OTHER_NAMES = _alternatives(n for n in _WANTED if not n.startswith("vllm:"))
# Name and the rest of the line come back apart, so the loop never looks for the name.
_WANTED_LINES = re.compile(f"\n((?:vllm:(?:{_VLLM_NAMES})|{_OTHER_NAMES}))([{{ \t][^\n]*)")
# Every series name the parser reads (dialects.py rewrites other servers' names into these).
WANTED_SERIES = _WANTED
START_TIME_SERIES = _START_TIME

_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = re.compile(r"\\(.)")


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return _UNESCAPE.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def parse_labels(text: str) -> dict[str, str] | None:
    """``a="1",b="x\\"y"`` → dict; None when the label set is malformed."""
    if "\\" not in text and '=",' not in text:
        # Without escapes a quote cannot occur inside a value, so '",' only separates pairs
        # (unless a value begins with a comma, which the general path below reads).
        labels: dict[str, str] = {}
        body = text.strip().rstrip(",")
        if not body:
            return labels
        for part in body.split('",'):
            key, sep, value = part.partition('="')
            key = key.strip().lstrip(",").strip()
            if not sep or not key.isidentifier() or '"' in value.rstrip('"'):
                return None
            labels[key] = value[:-1] if value.endswith('"') else value
        return labels if body.endswith('"') else None
    labels = {}
    pos = 0
    for m in _LABEL.finditer(text):
        if m.start() != pos:
            return None
        labels[m.group(1)] = _unescape(m.group(2))
        pos = m.end()
    return labels if pos == len(text.rstrip()) else None


_LABEL_CACHE: dict[str, dict[str, str] | None] = {}
_LABEL_CACHE_MAX = 4096
# Only ordinary label sets are cached: a hostile page of long, ever-changing label sets
# would otherwise pin up to _LABEL_CACHE_MAX of them, megabytes each, across polls.
_LABEL_CACHE_TEXT_MAX = 2048


def _labels_cached(text: str) -> dict[str, str] | None:
    """Label sets repeat from poll to poll; parse each distinct one once (bounded cache).

    The dicts are shared: callers must not change them.
    """
    labels = _LABEL_CACHE.get(text)
    if labels is None and text not in _LABEL_CACHE:
        if len(text) > _LABEL_CACHE_TEXT_MAX:
            return parse_labels(text)
        if len(_LABEL_CACHE) >= _LABEL_CACHE_MAX:
            _LABEL_CACHE.clear()
        labels = _LABEL_CACHE[text] = parse_labels(text)
    return labels


def _value(text: str) -> float | None:
    """A sample value the sidecar can count with; None for NaN, ±Inf, negatives, absurd."""
    try:
        v = float(text)
    except ValueError:
        return None
    return v if 0.0 <= v <= MAX_VALUE else None


def _bound(text: str) -> float | None:
    """A histogram bucket's ``le``: a finite value or +Inf."""
    try:
        v = float(text)
    except ValueError:
        return None
    return v if v == math.inf or 0.0 <= v <= MAX_VALUE else None


def _cut(value: str, limited: dict[str, int]) -> str:
    if len(value) <= MAX_LABEL_VALUE_LENGTH:
        return value
    limited["label_values"] = limited.get("label_values", 0) + 1
    return cut_label(value)


def _cache_config(labels: Mapping[str, str], limited: dict[str, int]) -> CacheConfig:
    keys = [k for k in labels if k != "engine"]
    if len(keys) > MAX_CACHE_CONFIG_LABELS:
        wanted = set(_CACHE_CONFIG_KEPT)
        keys.sort(key=lambda k: k not in wanted)  # stable: the page's order otherwise
        dropped = len(keys) - MAX_CACHE_CONFIG_LABELS
        limited["cache_config_labels"] = limited.get("cache_config_labels", 0) + dropped
        keys = keys[:MAX_CACHE_CONFIG_LABELS]
    return CacheConfig.from_labels({k: _cut(labels[k], limited) for k in keys})


# cache_config_info's labels change only when vLLM restarts: each label set is typed once
# (bounded like the label cache), with what its cuts counted against the limits.
_CACHE_CONFIGS: dict[str, tuple[CacheConfig, dict[str, int]]] = {}
_CACHE_CONFIGS_MAX = 64


def _cache_config_cached(
    label_text: str, labels: Mapping[str, str], limited: dict[str, int]
) -> CacheConfig:
    hit = _CACHE_CONFIGS.get(label_text)
    if hit is None:
        counted: dict[str, int] = {}
        hit = (_cache_config(labels, counted), counted)
        if len(label_text) <= _LABEL_CACHE_TEXT_MAX:
            if len(_CACHE_CONFIGS) >= _CACHE_CONFIGS_MAX:
                _CACHE_CONFIGS.clear()
            _CACHE_CONFIGS[label_text] = hit
    config, counted = hit
    for limit, n in counted.items():
        limited[limit] = limited.get(limit, 0) + n
    return config


class _Engine:
    __slots__ = ("buckets", "fields", "hist_count", "hist_sum", "model_name", "seen", "summed")

    def __init__(self) -> None:
        self.fields: dict[str, float | None] = {}
        self.summed: dict[str, float] = {}
        self.buckets: dict[str, list[tuple[float, float]]] = {}
        self.hist_sum: dict[str, float] = {}
        self.hist_count: dict[str, float] = {}
        self.model_name: str | None = None
        self.seen: set[tuple[str, str]] = set()


def parse_page(text: str) -> VllmPage:
    """Read the wanted series of a Prometheus text page; skip everything else unparsed."""
    engines: dict[str, _Engine] = {}
    cache_configs: dict[str, CacheConfig] = {}
    problems = _Problems()
    limited: dict[str, int] = {}
    start_time: float | None = None

    if "\r" in text:
        text = text.replace("\r\n", "\n")
    cached = _LABEL_CACHE  # a local: read in the loop
    # One C-level scan picks the lines of wanted series (~70 of a page's ~600), the name
    # apart from the rest; comments, other series and other exporters' lines are never
    # looked at in Python.
    for name, after in _WANTED_LINES.findall("\n" + text):
        if after[0] == "{":
            end = after.rfind("}")
            label_text = after[1:end]
            rest = after[end + 1 :].split() if end > 0 else []
        elif "{" in after:  # ``name {...}``: no series of ours
            continue
        else:
            rest = after.split()
            label_text = ""
        if not rest or len(rest) > 2:
            problems.add(f"unparsable line: {(name + after)[:80]!r}")
            continue
        value_text = rest[0]
        labels = cached.get(label_text)
        if labels is None:
            labels = _labels_cached(label_text)
            if labels is None:
                problems.add(f"malformed labels: {(name + after)[:80]!r}")
                continue
        hist = _HIST_PARTS.get(name)
        if name == _START_TIME:
            start_time = _value(value_text)
            continue
        key = labels.get("engine", "0")
        if len(key) > MAX_LABEL_VALUE_LENGTH:
            key = _cut(key, limited)
        if (
            key not in engines
            and key not in cache_configs
            and len(engines.keys() | cache_configs.keys()) >= MAX_ENGINES
        ):
            limited["engines"] = limited.get("engines", 0) + 1
            continue
        if name == _CACHE_CONFIG:
            cache_configs[key] = _cache_config_cached(label_text, labels, limited)
            continue
        value = _value(value_text)
        eng = engines.get(key)
        if eng is None:
            eng = engines[key] = _Engine()
        if eng.model_name is None and "model_name" in labels:
            eng.model_name = _cut(labels["model_name"], limited)
        series_id = (name, label_text)
        if series_id in eng.seen:
            problems.add(f"duplicate series {name}{{{label_text[:80]}}}: last value kept")
        eng.seen.add(series_id)
        if value is None:
            if value_text.lower() != "nan":
                problems.add(f"bad value {value_text[:40]!r} for {name}")
            continue
        if name in _USAGE and value > 1.0:
            problems.add(f"bad value {value_text[:40]!r} for {name}: above 1")
            continue
        if hist is not None:
            base, suffix = hist
            if suffix == "_bucket":
                le = labels.get("le")
                bound = _bound(le) if le is not None else None
                if bound is not None:
                    eng.buckets.setdefault(base, []).append((bound, value))
            elif suffix == "_sum":
                eng.hist_sum[base] = value
            else:
                eng.hist_count[base] = value
        elif name in _SCALARS:
            field_name = _SCALARS[name]
            if name in _DEPRECATED and field_name in eng.fields:
                continue
            eng.fields[field_name] = value
        elif name in _SUMMED:
            eng.summed[_SUMMED[name]] = eng.summed.get(_SUMMED[name], 0.0) + value
        elif name == _WAITING_BY_REASON and labels.get("reason") == "capacity":
            eng.fields["waiting_for_capacity"] = value

    for key in cache_configs:
        engines.setdefault(key, _Engine())
    if problems.more:
        problems.append(f"… and {problems.more} more")
    return VllmPage(
        engines=tuple(
            _build(key, eng, cache_configs.get(key)) for key, eng in sorted(engines.items())
        ),
        process_start_time=start_time,
        problems=tuple(problems),
        limited=limited,
    )


class _Problems(list[str]):
    """The first MAX_PROBLEMS problems, and how many more there were."""

    more = 0

    def add(self, text: str) -> None:
        if len(self) < MAX_PROBLEMS:
            self.append(text)
        else:
            self.more += 1


def _build(key: str, eng: _Engine, cache_config: CacheConfig | None) -> EngineMetrics:
    hists: dict[str, Histogram | None] = {}
    for base, field_name in _HISTOGRAMS.items():
        buckets = eng.buckets.get(base)
        if not buckets or base not in eng.hist_count:
            hists[field_name] = None
            continue
        buckets.sort()
        finite = [(b, c) for b, c in buckets if math.isfinite(b)]
        total = eng.hist_count[base]
        hists[field_name] = Histogram(
            bounds=tuple(b for b, _ in finite),
            counts=(*(c for _, c in finite), total),
            sum=eng.hist_sum.get(base, 0.0),
            count=total,
        )
    return EngineMetrics(
        engine=key,
        model_name=eng.model_name,
        cache_config=cache_config,
        **eng.fields,  # type: ignore[arg-type]
        **eng.summed,  # type: ignore[arg-type]
        **hists,  # type: ignore[arg-type]
    )
