"""deploy/kubernetes/autoscaling: KEDA and HPA examples that scale vLLM on the replicas its
traffic needs — the query names a rule that exists, and the scaler reads the keys given.
(Both render and validate against their APIs in test_manifests.py.)"""

from __future__ import annotations

import re

import yaml

from tests.deploy.conftest import KUBERNETES, ROOT, kustomize

AUTOSCALING = KUBERNETES / "autoscaling"
# What KEDA's Prometheus scaler reads from a trigger's metadata (v2.20.2,
# pkg/scalers/prometheus_scaler.go); the CRD keeps metadata as free strings.
PROMETHEUS_REQUIRED = {"serverAddress", "query", "threshold"}
PROMETHEUS_KEYS = PROMETHEUS_REQUIRED | {
    "queryParameters", "activationThreshold", "namespace", "customHeaders",
    "ignoreNullValues", "unsafeSsl", "awsRegion", "timeout", "identityOwner",
}  # fmt: skip


def recorded_rules() -> set[str]:
    names = set()
    for path in (ROOT / "rules").glob("*.rules.yml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            names |= {r["record"] for r in group["rules"] if "record" in r}
    return names


def scaled_object() -> dict[str, object]:
    (obj,) = kustomize(AUTOSCALING / "keda")
    return obj


def test_keda_trigger_sets_every_key_the_prometheus_scaler_requires() -> None:
    (trigger,) = scaled_object()["spec"]["triggers"]  # type: ignore[index]
    assert trigger["type"] == "prometheus"
    metadata = trigger["metadata"]
    assert set(metadata) >= PROMETHEUS_REQUIRED
    assert set(metadata) <= PROMETHEUS_KEYS
    assert all(isinstance(v, str) for v in metadata.values())
    float(metadata["threshold"])


def test_keda_and_the_adapter_query_the_fleet_rule_for_replicas_needed() -> None:
    adapter = AUTOSCALING / "hpa" / "prometheus-adapter-rules.yaml"
    queries = [scaled_object()["spec"]["triggers"][0]["metadata"]["query"]]  # type: ignore[index]
    queries += [r["metricsQuery"] for r in yaml.safe_load(adapter.read_text())["externalRules"]]
    for query in queries:
        names = set(re.findall(r"[a-z_]+:[a-z_]+:[a-z_0-9]+", query))
        assert names == {"model:kv_headroom_replicas_needed:ceil"}
        assert names <= recorded_rules()


def test_the_hpa_asks_for_the_replicas_the_metric_says() -> None:
    (hpa,) = kustomize(AUTOSCALING / "hpa")
    (metric,) = hpa["spec"]["metrics"]
    adapter = yaml.safe_load((AUTOSCALING / "hpa" / "prometheus-adapter-rules.yaml").read_text())
    served = {r["name"]["as"] for r in adapter["externalRules"]}
    assert metric["external"]["metric"]["name"] in served
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}


def test_both_examples_scale_the_same_deployment() -> None:
    (hpa,) = kustomize(AUTOSCALING / "hpa")
    keda_target = scaled_object()["spec"]["scaleTargetRef"]["name"]  # type: ignore[index]
    assert hpa["spec"]["scaleTargetRef"]["name"] == keda_target
