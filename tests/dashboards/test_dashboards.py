"""What every dashboard promises its reader: variables, units, descriptions, the scope of
every query, and the alert threshold drawn where the alert is."""

from __future__ import annotations

import re
from typing import Any

from dashboards import generate
from exporter.risk.model import ALERT_THRESHOLD, EDGE_THRESHOLD, WARNING_THRESHOLD
from tests.promql import metric_names

Boards = dict[str, dict[str, Any]]
SCOPED = ("namespace", "model", "pod")


def content_panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in generate.panels(board) if p["type"] != "row"]


def panel(boards: Boards, title: str) -> dict[str, Any]:
    found = [p for b in boards.values() for p in content_panels(b) if p["title"] == title]
    assert len(found) == 1, title
    return found[0]


def test_the_five_dashboards_have_their_titles(boards: Boards) -> None:
    assert sorted(b["title"] for b in boards.values()) == [
        "Context lengths",
        "Fleet overview",
        "GPU memory",
        "KV cache capacity",
        "KV cache pressure",
    ]


def test_uids_are_fixed_and_distinct(boards: Boards) -> None:
    uids = [b["uid"] for b in boards.values()]
    assert len(set(uids)) == len(uids)
    assert all(re.fullmatch(r"[a-z0-9-]{1,40}", uid) for uid in uids)


def test_every_dashboard_has_the_four_variables(boards: Boards) -> None:
    for board in boards.values():
        names = [v["name"] for v in board["templating"]["list"]]
        assert names == ["datasource", "namespace", "model", "pod"], board["title"]


def test_the_datasource_variable_picks_a_prometheus(boards: Boards) -> None:
    for board in boards.values():
        (ds,) = [v for v in board["templating"]["list"] if v["name"] == "datasource"]
        assert (ds["type"], ds["query"]) == ("datasource", "prometheus")


def test_label_variables_are_multi_select_with_all_matching_a_missing_label(
    boards: Boards,
) -> None:
    for board in boards.values():
        for var in board["templating"]["list"]:
            if var["name"] in SCOPED:
                assert var["multi"], var["name"]
                assert var["includeAll"], var["name"]
                assert var["allValue"] == ".*", var["name"]


def test_every_panel_reads_the_datasource_variable(boards: Boards) -> None:
    for board in boards.values():
        for p in content_panels(board):
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]


def test_every_panel_has_a_description(boards: Boards) -> None:
    for board in boards.values():
        for p in content_panels(board):
            assert len(p.get("description", "")) > 40, p["title"]


def test_every_panel_has_a_unit(boards: Boards) -> None:
    for board in boards.values():
        for p in content_panels(board):
            assert p["fieldConfig"]["defaults"].get("unit"), p["title"]


def test_every_panel_has_a_query_with_a_legend_or_a_table(boards: Boards) -> None:
    for board in boards.values():
        for p in content_panels(board):
            assert p["targets"], p["title"]
            for t in p["targets"]:
                assert t["legendFormat"] or t["format"] == "table", p["title"]


def test_ref_ids_are_distinct_within_a_panel(boards: Boards) -> None:
    for board in boards.values():
        for p in content_panels(board):
            refs = [t["refId"] for t in p["targets"]]
            assert len(set(refs)) == len(refs), p["title"]
            assert all(refs), p["title"]


def test_panel_ids_are_distinct_within_a_dashboard(boards: Boards) -> None:
    for board in boards.values():
        ids = [p["id"] for p in generate.panels(board)]
        assert len(set(ids)) == len(ids), board["title"]


def test_panels_stay_inside_the_grid(boards: Boards) -> None:
    for board in boards.values():
        for p in generate.panels(board):
            pos = p["gridPos"]
            assert pos["x"] + pos["w"] <= 24, p["title"]


def test_every_metric_reference_has_a_selector() -> None:
    for _, title, expr in generate.panel_queries():
        plain = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
        for name in metric_names(expr):
            for m in re.finditer(rf"(?<![\w:]){re.escape(name)}(?![\w:])", plain):
                assert plain[m.end() : m.end() + 1] == "{", f"{title}: bare {name}"


def test_every_selector_is_scoped_by_namespace_and_pod() -> None:
    # Except per-model records (model:..., the capacity runway's): summed over the model's
    # pods, they carry no namespace or pod to scope, only the model.
    for _, title, expr in generate.panel_queries():
        selectors = re.findall(r"([a-z0-9_:]+)\{([^}]*)\}", expr)
        assert selectors, title
        for name, matchers in selectors:
            if name.startswith("model:"):
                assert matchers == 'model=~"$model"', title
                continue
            assert 'namespace=~"$namespace"' in matchers, title
            assert 'pod=~"$pod"' in matchers, title


def test_every_query_is_filtered_by_the_model_variable() -> None:
    for _, title, expr in generate.panel_queries():
        assert re.search(r'model(_name)?=~"[^"]*\$model"', expr), title


def test_the_preemption_risk_panel_draws_the_warning_and_the_page_as_lines(
    boards: Boards,
) -> None:
    p = panel(boards, "Preemption risk")
    steps = p["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [s["value"] for s in steps] == [None, WARNING_THRESHOLD, ALERT_THRESHOLD]
    assert p["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"] == "line"
    assert "kv_headroom_preemption_risk" in p["targets"][0]["expr"]


def test_seconds_to_exhaustion_is_always_clamped() -> None:
    for _, title, expr in generate.panel_queries():
        if "kv_headroom_seconds_to_exhaustion" in expr:
            assert expr.startswith(("clamp_max(", "min(clamp_max(")), title


def test_the_not_on_this_trend_clamp_is_shown_as_text(boards: Boards) -> None:
    p = panel(boards, "Shortest time to exhaustion")
    (mapping,) = p["fieldConfig"]["defaults"]["mappings"]
    assert mapping["options"]["from"] == generate.EXHAUSTION_CLAMP_SECONDS
    assert "not on this trend" in mapping["options"]["result"]["text"]


def test_the_forecast_usage_panel_draws_the_edge_threshold_as_a_line(boards: Boards) -> None:
    p = panel(boards, "Forecast KV usage")
    steps = p["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [s["value"] for s in steps] == [None, EDGE_THRESHOLD]
    assert p["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"] == "line"
    assert "kv_headroom_forecast_usage_ratio" in p["targets"][0]["expr"]


def test_the_forecast_usage_panel_is_not_capped_at_a_full_cache(boards: Boards) -> None:
    # A forecast above 1 is the overflow the page is for: the axis must show it.
    assert "max" not in panel(boards, "Forecast KV usage")["fieldConfig"]["defaults"]


def test_the_forecast_usage_sits_next_to_the_risk(boards: Boards) -> None:
    (board,) = [b for b in boards.values() if b["title"] == "KV cache pressure"]
    titles = [p["title"] for p in content_panels(board)]
    assert titles.index("Forecast KV usage") == titles.index("Preemption risk") + 1


def test_context_heatmaps_read_vllm_histograms_by_bucket(boards: Boards) -> None:
    for title, metric in (
        ("Prompt length distribution", "vllm:request_prompt_tokens_bucket"),
        ("Generation length distribution", "vllm:request_generation_tokens_bucket"),
    ):
        p = panel(boards, title)
        (target,) = p["targets"]
        assert p["type"] == "heatmap"
        assert target["format"] == "heatmap"
        assert target["expr"].startswith("sum by (le) (rate(" + metric)
        assert p["options"]["calculate"] is False


def test_throughput_panels_put_the_running_batch_on_a_second_axis(boards: Boards) -> None:
    for title in ("Requests per second vs running", "Tokens per second vs running"):
        p = panel(boards, title)
        (override,) = p["fieldConfig"]["overrides"]
        ref = override["matcher"]["options"]
        running = [t for t in p["targets"] if t["refId"] == ref]
        assert "vllm:num_requests_running" in running[0]["expr"]
        assert {"id": "custom.axisPlacement", "value": "right"} in override["properties"]
