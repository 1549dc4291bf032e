"""The metric-name extractor the dashboard lint relies on."""

from __future__ import annotations

from tests.promql import metric_names


def test_a_bare_selector_is_its_metric() -> None:
    assert metric_names("kv_headroom_kv_free_tokens") == {"kv_headroom_kv_free_tokens"}


def test_functions_and_aggregations_are_not_metrics() -> None:
    expr = "max by (job) (clamp_max(rate(foo_total[5m]), 1))"
    assert metric_names(expr) == {"foo_total"}


def test_aggregation_label_lists_are_not_metrics() -> None:
    expr = "sum without (engine) (foo) / on (job, instance) group_left (model) bar"
    assert metric_names(expr) == {"foo", "bar"}


def test_postfix_grouping_is_not_a_metric() -> None:
    assert metric_names("sum(foo) by (le)") == {"foo"}


def test_label_matchers_and_their_values_are_not_metrics() -> None:
    expr = 'foo{le=~"bar|baz", pod=~"$pod", model_name=~"(.*/)?$model"}'
    assert metric_names(expr) == {"foo"}


def test_braces_inside_strings_do_not_confuse_matchers() -> None:
    assert metric_names('foo{a="x{y}z"} + bar') == {"foo", "bar"}


def test_strings_are_not_metrics() -> None:
    expr = 'label_replace(foo, "target", "$1", "instance", "(.*)")'
    assert metric_names(expr) == {"foo"}


def test_grafana_interval_variables_are_not_metrics() -> None:
    expr = "rate(foo[$__rate_interval]) * $scale + rate(bar[${__interval}])"
    assert metric_names(expr) == {"foo", "bar"}


def test_keywords_numbers_and_durations_are_not_metrics() -> None:
    expr = "foo offset 5m > bool 1e+09 and bar unless baz or Inf"
    assert metric_names(expr) == {"foo", "bar", "baz"}


def test_colons_belong_to_the_name() -> None:
    expr = "rate(vllm:prompt_tokens_total[1m]) + job:foo:rate5m"
    assert metric_names(expr) == {"vllm:prompt_tokens_total", "job:foo:rate5m"}


def test_a_name_matcher_names_its_metric() -> None:
    assert metric_names('{__name__="foo", job="x"}') == {"foo"}
