"""deploy/README.md's recipe for an existing vLLM Deployment, end to end through a real
Prometheus (Debian's package): the rendered PodMonitor, turned into the scrape jobs the
Prometheus Operator writes for it, discovers the rendered pod (its containers, ports and
labels as the recipe renders them) and scrapes the simulated vLLM and a sidecar started
with the rendered container's arguments and environment, every second, with rules/ loaded.

Every recording rule and every dashboard panel must return data with the dashboard
variables set to what the sidecar reports (so vLLM's series carry the same namespace, pod
and model as the sidecar's), and the vLLM-only alerts' join must find the sidecar. Two more
Prometheus runs scrape the same pod through the ServiceMonitor variant and through
deploy/prometheus/prometheus.yml, and must find both endpoints under their own jobs.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboards.capacity import RUNWAY_PANELS
from dashboards.generate import panel_queries, runnable
from tests.conftest import require
from tests.deploy.conftest import kubectl_problem, kustomize, overlay, sidecar_of, vllm_deployment
from tests.deploy.recipes import readme_recipe, set_parameters
from tests.integration.kubernetes_scrape import (
    endpoint_targets,
    pod_targets,
    podmonitor_scrape_configs,
    servicemonitor_scrape_configs,
)
from tests.processes import ROOT, RULES, Prometheus, Sidecar
from tests.rules.rulefiles import HISTORY_GROUP

NAMESPACE = "llm"
MODEL_DIR = ROOT / "tests" / "fixtures" / "models" / "meta-llama__Llama-3.1-8B-Instruct"
# Read from NVML only, which a sidecar without a GPU cannot have (the nvml component and a
# GPU node do): their panels stay empty here and are checked by the demo's simulated NVML
# in test_prometheus_stack.py.
NVML_ONLY = ("kv_headroom_gpu_memory_", "kv_headroom_gpu_info", 'source="nvml"')
POD = "my-vllm-7d9f8b6c5-x2k4q"
WITHIN_S = 120.0  # every record and panel has data after a few 1 s scrapes; bound on CI


@pytest.fixture(autouse=True)
def _prometheus_and_kubectl() -> None:
    require(None if Prometheus.available() else "needs Debian's prometheus package")
    require(kubectl_problem())


@dataclass
class Run:
    prometheus: Prometheus
    objects: list[dict[str, Any]]
    sidecar_log: str


def record_names() -> list[str]:
    return [
        rule["record"]
        for path in RULES
        for group in yaml.safe_load(path.read_text())["groups"]
        if group["name"] != HISTORY_GROUP  # weeks of history: test_runway_e2e.py
        for rule in group["rules"]
        if "record" in rule
    ]


def _simulator() -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.deploy.simulated_vllm", "--max-seconds", "400"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("port "), f"simulator did not start: {line!r}"
    return proc, int(line.split()[1])


def _render(tmp: Path, vllm_port: int, monitor: str = "podmonitor") -> list[dict[str, Any]]:
    """The README's recipe, vLLM listening on the simulator's port (vLLM's --port, and
    the Parameters' vllmPort, as the README says to set it), with the PodMonitor or the
    ServiceMonitor variant."""
    recipe = set_parameters(readme_recipe(), vllmPort=vllm_port)
    recipe["resources"] = [r.replace("/podmonitor", f"/{monitor}") for r in recipe["resources"]]
    recipe["namespace"] = NAMESPACE
    files = {"my-vllm.yaml": vllm_deployment(port=vllm_port)}
    return kustomize(overlay(tmp, recipe, files))


def _sidecar(objects: list[dict[str, Any]], vllm_url: str) -> Sidecar:
    """A sidecar with the rendered container's arguments and environment; only the vLLM URL
    and listen address differ (this test shares the host's network with other runs)."""
    (workload,) = [o for o in objects if o["kind"] == "Deployment"]
    container = sidecar_of(workload)
    args = [
        a for a in container["args"] if not a.startswith(("--vllm.url=", "--web.listen-address="))
    ]
    configmaps = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}
    env = {}
    for source in container.get("envFrom", []):
        env.update(configmaps[source["configMapRef"]["name"]]["data"])
    # An empty /proc: the sidecar must not adopt vLLM processes that run on this machine.
    proc_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"kv-headroom-proc-{os.getpid()}"
    proc_dir.mkdir(exist_ok=True)
    env["KV_HEADROOM_PROC_PATH"] = str(proc_dir)
    # The model vLLM (simulated) serves, where the pod's volume would hold it; with no vLLM
    # command line to read, the sidecar takes the path from its settings (deploy/README.md).
    env["KV_HEADROOM_MODEL_PATH"] = str(MODEL_DIR)
    # Faster polls than the shipped 2 s, so the records fill within seconds.
    sidecar = Sidecar(vllm_url, *args, "--poll.interval=1s", "--vllm.timeout=500ms")
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # Sidecar passes this process's environment on
    try:
        sidecar.start(timeout=60)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return sidecar


def _pod_template(objects: list[dict[str, Any]], sidecar_port: int) -> dict[str, Any]:
    """The rendered pod template, the sidecar's container port where this run's sidecar
    listens (it shares the host's network with other runs, so not on 9847)."""
    (workload,) = [o for o in copy.deepcopy(objects) if o["kind"] == "Deployment"]
    for port in sidecar_of(workload)["ports"]:
        port["containerPort"] = sidecar_port
    template: dict[str, Any] = workload["spec"]["template"]
    return template


def _scrape_config(objects: list[dict[str, Any]], sidecar_port: int) -> list[dict[str, Any]]:
    targets = pod_targets(_pod_template(objects, sidecar_port), NAMESPACE, POD)
    (monitor,) = [o for o in objects if o["kind"] == "PodMonitor"]
    return podmonitor_scrape_configs(monitor, NAMESPACE, targets, interval="1s")


def _all_have_data(prom: Prometheus, queries: list[str]) -> list[str]:
    return [q for q in queries if not prom.query(q)]


@dataclass
class Stack:
    """The rendered objects, and the simulated vLLM and sidecar they describe, running."""

    objects: list[dict[str, Any]]
    vllm_port: int
    sidecar: Sidecar


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    simulator, vllm_port = _simulator()
    try:
        objects = _render(tmp_path_factory.mktemp("recipe"), vllm_port)
        with _sidecar(objects, f"http://127.0.0.1:{vllm_port}") as sidecar:
            yield Stack(objects, vllm_port, sidecar)
    finally:
        simulator.terminate()
        simulator.wait(timeout=15)
        if simulator.stdout is not None:
            simulator.stdout.close()


def _prometheus(scrape_configs: list[dict[str, Any]]) -> Prometheus:
    prom = Prometheus({}, interval="1s")
    config = yaml.safe_load((prom.dir / "prometheus.yml").read_text())
    config["scrape_configs"] = scrape_configs
    (prom.dir / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    return prom


@pytest.fixture(scope="module")
def run(stack: Stack) -> Iterator[Run]:
    with _prometheus(_scrape_config(stack.objects, stack.sidecar.port)) as prom:
        prom.start()
        deadline = time.monotonic() + WITHIN_S
        while time.monotonic() < deadline:
            # Every query with data for some model: what the tests below then ask of
            # the one model the sidecar reports.
            variables = {**_variables(prom), "model": ".*"}
            wanted = [*record_names(), *(runnable(e, variables) for e in _panels())]
            if not _all_have_data(prom, wanted):
                break
            time.sleep(2.0)
        yield Run(prom, stack.objects, stack.sidecar.log())


def _plain_scrape_configs(stack: Stack) -> list[dict[str, Any]]:
    """deploy/prometheus/prometheus.yml's discovered jobs, discovering the rendered pod, with
    vLLM's port set to where it listens (the edit its comment asks for); the static jobs
    name hosts that do not exist here and are left out."""
    targets = pod_targets(_pod_template(stack.objects, stack.sidecar.port), NAMESPACE, POD)
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    jobs = []
    for job in config["scrape_configs"]:
        if job.pop("kubernetes_sd_configs", None) is None:
            continue
        job["static_configs"] = targets
        for rule in job["relabel_configs"]:
            if rule.get("source_labels") == ["__meta_kubernetes_pod_container_port_number"]:
                rule["regex"] = str(stack.vllm_port)
        jobs.append(job)
    return jobs


def _up_once_both_jobs_are(scrape_configs: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """job → the labels of its one `up == 1` series, once two jobs are up (or time is out)."""
    with _prometheus(scrape_configs) as prom:
        prom.start()
        deadline = time.monotonic() + WITHIN_S
        up: dict[str, dict[str, str]] = {}
        while time.monotonic() < deadline:
            up = {s["metric"]["job"]: s["metric"] for s in prom.query("up == 1")}
            if len(up) >= 2:
                break
            time.sleep(1.0)
        return up


@pytest.fixture(scope="module")
def plain_up(stack: Stack) -> dict[str, dict[str, str]]:
    return _up_once_both_jobs_are(_plain_scrape_configs(stack))


@pytest.fixture(scope="module")
def servicemonitor_up(
    stack: Stack, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, str]]:
    """The ServiceMonitor variant of the recipe: its Service's endpoints for the same pod."""
    objects = _render(tmp_path_factory.mktemp("servicemonitor"), stack.vllm_port, "servicemonitor")
    (service,) = [o for o in objects if o["kind"] == "Service"]
    (monitor,) = [o for o in objects if o["kind"] == "ServiceMonitor"]
    template = _pod_template(objects, stack.sidecar.port)
    targets = endpoint_targets(service, template, NAMESPACE, POD)
    return _up_once_both_jobs_are(
        servicemonitor_scrape_configs(monitor, NAMESPACE, targets, interval="1s")
    )


def _panels() -> list[str]:
    return [
        expr
        for _, panel, expr in panel_queries(ROOT / "dashboards")
        if not any(marker in expr for marker in NVML_ONLY)
        and panel not in RUNWAY_PANELS  # weeks of history: test_runway_e2e.py
    ]


def _variables(prom: Prometheus) -> dict[str, str]:
    """The dashboard variables as Grafana sets them: from kv_headroom_info's labels."""
    info = prom.query("kv_headroom_info")
    if not info:
        return {"namespace": "^$", "pod": "^$", "model": "^$"}  # nothing yet: match nothing
    labels = info[0]["metric"]
    return {
        "namespace": labels.get("namespace", ""),
        "pod": labels.get("pod", ""),
        "model": labels.get("model", ""),
    }


def test_monitor_scrapes_the_sidecar_and_vllm_under_their_own_jobs(run: Run) -> None:
    up = {r["metric"]["job"]: r["value"][1] for r in run.prometheus.query("up")}
    assert up == {f"{NAMESPACE}/vllm-kv-headroom": "1", f"{NAMESPACE}/vllm": "1"}


def test_sidecar_down_alert_selector_picks_only_the_sidecar(run: Run) -> None:
    (series,) = run.prometheus.query('up{job=~".*kv-headroom.*"}')
    assert series["metric"]["container"] == "kv-headroom"


def test_vllm_and_sidecar_series_share_namespace_and_pod(run: Run) -> None:
    for expr in ("vllm:num_requests_running", "kv_headroom_info"):
        (series, *_) = run.prometheus.query(expr)
        assert series["metric"]["namespace"] == NAMESPACE, expr
        assert series["metric"]["pod"] == POD, expr


def test_every_recording_rule_has_data(run: Run) -> None:
    empty = _all_have_data(run.prometheus, record_names())
    assert not empty, f"records without data: {empty}"


def test_every_sidecar_panel_has_data_for_the_sidecars_pod(run: Run) -> None:
    variables = _variables(run.prometheus)
    empty = [
        e
        for e in _panels()
        if "vllm:" not in e and not run.prometheus.query(runnable(e, variables))
    ]
    assert not empty, f"panels without data for {variables}:\n" + "\n".join(empty)


def test_every_vllm_panel_has_data_for_the_sidecars_model(run: Run) -> None:
    """The dashboards' $model comes from kv_headroom_info and filters vLLM's series by
    model_name: the panels on vLLM's own series fill only if the two names agree."""
    variables = _variables(run.prometheus)
    empty = [
        e for e in _panels() if "vllm:" in e and not run.prometheus.query(runnable(e, variables))
    ]
    assert not empty, f"panels without data for {variables}:\n" + "\n".join(empty)


def test_every_rule_evaluates_without_error(run: Run) -> None:
    broken = [
        f"{rule.get('name')}: {rule.get('lastError')}"
        for group in run.prometheus.api("rules")["groups"]
        for rule in group["rules"]
        if rule.get("health") == "err"
    ]
    assert not broken


def test_vllm_only_alerts_find_the_sidecar_for_the_model_vllm_serves(run: Run) -> None:
    """The join the vLLM-only alerts stand down on: vLLM's model_name against the sidecar's
    kv_headroom_info{model} (the served model name, from vLLM's /v1/models)."""
    unmatched = run.prometheus.query(
        "vllm:num_requests_running unless on (model_name)"
        ' label_replace(kv_headroom_info, "model_name", "$1", "model", "(.+)")'
    )
    assert not unmatched, run.sidecar_log[-2000:]


def test_plain_prometheus_config_scrapes_the_sidecar_and_vllm(
    plain_up: dict[str, dict[str, str]],
) -> None:
    assert {job: labels["container"] for job, labels in plain_up.items()} == {
        "kv-headroom": "kv-headroom",
        "vllm": "vllm",
    }
    assert all(labels["namespace"] == NAMESPACE for labels in plain_up.values())
    assert all(labels["pod"] == POD for labels in plain_up.values())


def test_servicemonitor_scrapes_the_sidecar_and_vllm_under_their_own_jobs(
    servicemonitor_up: dict[str, dict[str, str]],
) -> None:
    assert {job: labels["container"] for job, labels in servicemonitor_up.items()} == {
        "vllm-kv-headroom": "kv-headroom",
        "vllm": "vllm",
    }
    assert all(labels["pod"] == POD for labels in servicemonitor_up.values())
