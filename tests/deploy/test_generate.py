"""deploy/generate.py on sample inputs: rules/ and dashboards/ change under it, so its
behaviour is pinned here on files the tests own."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import DEPLOY, kustomize

RULES = """\
groups:
  - name: sample.alerts
    rules:
      - alert: SampleRiskHigh
        expr: |
          kv_headroom_preemption_risk > 0.5
        for: 15s
        labels: {severity: critical}
        annotations:
          summary: "Risk on {{ $labels.pod }}"
          description: "Risk {{ $value }}.\\nSecond line."
  - name: sample.records
    rules:
      - record: namespace:kv_headroom_kv_usage_ratio:max
        expr: max by (namespace) (kv_headroom_kv_usage_ratio)
"""
PROMTOOL_TEST = "rule_files: [sample.yml]\ntests: []\n"
DASHBOARD = '{\n  "title": "Sample capacity",\n  "panels": [],\n  "uid": "sample"\n}\n'


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("deploy_generate", DEPLOY / "generate.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building
    spec.loader.exec_module(module)
    return module


gen = _load()


@pytest.fixture(name="inputs")
def _inputs(tmp_path: Path) -> tuple[Path, Path, Path]:
    rules, dashboards, out = tmp_path / "rules", tmp_path / "dashboards", tmp_path / "out"
    (rules / "tests").mkdir(parents=True)
    dashboards.mkdir()
    (rules / "sample.yml").write_text(RULES)
    (rules / "sample_test.yml").write_text(PROMTOOL_TEST)
    (rules / "tests" / "nested.yml").write_text(RULES)  # sub-folders are not rules/*.yml
    (dashboards / "Sample Capacity.json").write_text(DASHBOARD)
    (dashboards / "generate.py").write_text("")  # the dashboards' generator sits beside them
    return rules, dashboards, out


def run(inputs: tuple[Path, Path, Path], *extra: str) -> int:
    rules, dashboards, out = inputs
    code: int = gen.main(
        ["--rules", str(rules), "--dashboards", str(dashboards), "--out", str(out), *extra]
    )
    return code


def objects(out: Path) -> dict[str, dict[str, Any]]:
    return {p.name: yaml.safe_load(p.read_text()) for p in sorted(out.glob("*.yaml"))}


def test_each_rule_file_becomes_one_prometheus_rule_with_its_groups(
    inputs: tuple[Path, Path, Path],
) -> None:
    assert run(inputs) == 0
    rules = [o for o in objects(inputs[2]).values() if o.get("kind") == "PrometheusRule"]
    assert len(rules) == 1
    assert rules[0]["apiVersion"] == "monitoring.coreos.com/v1"
    assert rules[0]["spec"]["groups"] == yaml.safe_load(RULES)["groups"]


def test_promtool_test_files_and_subfolders_are_not_rules(inputs: tuple[Path, Path, Path]) -> None:
    assert run(inputs) == 0
    sources = [
        o["metadata"]["annotations"][gen.SOURCE_ANNOTATION]
        for o in objects(inputs[2]).values()
        if o.get("kind") == "PrometheusRule"
    ]
    assert [Path(s).name for s in sources] == ["sample.yml"]


def test_each_dashboard_becomes_a_labelled_configmap_holding_the_file_verbatim(
    inputs: tuple[Path, Path, Path],
) -> None:
    assert run(inputs) == 0
    (configmap,) = [o for o in objects(inputs[2]).values() if o.get("kind") == "ConfigMap"]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["data"] == {"Sample Capacity.json": DASHBOARD}


def test_object_names_are_valid_kubernetes_names(inputs: tuple[Path, Path, Path]) -> None:
    (inputs[1] / ("Very_Long " * 12 + ".json")).write_text(DASHBOARD)
    assert run(inputs) == 0
    for obj in objects(inputs[2]).values():
        if "metadata" in obj:
            name = obj["metadata"]["name"]
            assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name)
            assert len(name) <= 63


def test_kustomization_lists_every_generated_object(inputs: tuple[Path, Path, Path]) -> None:
    assert run(inputs) == 0
    kinds = sorted(o["kind"] for o in kustomize(inputs[2]))
    assert kinds == ["ConfigMap", "PrometheusRule"]


def test_check_passes_right_after_generating(inputs: tuple[Path, Path, Path]) -> None:
    assert run(inputs) == 0
    assert run(inputs, "--check") == 0


def test_check_names_a_file_whose_source_changed(
    inputs: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(inputs) == 0
    (inputs[0] / "sample.yml").write_text(RULES.replace("0.5", "0.6"))
    assert run(inputs, "--check") == 1
    assert "prometheusrule-sample.yaml: out of date" in capsys.readouterr().err


def test_check_names_a_new_source_and_a_removed_one(
    inputs: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(inputs) == 0
    (inputs[1] / "Sample Capacity.json").rename(inputs[1] / "pressure.json")
    assert run(inputs, "--check") == 1
    err = capsys.readouterr().err
    assert "dashboard-pressure.yaml: missing" in err
    assert "dashboard-sample-capacity.yaml: not generated any more" in err


def test_generating_again_removes_objects_whose_source_is_gone(
    inputs: tuple[Path, Path, Path],
) -> None:
    assert run(inputs) == 0
    (inputs[0] / "sample.yml").unlink()
    assert run(inputs) == 0
    assert "prometheusrule-sample.yaml" not in objects(inputs[2])
    assert run(inputs, "--check") == 0


def test_missing_input_folders_give_an_empty_kustomization(tmp_path: Path) -> None:
    inputs = (tmp_path / "no-rules", tmp_path / "no-dashboards", tmp_path / "out")
    assert run(inputs) == 0
    assert objects(tmp_path / "out")["kustomization.yaml"]["resources"] == []


def test_a_rule_file_without_groups_is_an_error(
    inputs: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    (inputs[0] / "broken.yml").write_text("rules: []\n")
    assert run(inputs) == 2
    assert "broken.yml: expected a mapping with a list under 'groups'" in capsys.readouterr().err


def test_a_dashboard_that_is_not_json_is_an_error(
    inputs: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    (inputs[1] / "broken.json").write_text("{")
    assert run(inputs) == 2
    assert "broken.json: invalid JSON" in capsys.readouterr().err


def test_two_sources_with_the_same_object_name_are_an_error(
    inputs: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    (inputs[1] / "sample_capacity.json").write_text(DASHBOARD)
    assert run(inputs) == 2
    assert "map to the same object name" in capsys.readouterr().err


def test_a_dashboard_over_the_configmap_limit_is_an_error(
    inputs: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    (inputs[1] / "huge.json").write_text(json.dumps({"panels": ["x" * (1 << 20)]}))
    assert run(inputs) == 2
    assert "huge.json: over the 1 MiB a ConfigMap may hold" in capsys.readouterr().err


def test_multiline_strings_stay_readable_in_the_output(inputs: tuple[Path, Path, Path]) -> None:
    assert run(inputs) == 0
    text = (inputs[2] / "prometheusrule-sample.yaml").read_text()
    assert "expr: |\n" in text
    assert "description: |-\n" in text
    assert "\\n" not in text  # no escaped newlines
