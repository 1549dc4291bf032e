"""Scrape configurations as Kubernetes would give them to Prometheus, for a Prometheus that
has no Kubernetes API to ask (Debian builds it without Kubernetes discovery).

- `pod_targets`: the targets Prometheus's `kubernetes_sd_configs` role `pod` discovers for
  one running pod, one per declared container port, with the `__meta_kubernetes_pod_*`
  labels its documentation lists. They go into `static_configs`, so the relabelling that
  follows is Prometheus's own.
- `podmonitor_scrape_configs`: the scrape jobs the Prometheus Operator generates from a
  PodMonitor, relabel rule for relabel rule, after `generatePodMonitorConfig` in the
  operator's pkg/prometheus/promcfg.go (v0.93): the job-name stash, the running-pod
  filter, one keep per selector label, the port keep (name, or number for targetPort), the
  namespace/container/pod labels, job "<namespace>/<name>", the endpoint label, then the
  endpoint's own relabelings.
- `endpoint_targets` and `servicemonitor_scrape_configs`: the same for a Service and its
  ServiceMonitor (`role: endpoints`).
"""

from __future__ import annotations

import re
from typing import Any

_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def sanitize(name: str) -> str:
    """A Kubernetes label name as a Prometheus label name."""
    return _INVALID.sub("_", name)


def pod_targets(
    template: dict[str, Any], namespace: str, pod_name: str, ip: str = "127.0.0.1"
) -> list[dict[str, Any]]:
    """Static target groups equal to what pod discovery finds for a pod from template."""
    meta = template["metadata"]
    common = {
        "__meta_kubernetes_namespace": namespace,
        "__meta_kubernetes_pod_name": pod_name,
        "__meta_kubernetes_pod_ip": ip,
        "__meta_kubernetes_pod_ready": "true",
        "__meta_kubernetes_pod_phase": "Running",
        "__meta_kubernetes_pod_node_name": "node-1",
        "__meta_kubernetes_pod_host_ip": ip,
        "__meta_kubernetes_pod_uid": "00000000-0000-0000-0000-000000000001",
        "__meta_kubernetes_pod_controller_kind": "ReplicaSet",
        "__meta_kubernetes_pod_controller_name": pod_name.rsplit("-", 1)[0],
    }
    for key, value in (meta.get("labels") or {}).items():
        common[f"__meta_kubernetes_pod_label_{sanitize(key)}"] = value
        common[f"__meta_kubernetes_pod_labelpresent_{sanitize(key)}"] = "true"
    for key, value in (meta.get("annotations") or {}).items():
        common[f"__meta_kubernetes_pod_annotation_{sanitize(key)}"] = value
        common[f"__meta_kubernetes_pod_annotationpresent_{sanitize(key)}"] = "true"
    groups = []
    for container in template["spec"]["containers"]:
        for port in container.get("ports", []):
            labels = {
                **common,
                "__meta_kubernetes_pod_container_init": "false",
                "__meta_kubernetes_pod_container_name": container["name"],
                "__meta_kubernetes_pod_container_image": container["image"],
                "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
                "__meta_kubernetes_pod_container_port_protocol": port.get("protocol", "TCP"),
            }
            groups.append({"targets": [f"{ip}:{port['containerPort']}"], "labels": labels})
    return groups


_RELABEL_KEYS = {
    "sourceLabels": "source_labels",
    "targetLabel": "target_label",
    "replacement": "replacement",
    "regex": "regex",
    "separator": "separator",
    "action": "action",
    "modulus": "modulus",
}


def _relabel(rule: dict[str, Any]) -> dict[str, Any]:
    out = {_RELABEL_KEYS[k]: v for k, v in rule.items()}
    if "action" in out:
        out["action"] = out["action"].lower()
    return out


def podmonitor_scrape_configs(
    monitor: dict[str, Any], namespace: str, targets: list[dict[str, Any]], interval: str
) -> list[dict[str, Any]]:
    """One scrape job per podMetricsEndpoint, as the Operator writes them, discovering
    `targets` (from pod_targets); every interval set to `interval` so a test runs fast."""
    name = monitor["metadata"]["name"]
    spec = monitor["spec"]
    jobs = []
    for i, ep in enumerate(spec["podMetricsEndpoints"]):
        relabel: list[dict[str, Any]] = [
            {"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"},
            {
                "action": "drop",
                "source_labels": ["__meta_kubernetes_pod_phase"],
                "regex": "(Failed|Succeeded)",
            },
        ]
        for key in sorted(spec["selector"].get("matchLabels", {})):
            value = spec["selector"]["matchLabels"][key]
            relabel.append({
                "action": "keep",
                "source_labels": [f"__meta_kubernetes_pod_label_{sanitize(key)}",
                                  f"__meta_kubernetes_pod_labelpresent_{sanitize(key)}"],
                "regex": f"({value});true",
            })  # fmt: skip
        assert not spec["selector"].get("matchExpressions"), "not modelled"
        if ep.get("port"):
            relabel.append({
                "action": "keep",
                "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                "regex": ep["port"],
            })  # fmt: skip
        elif isinstance(ep.get("targetPort"), int):
            relabel.append({
                "action": "keep",
                "source_labels": ["__meta_kubernetes_pod_container_port_number"],
                "regex": str(ep["targetPort"]),
            })  # fmt: skip
        elif ep.get("targetPort"):
            relabel.append({
                "action": "keep",
                "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                "regex": ep["targetPort"],
            })  # fmt: skip
        for meta, label in (
            ("namespace", "namespace"),
            ("pod_container_name", "container"),
            ("pod_name", "pod"),
        ):
            relabel.append({"source_labels": [f"__meta_kubernetes_{meta}"], "target_label": label})
        relabel.append({"target_label": "job", "replacement": f"{namespace}/{name}"})
        endpoint = ep.get("port") or str(ep.get("targetPort", ""))
        if endpoint:
            relabel.append({"target_label": "endpoint", "replacement": endpoint})
        relabel += [_relabel(r) for r in ep.get("relabelings", [])]
        jobs.append({
            "job_name": f"podMonitor/{namespace}/{name}/{i}",
            "honor_labels": bool(ep.get("honorLabels", False)),
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "metrics_path": ep.get("path", "/metrics"),
            "static_configs": targets,
            "relabel_configs": relabel,
        })  # fmt: skip
    return jobs


def endpoint_targets(
    service: dict[str, Any], template: dict[str, Any], namespace: str, pod_name: str,
    ip: str = "127.0.0.1",
) -> list[dict[str, Any]]:  # fmt: skip
    """Static target groups equal to what `role: endpoints` discovery finds for one ready pod
    behind service: one target per service port, the port resolved as the endpoints
    controller does (a name through the pod's container ports), with the endpoint, service
    and pod labels (the pod's container labels for the container that declares the port)."""
    pod_groups = pod_targets(template, namespace, pod_name, ip)
    meta = service["metadata"]
    service_labels = {
        "__meta_kubernetes_namespace": namespace,
        "__meta_kubernetes_endpoints_name": meta["name"],
        "__meta_kubernetes_service_name": meta["name"],
    }
    for key, value in (meta.get("labels") or {}).items():
        service_labels[f"__meta_kubernetes_service_label_{sanitize(key)}"] = value
        service_labels[f"__meta_kubernetes_service_labelpresent_{sanitize(key)}"] = "true"
    groups = []
    for port in service["spec"]["ports"]:
        target = port.get("targetPort", port["port"])
        (pod_group,) = [
            g for g in pod_groups
            if target in (g["labels"]["__meta_kubernetes_pod_container_port_name"],
                          int(g["labels"]["__meta_kubernetes_pod_container_port_number"]))
        ]  # fmt: skip
        number = pod_group["labels"]["__meta_kubernetes_pod_container_port_number"]
        labels = {
            **pod_group["labels"],
            **service_labels,
            "__meta_kubernetes_endpoint_port_name": port.get("name", ""),
            "__meta_kubernetes_endpoint_port_protocol": port.get("protocol", "TCP"),
            "__meta_kubernetes_endpoint_ready": "true",
            "__meta_kubernetes_endpoint_address_target_kind": "Pod",
            "__meta_kubernetes_endpoint_address_target_name": pod_name,
        }
        groups.append({"targets": [f"{ip}:{number}"], "labels": labels})
    return groups


def servicemonitor_scrape_configs(
    monitor: dict[str, Any], namespace: str, targets: list[dict[str, Any]], interval: str
) -> list[dict[str, Any]]:
    """One scrape job per ServiceMonitor endpoint, as the Operator writes them
    (`generateServiceMonitorConfig`, v0.93, role endpoints): the job-name stash, one keep per
    service selector label, the endpoint port keep, node/pod from the address target, the
    namespace/service/pod/container labels, job = the service's name, endpoint, then the
    endpoint's own relabelings."""
    name = monitor["metadata"]["name"]
    spec = monitor["spec"]
    jobs = []
    for i, ep in enumerate(spec["endpoints"]):
        relabel: list[dict[str, Any]] = [
            {"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"},
        ]
        for key in sorted(spec["selector"].get("matchLabels", {})):
            value = spec["selector"]["matchLabels"][key]
            relabel.append({
                "action": "keep",
                "source_labels": [f"__meta_kubernetes_service_label_{sanitize(key)}",
                                  f"__meta_kubernetes_service_labelpresent_{sanitize(key)}"],
                "regex": f"({value});true",
            })  # fmt: skip
        assert not spec["selector"].get("matchExpressions"), "not modelled"
        relabel.append({
            "action": "keep",
            "source_labels": ["__meta_kubernetes_endpoint_port_name"],
            "regex": ep["port"],
        })  # fmt: skip
        target = ["__meta_kubernetes_endpoint_address_target_kind",
                  "__meta_kubernetes_endpoint_address_target_name"]  # fmt: skip
        relabel += [
            {"source_labels": target, "separator": ";", "regex": "Node;(.*)",
             "replacement": "${1}", "target_label": "node"},
            {"source_labels": target, "separator": ";", "regex": "Pod;(.*)",
             "replacement": "${1}", "target_label": "pod"},
        ]  # fmt: skip
        for meta, label in (
            ("namespace", "namespace"),
            ("service_name", "service"),
            ("pod_name", "pod"),
            ("pod_container_name", "container"),
        ):
            relabel.append({"source_labels": [f"__meta_kubernetes_{meta}"], "target_label": label})
        relabel += [
            {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"],
             "regex": "(Failed|Succeeded)"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job",
             "replacement": "${1}"},
            {"target_label": "endpoint", "replacement": ep["port"]},
        ]  # fmt: skip
        relabel += [_relabel(r) for r in ep.get("relabelings", [])]
        jobs.append({
            "job_name": f"serviceMonitor/{namespace}/{name}/{i}",
            "honor_labels": bool(ep.get("honorLabels", False)),
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "metrics_path": ep.get("path", "/metrics"),
            "static_configs": targets,
            "relabel_configs": relabel,
        })  # fmt: skip
    return jobs
