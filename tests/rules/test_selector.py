"""The sidecar's job selector is a generator parameter (rules/generate.py, and
deploy/generate.py for the PrometheusRules): the defaults render the committed files byte
for byte, and rules rendered with another selector load in Prometheus and alert on the job
that selector names, and on no other."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rules import generate as rules_gen
from tests.deploy.test_generate import gen as deploy_gen
from tests.rules.rulefiles import RULE_FILES, RULES_DIR, RUNBOOK_BASE
from tests.rules.test_promtool import promtool

CUSTOM = 'job="llm/kv-sidecar"'
SIDECAR_ALERTS = ("KvHeadroomSidecarDown", "KvHeadroomSidecarAbsent")


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_the_defaults_render_the_committed_file_byte_for_byte(path: Path) -> None:
    assert rules_gen.rendered()[path.name] == path.read_text(encoding="utf-8")


def test_the_rule_files_are_the_ones_rendered() -> None:
    assert sorted(rules_gen.rendered()) == [p.name for p in RULE_FILES]


def test_deploy_generate_defaults_leave_the_committed_prometheusrules() -> None:
    assert deploy_gen.main(["--check"]) == 0


def _alerts(texts: dict[str, str]) -> dict[str, dict[str, object]]:
    return {
        rule["alert"]: rule
        for text in texts.values()
        for group in yaml.safe_load(text)["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }


def test_a_custom_selector_reaches_both_sidecar_alerts_and_nothing_else() -> None:
    default, custom = (
        _alerts(rules_gen.rendered()),
        _alerts(rules_gen.rendered(sidecar_selector=CUSTOM)),
    )
    changed = sorted(name for name in default if default[name] != custom[name])
    assert changed == sorted(SIDECAR_ALERTS)
    assert custom["KvHeadroomSidecarDown"]["expr"] == f"up{{{CUSTOM}}} == 0"
    assert custom["KvHeadroomSidecarAbsent"]["expr"] == f"absent(up{{{CUSTOM}}})"
    assert all(rules_gen.SIDECAR_SELECTOR not in str(rule) for rule in custom.values())


def test_deploy_generate_puts_the_selector_in_the_prometheusrule(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert deploy_gen.main(["--out", str(out), "--sidecar-selector", CUSTOM]) == 0
    obj = yaml.safe_load((out / "prometheusrule-rules.yaml").read_text())
    exprs = {r.get("alert"): r["expr"] for g in obj["spec"]["groups"] for r in g["rules"]}
    assert exprs["KvHeadroomSidecarDown"] == f"up{{{CUSTOM}}} == 0"
    assert exprs["KvHeadroomSidecarAbsent"] == f"absent(up{{{CUSTOM}}})"


def test_an_up_selector_the_parameter_cannot_reach_is_refused_with_its_line() -> None:
    text = "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up{job='x'} == 0\n"
    with pytest.raises(rules_gen.RenderError, match=r"^mine.yml:5: up\{job='x'\}"):
        rules_gen.render(text, source="mine.yml")


def test_deploy_generate_refuses_it_too_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rules, dashboards = tmp_path / "rules", tmp_path / "dashboards"
    rules.mkdir()
    dashboards.mkdir()
    (rules / "mine.yml").write_text(
        "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up{job='x'} == 0\n"
    )
    args = ["--rules", str(rules), "--dashboards", str(dashboards), "--out", str(tmp_path / "o")]
    assert deploy_gen.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "mine.yml:5" in err


@pytest.mark.parametrize("selector", ["", "  ", 'job="a"}', "job='a'\nx='b'"])
def test_a_selector_that_is_not_matchers_is_refused(selector: str) -> None:
    with pytest.raises(rules_gen.RenderError, match="--sidecar-selector"):
        rules_gen.rendered(sidecar_selector=selector)


def test_a_selector_yaml_would_read_otherwise_is_refused() -> None:
    # ' #' starts a comment in a plain YAML scalar: the expression would lose its tail.
    with pytest.raises(rules_gen.RenderError, match="does not survive YAML"):
        rules_gen.rendered(sidecar_selector='job="a" #b')


def test_the_command_writes_the_rendered_files(tmp_path: Path) -> None:
    assert rules_gen.main(["--out", str(tmp_path), "--sidecar-selector", CUSTOM]) == 0
    written = {p.name: p.read_text(encoding="utf-8") for p in tmp_path.iterdir()}
    assert written == rules_gen.rendered(sidecar_selector=CUSTOM)


# --- in Prometheus's own rule engine ------------------------------------------------------


def _down(instance: str, job: str) -> dict[str, object]:
    return {
        "exp_labels": {"severity": "warning", "job": job, "instance": instance},
        "exp_annotations": {
            "summary": f"The kv-headroom sidecar {instance} cannot be scraped.",
            "description": (
                f"Prometheus has failed to scrape {instance} (job {job}) for 5 minutes: no KV "
                "cache capacity, headroom or preemption-risk figures, and no alerts from them, "
                "for its vLLM."
            ),
            "runbook_url": f"{RUNBOOK_BASE}#kvheadroomsidecardown",
        },
    }


ABSENT = {
    # absent() carries the selector's equality matchers as labels (the default's =~ none).
    "exp_labels": {"severity": "warning", "job": "llm/kv-sidecar"},
    "exp_annotations": {
        "summary": "Prometheus scrapes no kv-headroom sidecar.",
        "description": (
            f"No scrape target matches up{{{CUSTOM}}}: either no sidecar is being discovered, "
            "or its job is named otherwise and the selector in the rules needs editing."
        ),
        "runbook_url": f"{RUNBOOK_BASE}#kvheadroomsidecarabsent",
    },
}

PROMTOOL_TESTS: dict[str, object] = {
    "rule_files": ["kv-headroom.rules.yml"],
    "evaluation_interval": "1m",
    "tests": [
        {
            "name": "the custom job down fires; a job the default would have matched does not",
            "interval": "1m",
            "input_series": [
                {"series": 'up{job="llm/kv-sidecar",instance="10.0.0.7:9847"}', "values": "0x10"},
                {
                    "series": 'up{job="monitoring/kv-headroom",instance="10.0.0.8:9847"}',
                    "values": "0x10",
                },
            ],
            "alert_rule_test": [
                {"eval_time": "4m", "alertname": "KvHeadroomSidecarDown", "exp_alerts": []},
                {
                    "eval_time": "5m",
                    "alertname": "KvHeadroomSidecarDown",
                    "exp_alerts": [_down("10.0.0.7:9847", "llm/kv-sidecar")],
                },
                {"eval_time": "10m", "alertname": "KvHeadroomSidecarAbsent", "exp_alerts": []},
            ],
        },
        {
            "name": "only the default's job scraped: the custom selector finds no sidecar",
            "interval": "1m",
            "input_series": [
                {
                    "series": 'up{job="monitoring/kv-headroom",instance="10.0.0.8:9847"}',
                    "values": "1x20",
                },
            ],
            "alert_rule_test": [
                {"eval_time": "14m", "alertname": "KvHeadroomSidecarAbsent", "exp_alerts": []},
                {
                    "eval_time": "15m",
                    "alertname": "KvHeadroomSidecarAbsent",
                    "exp_alerts": [ABSENT],
                },
                {"eval_time": "15m", "alertname": "KvHeadroomSidecarDown", "exp_alerts": []},
            ],
        },
        {
            "name": "the custom job up: both stay silent",
            "interval": "1m",
            "input_series": [
                {"series": 'up{job="llm/kv-sidecar",instance="10.0.0.7:9847"}', "values": "1x20"},
            ],
            "alert_rule_test": [
                {"eval_time": "20m", "alertname": "KvHeadroomSidecarAbsent", "exp_alerts": []},
                {"eval_time": "20m", "alertname": "KvHeadroomSidecarDown", "exp_alerts": []},
            ],
        },
    ],
}


@pytest.fixture(name="custom_rules")
def _custom_rules(tmp_path: Path) -> Path:
    assert rules_gen.main(["--out", str(tmp_path), "--sidecar-selector", CUSTOM]) == 0
    return tmp_path


def test_rules_with_a_custom_selector_pass_promtool_check(custom_rules: Path) -> None:
    files = sorted(custom_rules.glob("*.rules.yml"))
    assert [p.name for p in files] == [p.name for p in RULE_FILES]
    result = promtool("check", "rules", *files)
    assert result.returncode == 0, result.stdout + result.stderr


def test_rules_with_a_custom_selector_alert_on_that_job_in_promtool(custom_rules: Path) -> None:
    test_file = custom_rules / "selector.test.yml"
    test_file.write_text(yaml.safe_dump(PROMTOOL_TESTS, sort_keys=False))
    result = promtool("test", "rules", test_file)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_committed_rules_do_not_see_the_custom_job(tmp_path: Path) -> None:
    # The same tests against the committed rules fail: the parameter is what moved the job.
    test_file = tmp_path / "selector.test.yml"
    tests = {**PROMTOOL_TESTS, "rule_files": [str(RULES_DIR / "kv-headroom.rules.yml")]}
    test_file.write_text(yaml.safe_dump(tests, sort_keys=False))
    result = promtool("test", "rules", test_file)
    assert result.returncode != 0
    assert "KvHeadroomSidecarDown" in result.stdout + result.stderr
