"""The capacity runway (docs/rules.md#capacity-runway): its promtool tests are generated
from the synthetic truths and must be current (test_promtool.py runs them with the others),
and the capacity ceiling is a generator parameter that moves what the runway is measured
against, and nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rules import generate as rules_gen
from tests.rules.rulefiles import RULES_DIR
from tests.rules.runway_promtool import render_test_file
from tests.rules.runway_truths import SWEEPS, TEST_FILE, TRUTHS
from tests.rules.test_promtool import promtool


def test_the_runway_promtool_tests_are_generated_from_the_truths() -> None:
    assert TEST_FILE.read_text(encoding="utf-8") == render_test_file(TRUTHS, SWEEPS), (
        "rules/tests/runway.test.yml is stale: python -m tests.rules.runway_truths"
    )


def _records(text: str) -> dict[str, str]:
    return {
        rule["record"]: rule["expr"]
        for group in yaml.safe_load(text)["groups"]
        for rule in group["rules"]
        if "record" in rule
    }


def test_a_capacity_ceiling_changes_the_ceiling_record_and_nothing_else() -> None:
    default = rules_gen.rendered()
    custom = rules_gen.rendered(capacity_ceilings={"org/model-a": 8, "b": 3})
    assert custom["vllm.rules.yml"] == default["vllm.rules.yml"]
    before, after = (
        _records(default["kv-headroom.rules.yml"]),
        _records(custom["kv-headroom.rules.yml"]),
    )
    assert {k for k in before if before[k] != after[k]} == {rules_gen.CEILING_RECORD}
    assert after[rules_gen.CEILING_RECORD] == (
        'label_replace(vector(3), "model", "b", "", "") or '
        'label_replace(vector(8), "model", "org/model-a", "", "")'
    )


def test_the_command_takes_repeated_capacity_ceilings(tmp_path: Path) -> None:
    args = ["--out", str(tmp_path), "--capacity-ceiling", "org/model-a=8", "--capacity-ceiling=b=3"]
    assert rules_gen.main(args) == 0
    written = {p.name: p.read_text(encoding="utf-8") for p in tmp_path.iterdir()}
    assert written == rules_gen.rendered(capacity_ceilings={"org/model-a": 8, "b": 3})


@pytest.mark.parametrize("value", ["8", "=8", "m=0", "m=-1", "m=2.5", "m=x", 'a"b=3', "m{=3"])
def test_a_capacity_ceiling_that_is_not_model_equals_pods_is_refused(value: str) -> None:
    with pytest.raises(rules_gen.RenderError, match="--capacity-ceiling"):
        rules_gen.ceilings([value])


def test_a_model_given_two_ceilings_is_refused() -> None:
    with pytest.raises(rules_gen.RenderError, match="given twice"):
        rules_gen.ceilings(["m=3", "m=4"])


def test_ceilings_for_rules_without_the_ceiling_record_are_refused(tmp_path: Path) -> None:
    (tmp_path / "x.rules.yml").write_text("groups: []\n")
    with pytest.raises(rules_gen.RenderError, match="records model:kv_headroom_pods:ceiling"):
        rules_gen.rendered(tmp_path, capacity_ceilings={"m": 3})


# --- in Prometheus's rule engine: the runway is measured against the ceiling --------------

# One model on 2 pods, its load growing by 0.1 pod a week from 1.3 to 1.9 over six weeks,
# the same all day: against its 2 pods the runway is about 7 days (a ticket); against a
# ceiling of 4 pods it is about 150 days (none).
WEEKS = 6
LOAD = " ".join(f"{1 / (1.3 + 0.1 * i / 7 / 96):.6g}" for i in range(WEEKS * 7 * 96 + 1))
END = f"{WEEKS * 7}d"


def ceiling_tests(
    rule_file: str, capacity: float, runway: tuple[float, float], alerts: list[str]
) -> object:
    """A promtool test file: the capacity the runway is measured against, the runway
    between runway[0] and runway[1] days, and the models the ticket fires for."""
    return {
        "rule_files": [rule_file],
        "evaluation_interval": "15m",
        "tests": [{
            "name": "the runway against the capacity",
            "interval": "15m",
            "input_series": [
                *({"series": f'kv_headroom_info{{job="j",instance="p{i}:9847",model="m"}}',
                   "values": f"1x{WEEKS * 7 * 96}"} for i in range(2)),
                {"series": 'kv_headroom_load_headroom_ratio{job="j",instance="p0:9847"}',
                 "values": LOAD},
            ],
            "promql_expr_test": [
                {"expr": "model:kv_headroom_pods:capacity", "eval_time": END,
                 "exp_samples": [{"labels": 'model:kv_headroom_pods:capacity{model="m"}',
                                  "value": capacity}]},
                {"expr": f"(model:kv_headroom_runway_days > {runway[0]}) < bool {runway[1]}",
                 "eval_time": END,
                 "exp_samples": [{"labels": '{model="m"}', "value": 1}]},
                {"expr": 'ALERTS{alertname="VllmKvCacheRunwayShort",alertstate="firing"}',
                 "eval_time": END,
                 "exp_samples": [{"labels": 'ALERTS{alertname="VllmKvCacheRunwayShort",'
                                  f'alertstate="firing",model="{m}",severity="warning"}}',
                                  "value": 1} for m in alerts]},
            ],
        }],
    }  # fmt: skip


def _promtool_test(tmp_path: Path, tests: object) -> str:
    test_file = tmp_path / "ceiling.test.yml"
    test_file.write_text(yaml.safe_dump(tests, sort_keys=False, width=10**9))
    result = promtool("test", "rules", test_file)
    return "" if result.returncode == 0 else result.stdout + result.stderr


def test_without_a_ceiling_the_runway_is_measured_against_the_pods_running(
    tmp_path: Path,
) -> None:
    rules = str(RULES_DIR / "kv-headroom.rules.yml")
    tests = ceiling_tests(rules, 2, (5, 9), ["m"])
    assert _promtool_test(tmp_path, tests) == ""


def test_with_a_ceiling_the_runway_is_measured_against_it(tmp_path: Path) -> None:
    assert rules_gen.main(["--out", str(tmp_path), "--capacity-ceiling", "m=4"]) == 0
    tests = ceiling_tests("kv-headroom.rules.yml", 4, (120, 180), [])
    assert _promtool_test(tmp_path, tests) == ""
