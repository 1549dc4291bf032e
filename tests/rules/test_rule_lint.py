"""Every rule reads only metrics that exist, every alert says what to do, and every rule
has a promtool test."""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import cache
from pathlib import Path

import pytest

from exporter.metrics import METRICS
from tests.promql import metric_names
from tests.rules.rulefiles import (
    ROOT,
    RUNBOOK,
    RUNBOOK_BASE,
    Rule,
    alerts,
    github_anchor,
    promtool_tests,
    records,
    runbook_anchors,
)

SEVERITIES = {"critical", "warning", "info"}
PROMETHEUS_BUILTINS = {"up"}
_SAMPLE_NAME = re.compile(r"^([A-Za-z_:][\w:]*)")


def _exposed(paths: Iterable[Path]) -> set[str]:
    """Sample names on Prometheus text pages."""
    names = set()
    for path in paths:
        for line in path.read_text().splitlines():
            m = _SAMPLE_NAME.match(line)
            if m and not line.startswith("#"):
                names.add(m.group(1))
    return names


@cache
def sidecar_metrics() -> frozenset[str]:
    from_table = {s.full + ("_total" if s.kind == "counter" else "") for s in METRICS}
    return frozenset(from_table | _exposed(sorted((ROOT / "tests/golden").glob("*.prom"))))


@cache
def vllm_metrics() -> frozenset[str]:
    """What real vLLM pages of several releases expose, and the names the sidecar reads."""
    pages = _exposed(sorted((ROOT / "tests/fixtures/vllm").glob("*.txt")))
    source = (ROOT / "exporter/sources/vllm_page.py").read_text()
    read = set(re.findall(r'"(vllm:[a-z_:]+)"', source))
    histograms = {n + suffix for n in read for suffix in ("_bucket", "_sum", "_count")}
    return frozenset(pages | read | histograms)


def _ids(rule: Rule) -> str:
    return rule.name


def test_metric_names_are_read_from_promql_without_functions_labels_or_keywords() -> None:
    expr = """
      sum by (model, le) (rate(vllm:request_prompt_tokens_bucket{le!="+Inf", a=~"x{1}"}[10m]))
      / on (job, instance) group_left (model) kv_headroom_info
      > 1.5 * model:x:max{percentile="p95"} offset 1d
      and bool up unless ignoring (pid) absent(foo[5m:1m])
      or label_replace(bar, "model_name", "$1", "model", "(.+)") > 1e9 + 0x1F + Inf
    """
    assert metric_names(expr) == {
        "vllm:request_prompt_tokens_bucket",
        "kv_headroom_info",
        "model:x:max",
        "up",
        "foo",
        "bar",
    }


@pytest.mark.parametrize("rule", [*alerts(), *records()], ids=_ids)
def test_rule_reads_only_known_metrics(rule: Rule) -> None:
    known = sidecar_metrics() | vllm_metrics() | {r.name for r in records()} | PROMETHEUS_BUILTINS
    unknown = _read_by(rule) - known
    assert not unknown, f"{rule.name} reads metrics nothing exports: {sorted(unknown)}"


# An annotation may run a query of its own: {{ with printf "..." ... | query }}.
_QUERY = re.compile(r'printf\s+"((?:\\.|[^"\\])*)"[^}]*\|\s*query')


def _read_by(rule: Rule) -> set[str]:
    """The metrics a rule's expression and its annotations' queries read."""
    names = metric_names(rule.expr)
    for text in rule.body.get("annotations", {}).values():
        for query in _QUERY.findall(str(text)):
            names |= metric_names(query.replace('\\"', '"'))
    return names


def test_annotation_queries_count_as_reads() -> None:
    (rule,) = [a for a in alerts() if a.name == "VllmKvCacheConfigOvercommitted"]
    assert "kv_headroom_recommended_max_num_seqs" in _read_by(rule)


# Records with no operation to name: a figure of their own (days), not an aggregation of a
# metric. The runway's name is the one issue 36 gave it, which dashboards and tickets quote.
LEVEL_METRIC_ONLY = frozenset({"model:kv_headroom_runway_days"})


@pytest.mark.parametrize("rule", records(), ids=_ids)
def test_record_is_named_level_metric_operations(rule: Rule) -> None:
    if rule.name in LEVEL_METRIC_ONLY:
        assert re.fullmatch(r"[a-z_]+:[a-z0-9_]+", rule.name), rule.name
        return
    assert re.fullmatch(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+", rule.name), rule.name


@pytest.mark.parametrize("rule", alerts(), ids=_ids)
def test_alert_has_a_known_severity(rule: Rule) -> None:
    assert rule.body.get("labels", {}).get("severity") in SEVERITIES


@pytest.mark.parametrize("rule", alerts(), ids=_ids)
def test_alert_has_summary_description_and_runbook_url(rule: Rule) -> None:
    annotations = rule.body.get("annotations", {})
    for key in ("summary", "description", "runbook_url"):
        assert str(annotations.get(key, "")).strip(), f"{rule.name} lacks {key}"


# A state check (absent, == 0) has no number of its own to carry.
_MEASURED = [a for a in alerts() if "absent(" not in a.expr and not a.expr.endswith("== 0")]


@pytest.mark.parametrize("rule", _MEASURED, ids=_ids)
def test_alert_description_carries_its_value(rule: Rule) -> None:
    assert "$value" in rule.body["annotations"]["description"]


@pytest.mark.parametrize("rule", alerts(), ids=_ids)
def test_alert_runbook_url_is_the_base_and_its_own_anchor(rule: Rule) -> None:
    assert rule.body["annotations"]["runbook_url"] == f"{RUNBOOK_BASE}#{rule.name.lower()}"


@pytest.mark.parametrize("rule", alerts(), ids=_ids)
def test_alert_runbook_anchor_exists_in_runbook(rule: Rule) -> None:
    anchor = rule.body["annotations"]["runbook_url"].rsplit("#", 1)[1]
    assert anchor in runbook_anchors(), f"RUNBOOK.md has no section #{anchor}"


def test_runbook_links_within_itself_resolve() -> None:
    links = set(re.findall(r"\]\(#([^)]+)\)", RUNBOOK.read_text()))
    assert links - runbook_anchors() == set()


def test_github_anchor_lowercases_and_hyphenates() -> None:
    assert github_anchor("VllmKvCachePreempting") == "vllmkvcachepreempting"
    assert github_anchor("Using these rules") == "using-these-rules"


@pytest.mark.parametrize("rule", alerts(), ids=_ids)
def test_alert_has_a_promtool_test_where_it_fires_and_one_where_it_is_silent(
    rule: Rule,
) -> None:
    checks = [
        check
        for test in promtool_tests()
        for check in test.get("alert_rule_test", [])
        if check["alertname"] == rule.name
    ]
    assert any(c.get("exp_alerts") for c in checks), f"no test where {rule.name} fires"
    assert any(not c.get("exp_alerts") for c in checks), f"no test where {rule.name} is silent"


@pytest.mark.parametrize("rule", alerts(), ids=_ids)
def test_alert_promtool_test_checks_every_annotation(rule: Rule) -> None:
    fired = [
        alert
        for test in promtool_tests()
        for check in test.get("alert_rule_test", [])
        if check["alertname"] == rule.name
        for alert in check.get("exp_alerts") or []
    ]
    assert fired
    for alert in fired:
        assert set(alert.get("exp_annotations", {})) == set(rule.body["annotations"])
        assert alert["exp_labels"]["severity"] == rule.body["labels"]["severity"]


# Records the committed rules leave empty: the ceiling has a value only where the rules are
# rendered with --capacity-ceiling, and tests/rules/test_runway.py checks it there.
EMPTY_AS_COMMITTED = frozenset({"model:kv_headroom_pods:ceiling"})


@pytest.mark.parametrize("rule", records(), ids=_ids)
def test_record_has_a_promtool_test_of_its_value(rule: Rule) -> None:
    if rule.name in EMPTY_AS_COMMITTED:
        return
    exprs = {
        check["expr"].strip()
        for test in promtool_tests()
        for check in test.get("promql_expr_test", [])
        if check.get("exp_samples")
    }
    assert rule.name in exprs
