"""The runbook base URL is a generator parameter: deploy/generate.py --runbook-base-url moves
every alert's runbook link to your copy, anchors kept, without editing rules/."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.deploy.test_generate import gen

RULE = """\
groups:
  - name: sample.alerts
    rules:
      - alert: SampleRiskHigh
        expr: kv_headroom_preemption_risk > 0.5
        annotations:
          runbook_url: {url}
      - record: namespace:kv_headroom_kv_usage_ratio:max
        expr: max by (namespace) (kv_headroom_kv_usage_ratio)
"""


def generated_urls(tmp_path: Path, url: str, *extra: str) -> tuple[int, list[str]]:
    rules, dashboards, out = tmp_path / "rules", tmp_path / "dashboards", tmp_path / "out"
    rules.mkdir()
    dashboards.mkdir()
    (rules / "sample.yml").write_text(RULE.format(url=url))
    code: int = gen.main(
        ["--rules", str(rules), "--dashboards", str(dashboards), "--out", str(out), *extra]
    )
    if code != 0:
        return code, []
    obj = yaml.safe_load((out / "prometheusrule-sample.yaml").read_text())
    return code, [
        r["annotations"]["runbook_url"]
        for g in obj["spec"]["groups"]
        for r in g["rules"]
        if "annotations" in r
    ]


def test_the_runbook_base_url_moves_every_link_and_keeps_the_anchor(tmp_path: Path) -> None:
    code, urls = generated_urls(
        tmp_path,
        f"{gen.RUNBOOK_BASE}#sampleriskhigh",
        "--runbook-base-url",
        "https://wiki.example.com/kv-headroom/",
    )
    assert code == 0
    assert urls == ["https://wiki.example.com/kv-headroom#sampleriskhigh"]


def test_without_the_parameter_the_links_stay_as_the_rules_write_them(tmp_path: Path) -> None:
    assert generated_urls(tmp_path, f"{gen.RUNBOOK_BASE}#sampleriskhigh") == (
        0,
        [f"{gen.RUNBOOK_BASE}#sampleriskhigh"],
    )


def test_a_link_the_parameter_cannot_reach_is_refused_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _ = generated_urls(tmp_path, "https://elsewhere.example.com/runbook#x")
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert "sample.yml" in err
    assert "SampleRiskHigh" in err
