"""deploy/kubernetes renders with `kubectl kustomize`, every object is valid against its API,
the monitoring objects carry rules/ and dashboards/ unchanged, and the sidecar's settings in
the manifests are ones `kv-headroom serve` accepts."""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.deploy.conftest import (
    DEPLOY,
    FIXTURES,
    KUBERNETES,
    ROOT,
    applicable_dirs,
    is_component,
    kustomization_dirs,
    kustomize,
    pod_spec,
    sidecar_of,
)

# The oldest Kubernetes minor still maintained when this was written, and the newest the
# validator knows: a field added or removed in between fails one of the two.
K8S_VERSIONS = ("1.31.0", kubernetes_validate.utils.latest_version())
OPERATOR_KINDS = {"PodMonitor", "ServiceMonitor", "PrometheusRule", "ScaledObject"}
CRD_DIR = FIXTURES / "prometheus-operator-crd"
CRD_DIRS = (CRD_DIR, FIXTURES / "keda-crd")
EXAMPLE = KUBERNETES / "example"

WORKLOADS = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: vllm, annotations: {vllm-kv-headroom/inject: "true"}}
spec:
  selector: {matchLabels: {app: vllm}}
  template:
    metadata: {labels: {app: vllm}}
    spec:
      containers:
        - name: vllm
          image: vllm/vllm-openai:v0.32.0
          volumeMounts: [{name: models, mountPath: /models}]
      volumes: [{name: models, emptyDir: {}}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: vllm-tp, annotations: {vllm-kv-headroom/inject: "true"}}
spec:
  serviceName: vllm-tp
  selector: {matchLabels: {app: vllm-tp}}
  template:
    metadata: {labels: {app: vllm-tp}}
    spec:
      containers:
        - name: vllm
          image: vllm/vllm-openai:v0.32.0
          volumeMounts: [{name: models, mountPath: /models}]
  volumeClaimTemplates:
    - metadata: {name: models}
      spec:
        accessModes: [ReadWriteOnce]
        resources: {requests: {storage: 40Gi}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: not-vllm}
spec:
  selector: {matchLabels: {app: other}}
  template:
    metadata: {labels: {app: other}}
    spec:
      containers: [{name: web, image: nginx:1.27}]
"""


@functools.cache
def _rendered(path: str) -> tuple[dict[str, Any], ...]:
    return tuple(kustomize(Path(path)))


def rendered(path: Path) -> list[dict[str, Any]]:
    """A private copy of what the kustomization renders (cached: kubectl takes a while)."""
    return copy.deepcopy(list(_rendered(str(path))))


def with_components(tmp_path: Path, *components: str) -> list[dict[str, Any]]:
    """Renders sample vLLM workloads through the named components, as a user's overlay does."""
    (tmp_path / "workloads.yaml").write_text(WORKLOADS)
    kustomization = {
        "resources": ["workloads.yaml"],
        # kustomize refuses absolute paths; a relative one works from anywhere.
        "components": [os.path.relpath(KUBERNETES / c, tmp_path) for c in components],
    }
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return kustomize(tmp_path)


def container_env(objects: list[dict[str, Any]], container: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet builds it: envFrom ConfigMaps, then env."""
    configmaps = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(configmaps[source["configMapRef"]["name"]].get("data", {}))
    env.update({e["name"]: e["value"] for e in container.get("env", [])})
    return env


def by_name(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (obj,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


def renderable_dirs() -> list[Path]:
    return applicable_dirs()


def all_rendered_objects(tmp_path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    for path in renderable_dirs():
        for obj in rendered(path):
            yield path.relative_to(ROOT).as_posix(), obj
    for obj in with_components(tmp_path, "sidecar", "nvml"):
        yield "sidecar + nvml components", obj


# --- rendering ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", renderable_dirs(), ids=lambda p: p.relative_to(KUBERNETES).as_posix()
)
def test_kustomization_renders(path: Path) -> None:
    assert rendered(path)


def test_every_component_is_rendered_by_a_test() -> None:
    components = {p.name for p in kustomization_dirs() if is_component(p)}
    assert components == {"sidecar", "nvml"}


def test_sidecar_component_adds_the_container_to_deployments_and_statefulsets(
    tmp_path: Path,
) -> None:
    objects = with_components(tmp_path, "sidecar")
    for kind, name in (("Deployment", "vllm"), ("StatefulSet", "vllm-tp")):
        names = [c["name"] for c in pod_spec(by_name(objects, kind, name))["containers"]]
        assert names == ["vllm", "kv-headroom"], f"{kind}/{name}"  # vLLM stays the default


def test_sidecar_component_leaves_unannotated_workloads_alone(tmp_path: Path) -> None:
    objects = with_components(tmp_path, "sidecar")
    spec = pod_spec(by_name(objects, "Deployment", "not-vllm"))
    assert [c["name"] for c in spec["containers"]] == ["web"]
    assert "shareProcessNamespace" not in spec


def test_sidecar_shares_the_process_namespace_and_mounts_the_model_read_only(
    tmp_path: Path,
) -> None:
    workload = by_name(with_components(tmp_path, "sidecar"), "Deployment", "vllm")
    assert pod_spec(workload)["shareProcessNamespace"] is True
    vllm_mounts = {
        m["mountPath"]: m["name"] for m in pod_spec(workload)["containers"][0]["volumeMounts"]
    }
    sidecar_mounts = sidecar_of(workload)["volumeMounts"]
    assert sidecar_mounts == [{"name": "models", "mountPath": "/models", "readOnly": True}]
    assert vllm_mounts["/models"] == "models"  # the same path, so vLLM's --model resolves


def test_sidecar_watches_vllm_on_localhost(tmp_path: Path) -> None:
    sidecar = sidecar_of(by_name(with_components(tmp_path, "sidecar"), "Deployment", "vllm"))
    assert "--vllm.url=http://127.0.0.1:8000" in sidecar["args"]


def test_sidecar_probes_healthz_for_liveness_and_readyz_for_readiness(tmp_path: Path) -> None:
    sidecar = sidecar_of(by_name(with_components(tmp_path, "sidecar"), "Deployment", "vllm"))
    assert sidecar["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "kv-headroom"}
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "kv-headroom"}
    assert sidecar["ports"] == [{"name": "kv-headroom", "containerPort": 9847, "protocol": "TCP"}]


def test_sidecar_is_locked_down(tmp_path: Path) -> None:
    sidecar = sidecar_of(by_name(with_components(tmp_path, "sidecar"), "StatefulSet", "vllm-tp"))
    ctx = sidecar["securityContext"]
    assert ctx["runAsNonRoot"] is True
    assert ctx["runAsUser"] != 0
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}


def test_sidecar_resources_keep_a_guaranteed_pod_guaranteed(tmp_path: Path) -> None:
    resources = sidecar_of(by_name(with_components(tmp_path, "sidecar"), "Deployment", "vllm"))[
        "resources"
    ]
    assert resources["requests"] == resources["limits"]
    assert set(resources["limits"]) == {"cpu", "memory"}


def test_sidecar_memory_limit_leaves_headroom_over_the_measured_rss(tmp_path: Path) -> None:
    limit = sidecar_of(by_name(with_components(tmp_path, "sidecar"), "Deployment", "vllm"))[
        "resources"
    ]["limits"]["memory"]
    mib = int(limit.removesuffix("Mi"))
    assert mib * 2**20 >= 2 * 48.6e6  # README "Speed and memory": 48.6 MB after 10,000 polls


def test_nvml_is_off_unless_the_nvml_component_is_added(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    (tmp_path / "opted").mkdir()
    plain = with_components(tmp_path / "plain", "sidecar")
    opted = with_components(tmp_path / "opted", "sidecar", "nvml")
    env = container_env(plain, sidecar_of(by_name(plain, "Deployment", "vllm")))
    opted_env = container_env(opted, sidecar_of(by_name(opted, "Deployment", "vllm")))
    assert env["KV_HEADROOM_NVML_ENABLED"] == "false"
    assert "NVIDIA_VISIBLE_DEVICES" not in env
    assert opted_env["KV_HEADROOM_NVML_ENABLED"] == "true"
    assert opted_env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert opted_env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"


def test_nvml_component_keeps_vllm_the_first_container_and_requests_no_gpu(
    tmp_path: Path,
) -> None:
    workload = by_name(with_components(tmp_path, "sidecar", "nvml"), "StatefulSet", "vllm-tp")
    assert [c["name"] for c in pod_spec(workload)["containers"]] == ["vllm", "kv-headroom"]
    assert "nvidia.com/gpu" not in sidecar_of(workload)["resources"]["limits"]


def test_example_sets_the_sidecar_image() -> None:
    workload = by_name(rendered(EXAMPLE), "Deployment", "vllm")
    assert sidecar_of(workload)["image"] == "registry.example.com/vllm-kv-headroom:0.1.0"


# --- validation against the APIs -------------------------------------------------------------


def test_rendered_core_objects_are_valid_kubernetes(tmp_path: Path) -> None:
    checked = 0
    for where, obj in all_rendered_objects(tmp_path):
        if obj["kind"] in OPERATOR_KINDS:
            continue
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                name = f"{obj['kind']}/{obj['metadata']['name']}"
                pytest.fail(f"{where}: {name} invalid in Kubernetes {version}: {e.message}")
        checked += 1
    assert checked


def _strict(schema: Any) -> Any:
    """The schema with unknown fields refused, as the API server's strict field validation
    (kubectl's default) refuses them, except where the CRD keeps unknown fields on purpose."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if isinstance(out.get("pattern"), str) and "(?i)" in out["pattern"]:
        # Go's regexp takes inline flags anywhere; Python's only at the start.
        out["pattern"] = "(?i)" + out["pattern"].replace("(?i)", "")
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@functools.cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) → the CRD's OpenAPI schema for that served version."""
    schemas = {}
    for path in sorted(p for folder in CRD_DIRS for p in folder.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        for version in crd["spec"]["versions"]:
            key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
            schemas[key] = _strict(version["schema"]["openAPIV3Schema"])
    return schemas


def validate_operator_object(obj: dict[str, Any]) -> None:
    schema = crd_schemas()[(obj["apiVersion"], obj["kind"])]
    jsonschema.validate(obj, schema, cls=jsonschema.Draft7Validator)


def test_rendered_operator_objects_match_the_operator_crds(tmp_path: Path) -> None:
    seen = set()
    for where, obj in all_rendered_objects(tmp_path):
        if obj["kind"] not in OPERATOR_KINDS:
            continue
        try:
            validate_operator_object(obj)
        except jsonschema.ValidationError as e:
            path = ".".join(str(p) for p in e.absolute_path)
            pytest.fail(f"{where}: {obj['kind']}/{obj['metadata']['name']} at {path}: {e.message}")
        seen.add(obj["kind"])
    assert {"PodMonitor", "ServiceMonitor", "ScaledObject"} <= seen


def test_validators_reject_a_misspelt_field() -> None:
    deployment = by_name(rendered(EXAMPLE), "Deployment", "vllm")
    pod_spec(deployment)["shareProcessNamespaces"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[0], strict=True)
    monitor = by_name(rendered(EXAMPLE), "PodMonitor", "vllm-kv-headroom")
    monitor["spec"]["podMetricEndpoints"] = monitor["spec"].pop("podMetricsEndpoints")
    with pytest.raises(jsonschema.ValidationError):
        validate_operator_object(monitor)


# --- monitoring objects equal rules/ and dashboards/ -----------------------------------------


def generated_objects() -> list[dict[str, Any]]:
    return rendered(KUBERNETES / "generated")


def rule_sources() -> dict[str, Any]:
    """rules/ file → its groups, for the files that are rules (not promtool tests)."""
    out = {}
    for path in sorted((ROOT / "rules").glob("*.y*ml")):
        data = yaml.safe_load(path.read_text())
        if isinstance(data, dict) and "groups" in data:
            out[f"rules/{path.name}"] = data["groups"]
    return out


def test_prometheus_rules_equal_the_rule_files() -> None:
    rules = {
        o["metadata"]["annotations"]["vllm-kv-headroom/generated-from"]: o["spec"]["groups"]
        for o in generated_objects()
        if o["kind"] == "PrometheusRule"
    }
    assert rules == rule_sources()


def test_dashboard_configmaps_equal_the_dashboards() -> None:
    maps = [o for o in generated_objects() if o["kind"] == "ConfigMap"]
    assert all(m["metadata"]["labels"]["grafana_dashboard"] == "1" for m in maps)
    data = {k: v for m in maps for k, v in m["data"].items()}
    files = {p.name: p.read_text() for p in sorted((ROOT / "dashboards").glob("*.json"))}
    assert data == files


def promtool() -> str:
    """promtool's path; a missing promtool fails the test rather than skipping it, so a
    run without it cannot pass these checks unseen."""
    path = shutil.which("promtool")
    assert path, "promtool is missing: install Debian's prometheus package (.ci/run does)"
    return path


def test_prometheus_rule_groups_pass_promtool(tmp_path: Path) -> None:
    rules = [o for o in generated_objects() if o["kind"] == "PrometheusRule"]
    # A generator that writes no PrometheusRule would otherwise leave nothing to check.
    assert rules, "deploy/generate.py wrote no PrometheusRule from rules/"
    files = []
    for rule in rules:
        path = tmp_path / f"{rule['metadata']['name']}.yml"
        path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
        files.append(str(path))
    proc = subprocess.run(
        [promtool(), "check", "rules", *files],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_generated_monitoring_objects_are_up_to_date() -> None:
    proc = subprocess.run(
        [sys.executable, str(DEPLOY / "generate.py"), "--check"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr


# --- selectors agree ---------------------------------------------------------------------------


def test_podmonitor_selects_the_pods_the_component_labels() -> None:
    objects = rendered(EXAMPLE)
    labels = by_name(objects, "Deployment", "vllm")["spec"]["template"]["metadata"]["labels"]
    monitor = by_name(objects, "PodMonitor", "vllm-kv-headroom")["spec"]
    assert monitor["selector"]["matchLabels"].items() <= labels.items()


def test_podmonitor_scrapes_the_sidecar_and_vllm() -> None:
    objects = rendered(EXAMPLE)
    vllm = pod_spec(by_name(objects, "Deployment", "vllm"))["containers"][0]
    endpoints = by_name(objects, "PodMonitor", "vllm-kv-headroom")["spec"]["podMetricsEndpoints"]
    assert [e.get("port") for e in endpoints] == ["kv-headroom", None]
    assert endpoints[1]["targetPort"] in [p["containerPort"] for p in vllm["ports"]]


def test_vllm_endpoints_get_a_job_the_sidecar_down_alerts_do_not_select() -> None:
    pod_monitor = by_name(rendered(EXAMPLE), "PodMonitor", "vllm-kv-headroom")
    service_monitor = by_name(
        rendered(KUBERNETES / "servicemonitor"), "ServiceMonitor", "vllm-kv-headroom"
    )
    (pod_job,) = pod_monitor["spec"]["podMetricsEndpoints"][1]["relabelings"]
    (service_job,) = service_monitor["spec"]["endpoints"][1]["relabelings"]
    assert pod_job["targetLabel"] == service_job["targetLabel"] == "job"
    for job in (pod_job["replacement"].replace("$1", "llm"), service_job["replacement"]):
        assert not re.fullmatch(".*kv-headroom.*", job), job


def test_servicemonitor_reaches_the_sidecar_and_vllm_through_its_service() -> None:
    objects = rendered(KUBERNETES / "servicemonitor")
    service = by_name(objects, "Service", "vllm-kv-headroom")
    monitor = by_name(objects, "ServiceMonitor", "vllm-kv-headroom")["spec"]
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    ports = {p["name"]: p["targetPort"] for p in service["spec"]["ports"]}
    assert ports == {"kv-headroom": "kv-headroom", "vllm": 8000}
    assert [e["port"] for e in monitor["endpoints"]] == ["kv-headroom", "vllm"]
    assert service["spec"]["selector"] == {"vllm-kv-headroom/sidecar": "true"}


def test_example_names_the_gpu_so_expected_capacity_works() -> None:
    objects = rendered(EXAMPLE)
    env = container_env(objects, sidecar_of(by_name(objects, "Deployment", "vllm")))
    proc = check_config([], {"KV_HEADROOM_DEPLOYMENT_GPU": env["KV_HEADROOM_DEPLOYMENT_GPU"]})
    assert proc.returncode == 0, proc.stderr
    assert env["KV_HEADROOM_NVML_ENABLED"] == "false"  # so the GPU must come from the name


def test_example_labels_monitors_and_rules_for_kube_prometheus_stack() -> None:
    labelled = {
        o["kind"]: o["metadata"]["labels"].get("release")
        for o in rendered(EXAMPLE)
        if o["kind"] in OPERATOR_KINDS
    }
    release = "kube-prometheus-stack"
    assert labelled == {"PodMonitor": release, "PrometheusRule": release}


# --- the sidecar's configuration -------------------------------------------------------------


def check_config(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KV_HEADROOM_")}
    return subprocess.run(
        [sys.executable, "-m", "exporter", "serve", "--check-config", *args],
        capture_output=True, text=True, timeout=60, check=False, cwd=ROOT,
        env={**clean, **env},
    )  # fmt: skip


def sidecars(tmp_path: Path) -> Iterator[tuple[str, dict[str, Any], dict[str, str]]]:
    """(where, the sidecar container, its environment) in everything the tests render."""
    groups = [(p.relative_to(ROOT).as_posix(), rendered(p)) for p in renderable_dirs()]
    groups.append(("sidecar + nvml components", with_components(tmp_path, "sidecar", "nvml")))
    for where, objects in groups:
        for obj in objects:
            if obj["kind"] in ("Deployment", "StatefulSet"):
                for c in pod_spec(obj)["containers"]:
                    if c["name"] == "kv-headroom":
                        name = f"{where}: {obj['kind']}/{obj['metadata']['name']}"
                        yield name, c, container_env(objects, c)


def test_sidecar_settings_in_the_manifests_pass_check_config(tmp_path: Path) -> None:
    checked = 0
    for where, container, env in sidecars(tmp_path):
        proc = check_config(container.get("args", []), env)
        assert proc.returncode == 0, f"{where}:\n{proc.stderr}"
        checked += 1
    assert checked >= 2  # the example, and the components on their own


def test_check_config_sees_the_manifest_settings(tmp_path: Path) -> None:
    (_, container, env), *_ = sidecars(tmp_path)
    shown = check_config(container["args"], env).stdout
    assert re.search(r"^nvml\.enabled\s+false\s+\(env\)$", shown, re.M)
    assert re.search(r"^vllm\.url\s+http://127\.0\.0\.1:8000\s+\(flag\)$", shown, re.M)
    assert re.search(r"^web\.listen_address\s+:9847\s+\(flag\)$", shown, re.M)


# --- plain Prometheus --------------------------------------------------------------------------


def prometheus_config() -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    return config


def test_plain_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    config = prometheus_config()
    for job in config["scrape_configs"]:
        # Debian builds Prometheus without Kubernetes discovery, so its promtool refuses the
        # field; a static target in its place keeps the relabelling rules checked.
        if job.pop("kubernetes_sd_configs", None) is not None:
            job["static_configs"] = [{"targets": ["127.0.0.1:9847"]}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    shutil.copytree(ROOT / "rules", tmp_path / "rules", ignore=shutil.ignore_patterns("tests"))
    proc = subprocess.run(
        [promtool(), "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _keeps(job: dict[str, Any]) -> dict[str, str]:
    return {
        r["source_labels"][0]: r["regex"]
        for r in job["relabel_configs"]
        if r.get("action") == "keep"
    }


def _discovered_jobs() -> dict[str, dict[str, Any]]:
    return {
        j["job_name"]: j
        for j in prometheus_config()["scrape_configs"]
        if "kubernetes_sd_configs" in j
    }


def test_plain_prometheus_keeps_the_pods_and_port_the_component_sets(tmp_path: Path) -> None:
    workload = by_name(with_components(tmp_path, "sidecar"), "Deployment", "vllm")
    labels = workload["spec"]["template"]["metadata"]["labels"]
    port = sidecar_of(workload)["ports"][0]["name"]
    keeps = _keeps(_discovered_jobs()["kv-headroom"])
    # Prometheus turns every character of a label name that is not [a-zA-Z0-9_] into "_".
    meta = {
        "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", k): v
        for k, v in labels.items()
    }
    assert keeps.pop("__meta_kubernetes_pod_container_port_name") == port
    assert keeps.items() <= meta.items()
    assert keeps


def test_plain_prometheus_scrapes_vllm_on_the_default_port_of_the_same_pods() -> None:
    jobs = _discovered_jobs()
    sidecar_keeps, vllm_keeps = _keeps(jobs["kv-headroom"]), _keeps(jobs["vllm"])
    assert vllm_keeps.pop("__meta_kubernetes_pod_container_port_number") == "8000"
    sidecar_keeps.pop("__meta_kubernetes_pod_container_port_name")
    assert vllm_keeps == sidecar_keeps


def test_plain_prometheus_job_names_match_the_rules_job_selectors() -> None:
    """Sidecar jobs match the sidecar-down alerts' selector; vLLM's jobs must not."""
    selectors = re.findall(
        r'\bup\{job=~"([^"]+)"\}', json.dumps(rule_sources()).replace('\\"', '"')
    )
    # Rules that stop selecting by job would otherwise leave nothing to compare.
    assert selectors, "no rule selects the sidecar's up series by job"
    for job in prometheus_config()["scrape_configs"]:
        name = job["job_name"]
        for selector in selectors:
            assert bool(re.fullmatch(selector, name)) == ("kv-headroom" in name), name
