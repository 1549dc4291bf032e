"""deploy/recipes/: the sidecar in the deployers people use, rendered and validated.

- production-stack: the values pass the chart's own values.schema.json, and the Helm
  post-renderer, run for real on the Deployment the chart renders for them, adds a sidecar
  that mounts a volume of the pod and passes `serve --check-config`.
- KServe: the ServingRuntime passes KServe's CRD schema, its sidecar equals the component's
  where it matters, and the PodMonitor scrapes KServe's port.
- llm-d: the ModelService values pass the chart's schema, with the same sidecar, watching
  vLLM rather than the routing proxy.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.conftest import require
from tests.deploy.conftest import DEPLOY, FIXTURES, kubectl_problem, kustomize, pod_spec
from tests.deploy.test_manifests import (
    K8S_VERSIONS,
    OPERATOR_KINDS,
    _strict,
    by_name,
    check_config,
    container_env,
    validate_operator_object,
    with_components,
)

RECIPES = DEPLOY / "recipes"
SIDECAR = "kv-headroom"
# Fields the recipes must carry exactly as the sidecar component does.
SAME_AS_COMPONENT = ("args", "ports", "livenessProbe", "readinessProbe", "resources",
                     "securityContext", "imagePullPolicy")  # fmt: skip


def _sidecar(containers: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = [c for c in containers if c["name"] == SIDECAR]
    return container


def component_sidecar(tmp_path: Path) -> dict[str, Any]:
    return _sidecar(pod_spec(by_name(with_components(tmp_path, "sidecar"), "Deployment", "vllm"))[
        "containers"
    ])  # fmt: skip


def validate(objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        if obj["kind"] in OPERATOR_KINDS:
            validate_operator_object(obj)
        elif obj["kind"] == "ServingRuntime":
            jsonschema.validate(obj, kserve_schema(), cls=jsonschema.Draft7Validator)
        else:
            kubernetes_validate.validate(obj, K8S_VERSIONS[0], strict=True)


def kserve_schema() -> Any:
    crd = yaml.safe_load(
        (FIXTURES / "kserve" / "serving.kserve.io_servingruntimes.yaml").read_text()
    )
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    return _strict(version["schema"]["openAPIV3Schema"])


# --- production-stack -------------------------------------------------------------------


def test_production_stack_values_pass_the_charts_schema() -> None:
    schema = json.loads((FIXTURES / "production-stack" / "values.schema.json").read_text())
    values = yaml.safe_load((RECIPES / "production-stack" / "values.yaml").read_text())
    jsonschema.validate(values, schema)


def test_production_stack_schema_check_rejects_a_misspelt_value() -> None:
    schema = json.loads((FIXTURES / "production-stack" / "values.schema.json").read_text())
    values = yaml.safe_load((RECIPES / "production-stack" / "values.yaml").read_text())
    values["servingEngineSpec"]["modelSpec"][0]["replicaCount"] = "one"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(values, schema)


@pytest.fixture(scope="module")
def post_rendered() -> list[dict[str, Any]]:
    require(kubectl_problem())
    require(None if shutil.which("realpath") else "the post-renderer needs coreutils' realpath")
    chart = (FIXTURES / "production-stack" / "rendered-deployment.yaml").read_text()
    proc = subprocess.run(
        [str(RECIPES / "production-stack" / "post-render")],
        input=chart, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def test_production_stack_post_render_output_is_valid(post_rendered: list[dict[str, Any]]) -> None:
    validate(post_rendered)
    assert {"Deployment", "PodMonitor", "PrometheusRule"} <= {o["kind"] for o in post_rendered}


def test_production_stack_sidecar_mounts_the_charts_model_volume(
    post_rendered: list[dict[str, Any]],
) -> None:
    (deployment,) = [o for o in post_rendered if o["kind"] == "Deployment"]
    spec = pod_spec(deployment)
    sidecar = _sidecar(spec["containers"])
    volumes = {v["name"] for v in spec["volumes"]}
    assert all(m["name"] in volumes for m in sidecar["volumeMounts"])
    env = container_env(post_rendered, sidecar)
    (mount,) = sidecar["volumeMounts"]
    assert env["KV_HEADROOM_MODEL_PATH"].startswith(mount["mountPath"] + "/")


def test_production_stack_keeps_vllm_the_default_container(
    post_rendered: list[dict[str, Any]],
) -> None:
    (deployment,) = [o for o in post_rendered if o["kind"] == "Deployment"]
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["kubectl.kubernetes.io/default-container"] == "vllm"


def test_production_stack_podmonitor_scrapes_the_charts_vllm_port(
    post_rendered: list[dict[str, Any]],
) -> None:
    (deployment,) = [o for o in post_rendered if o["kind"] == "Deployment"]
    vllm = next(c for c in pod_spec(deployment)["containers"] if c["name"] == "vllm")
    monitor = by_name(post_rendered, "PodMonitor", "vllm-kv-headroom")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    target = monitor["spec"]["podMetricsEndpoints"][1]["targetPort"]
    assert target in [p["containerPort"] for p in vllm["ports"]]


def test_production_stack_sidecar_settings_pass_check_config(
    post_rendered: list[dict[str, Any]],
) -> None:
    (deployment,) = [o for o in post_rendered if o["kind"] == "Deployment"]
    sidecar = _sidecar(pod_spec(deployment)["containers"])
    env = container_env(post_rendered, sidecar)
    proc = check_config(
        sidecar["args"], {k: v for k, v in env.items() if k != "KV_HEADROOM_MODEL_PATH"}
    )
    assert proc.returncode == 0, proc.stderr


# --- KServe -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kserve() -> list[dict[str, Any]]:
    return kustomize(RECIPES / "kserve")


def test_kserve_recipe_is_valid(kserve: list[dict[str, Any]]) -> None:
    validate(kserve)


def test_kserve_schema_check_rejects_a_field_kserve_lacks(kserve: list[dict[str, Any]]) -> None:
    runtime = by_name(kserve, "ServingRuntime", "vllm-kv-headroom")
    runtime["spec"]["shareProcessNamespace"] = True  # not in ServingRuntimePodSpec
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(runtime, kserve_schema(), cls=jsonschema.Draft7Validator)


def test_kserve_sidecar_equals_the_component_sidecar(
    kserve: list[dict[str, Any]], tmp_path: Path
) -> None:
    ours = _sidecar(by_name(kserve, "ServingRuntime", "vllm-kv-headroom")["spec"]["containers"])
    theirs = component_sidecar(tmp_path)
    differ = [k for k in SAME_AS_COMPONENT if k != "args" and ours.get(k) != theirs.get(k)]
    assert not differ
    port = ours["args"][0].rsplit(":", 1)[1]
    assert [a for a in ours["args"] if not a.startswith("--vllm.url=")] == [
        a for a in theirs["args"] if not a.startswith("--vllm.url=")
    ]
    assert port == "8080"


def test_kserve_podmonitor_scrapes_the_runtimes_vllm_port(kserve: list[dict[str, Any]]) -> None:
    runtime = by_name(kserve, "ServingRuntime", "vllm-kv-headroom")
    (vllm,) = [c for c in runtime["spec"]["containers"] if c["name"] == "kserve-container"]
    monitor = by_name(kserve, "PodMonitor", "vllm-kv-headroom")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= runtime["spec"]["labels"].items()
    target = monitor["spec"]["podMetricsEndpoints"][1]["targetPort"]
    assert target in [p["containerPort"] for p in vllm["ports"]]
    assert f"--port={target}" in vllm["args"]


def test_kserve_sidecar_settings_pass_check_config(kserve: list[dict[str, Any]]) -> None:
    runtime = by_name(kserve, "ServingRuntime", "vllm-kv-headroom")
    sidecar = _sidecar(runtime["spec"]["containers"])
    env = {e["name"]: e["value"] for e in sidecar["env"] if e["name"] != "KV_HEADROOM_MODEL_PATH"}
    proc = check_config(sidecar["args"], env)
    assert proc.returncode == 0, proc.stderr


# --- llm-d ------------------------------------------------------------------------------


def llm_d_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((RECIPES / "llm-d" / "values.yaml").read_text())
    return values


def test_llm_d_values_pass_the_charts_schema() -> None:
    schema = json.loads((FIXTURES / "llm-d" / "values.schema.json").read_text())
    jsonschema.validate(llm_d_values(), schema)


def test_llm_d_sidecar_equals_the_component_sidecar(tmp_path: Path) -> None:
    ours = _sidecar(llm_d_values()["decode"]["containers"])
    theirs = component_sidecar(tmp_path)
    assert not [k for k in SAME_AS_COMPONENT if k != "args" and ours.get(k) != theirs.get(k)]
    rest = [a for a in ours["args"] if not a.startswith("--vllm.url=")]
    assert rest == [a for a in theirs["args"] if not a.startswith("--vllm.url=")]


def test_llm_d_sidecar_watches_vllm_not_the_routing_proxy() -> None:
    containers = llm_d_values()["decode"]["containers"]
    vllm = next(c for c in containers if c["name"] == "vllm")
    url = next(a for a in _sidecar(containers)["args"] if a.startswith("--vllm.url="))
    (port,) = [p["containerPort"] for p in vllm["ports"]]
    assert url == f"--vllm.url=http://127.0.0.1:{port}"
    assert f"--port={port}" in vllm["args"]


def test_llm_d_podmonitor_selects_the_pods_and_scrapes_vllms_port() -> None:
    values = llm_d_values()
    monitor = by_name(kustomize(RECIPES / "llm-d"), "PodMonitor", "vllm-kv-headroom")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= (
        values["modelArtifacts"]["labels"].items()
    )
    vllm = next(c for c in values["decode"]["containers"] if c["name"] == "vllm")
    assert (
        monitor["spec"]["podMetricsEndpoints"][1]["targetPort"] == vllm["ports"][0]["containerPort"]
    )


def test_llm_d_sidecar_settings_pass_check_config() -> None:
    sidecar = _sidecar(llm_d_values()["decode"]["containers"])
    env = {e["name"]: e["value"] for e in sidecar["env"] if e["name"] != "KV_HEADROOM_MODEL_PATH"}
    proc = check_config(sidecar["args"], env)
    assert proc.returncode == 0, proc.stderr
