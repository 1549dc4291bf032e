"""The Parameters object reaches every object it names, from the README's recipe, and the
values baked into the files equal its defaults (so a kustomization that does not list
apply-parameters gets the same objects)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from rules.generate import CEILING_RECORD, ceiling_expr
from tests.deploy.conftest import KUBERNETES, kubectl_problem, kustomize
from tests.deploy.recipes import (
    CUSTOM,
    OPEN_POLICY,
    SIDECAR_ONLY_POLICY,
    Combination,
    render_combination,
)
from tests.deploy.test_generate import gen
from tests.deploy.test_manifests import (
    K8S_VERSIONS,
    OPERATOR_KINDS,
    validate_operator_object,
)
from tests.rules.test_promtool import promtool
from tests.rules.test_selector import CUSTOM as CUSTOM_SELECTOR
from tests.rules.test_selector import PROMTOOL_TESTS

DEFAULTS: dict[str, Any] = yaml.safe_load(
    (KUBERNETES / "parameters" / "parameters.yaml").read_text()
)["spec"]
# Every up{...} of the rules holds the sidecar selector (rules/generate.py refuses others).
UP = re.compile(r"\bup\{([^{}]*)\}")


def parameter_values(objects: list[dict[str, Any]]) -> dict[str, set[Any]]:
    """Every value in the rendered objects that a parameter sets, by parameter."""
    out: dict[str, set[Any]] = {k: set() for k in DEFAULTS}
    for o in objects:
        kind, spec = o["kind"], o.get("spec", {})
        if kind in OPERATOR_KINDS:
            out["release"].add(o["metadata"]["labels"].get("release"))
        if kind == "PrometheusRule":
            for group in spec["groups"]:
                for rule in group["rules"]:
                    url = rule.get("annotations", {}).get("runbook_url")
                    if url is not None:
                        out["runbookBaseUrl"].add(url.partition("#")[0])
                    for text in (rule["expr"], *rule.get("annotations", {}).values()):
                        out["sidecarSelector"].update(UP.findall(text))
                    if rule.get("record") == CEILING_RECORD:
                        out["capacityCeilings"].add(rule["expr"])
        if kind == "PodMonitor":
            out["vllmPort"].add(spec["podMetricsEndpoints"][1]["targetPort"])
        if kind == "Service" and o["metadata"]["name"] == "vllm-kv-headroom":
            (port,) = [p for p in spec["ports"] if p["name"] == "vllm"]
            out["vllmPort"] |= {port["port"], port["targetPort"]}
        if kind == "NetworkPolicy" and o["metadata"]["name"].startswith("vllm-kv-headroom"):
            sidecar_rule, *rest = spec["ingress"]
            if rest:  # the open policy: vLLM's port, then every other port
                out["vllmPort"].add(rest[0]["ports"][0]["port"])
            (peer,) = sidecar_rule["from"]
            (ns,) = peer["namespaceSelector"]["matchExpressions"]
            (pod,) = peer["podSelector"]["matchExpressions"]
            out["prometheusNamespace"].update(ns["values"])
            out["prometheusPodLabel"].add(pod["key"])
            out["prometheusPodLabelValue"].update(pod["values"])
    return out


@pytest.mark.parametrize("monitor", ["podmonitor", "servicemonitor"])
@pytest.mark.parametrize("policy", [OPEN_POLICY, SIDECAR_ONLY_POLICY])
def test_custom_parameters_reach_every_object(tmp_path: Path, monitor: str, policy: str) -> None:
    objects = render_combination(tmp_path, Combination(monitor, policy, CUSTOM))
    assert parameter_values(objects) == {k: {v} for k, v in CUSTOM}


def test_files_carry_the_default_parameters() -> None:
    objects = [
        o
        for path in ("podmonitor", "servicemonitor", OPEN_POLICY, SIDECAR_ONLY_POLICY)
        for o in kustomize(KUBERNETES / path)
    ]
    assert parameter_values(objects) == {k: {v} for k, v in DEFAULTS.items()}


def test_parameters_never_reach_the_cluster(tmp_path: Path) -> None:
    objects = render_combination(tmp_path, Combination("podmonitor", OPEN_POLICY, CUSTOM))
    assert "Parameters" not in {o["kind"] for o in objects}


@pytest.mark.parametrize("monitor", ["podmonitor", "servicemonitor"])
def test_recipe_with_custom_parameters_is_valid(tmp_path: Path, monitor: str) -> None:
    for obj in render_combination(tmp_path, Combination(monitor, OPEN_POLICY, CUSTOM)):
        if obj["kind"] in OPERATOR_KINDS:
            validate_operator_object(obj)
        else:
            kubernetes_validate.validate(obj, K8S_VERSIONS[0], strict=True)


# --- the sidecar selector ------------------------------------------------------------------


def rendered_rules(tmp_path: Path, **parameters: Any) -> dict[str, Any]:
    """The PrometheusRules' specs, by name, that the README's recipe renders with these
    Parameters; kubectl missing fails the test (it is what renders the parameter)."""
    assert (problem := kubectl_problem()) is None, problem
    combo = Combination("podmonitor", None, tuple(parameters.items()))
    objects = render_combination(tmp_path, combo)
    return {o["metadata"]["name"]: o["spec"] for o in objects if o["kind"] == "PrometheusRule"}


def generated_rules(tmp_path: Path, *args: str) -> dict[str, Any]:
    """The PrometheusRules' specs, by name, that deploy/generate.py writes with these flags."""
    assert gen.main(["--out", str(tmp_path), *args]) == 0
    objects = [yaml.safe_load(p.read_text()) for p in sorted(tmp_path.glob("prometheusrule-*"))]
    return {o["metadata"]["name"]: o["spec"] for o in objects}


@pytest.mark.parametrize(
    "selector", [CUSTOM_SELECTOR, 'namespace="llm", job=~"llm/.*kv-headroom.*"']
)
def test_the_sidecar_selector_parameter_renders_what_deploy_generate_renders(
    tmp_path: Path, selector: str
) -> None:
    # Expressions and the description that quotes the selector, and nothing else, as
    # `deploy/generate.py --sidecar-selector` writes them: one parameter, two ways to set it.
    custom = rendered_rules(tmp_path / "kustomize", sidecarSelector=selector)
    assert custom == generated_rules(tmp_path / "generate", "--sidecar-selector", selector)
    assert custom != generated_rules(tmp_path / "defaults")


def test_with_the_sidecar_selector_parameter_the_rules_alert_on_that_job(tmp_path: Path) -> None:
    # tests/rules/test_selector.py's promtool tests of the generator's custom rendering, run
    # on the rules kustomize rendered: the custom job's sidecar down pages, the default's not.
    spec = rendered_rules(tmp_path / "kustomize", sidecarSelector=CUSTOM_SELECTOR)
    rules = spec["vllm-kv-headroom-rules"]
    (tmp_path / "kv-headroom.rules.yml").write_text(yaml.safe_dump(rules, sort_keys=False))
    test_file = tmp_path / "selector.test.yml"
    test_file.write_text(yaml.safe_dump(PROMTOOL_TESTS, sort_keys=False))
    result = promtool("test", "rules", test_file)
    assert result.returncode == 0, result.stdout + result.stderr


# --- the capacity ceilings -----------------------------------------------------------------

CEILINGS = {"org/model-a": 8, "model-b": 3}


def test_the_capacity_ceilings_parameter_renders_what_deploy_generate_renders(
    tmp_path: Path,
) -> None:
    # The Parameter takes the expression `--capacity-ceiling` writes: the same rules.
    custom = rendered_rules(tmp_path / "kustomize", capacityCeilings=ceiling_expr(CEILINGS))
    flags = [f"--capacity-ceiling={m}={n}" for m, n in CEILINGS.items()]
    assert custom == generated_rules(tmp_path / "generate", *flags)
    assert custom != generated_rules(tmp_path / "defaults")
