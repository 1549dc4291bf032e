"""Kubernetes NetworkPolicy ingress semantics, enough to decide from rendered objects whether a
peer can reach a pod's port (the rules of the networking.k8s.io/v1 API reference):

- a pod no policy selects for Ingress accepts everything;
- otherwise a connection is accepted when at least one rule of one selecting policy matches
  both its port and its peer (policies only add; none can take away what another allows);
- a rule without `ports` matches every port, one without `from` every peer;
- one peer entry with a namespaceSelector and a podSelector needs both; a podSelector alone
  means pods in the policy's own namespace;
- a named port is resolved against the target pod's container ports; endPort makes a range.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Peer:
    """Where a connection comes from: a pod (namespace and labels) or an address outside."""

    name: str
    namespace: str | None = None  # None: not a pod (a client outside the cluster)
    labels: dict[str, str] = field(default_factory=dict)
    namespace_labels: dict[str, str] = field(default_factory=dict)

    def ns_labels(self) -> dict[str, str]:
        assert self.namespace is not None
        # The API server sets this label on every namespace (Kubernetes 1.21+).
        return {"kubernetes.io/metadata.name": self.namespace, **self.namespace_labels}


@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: dict[str, str]
    containers: list[dict[str, Any]]


def selects(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A LabelSelector; {} selects everything."""
    if selector is None:
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        present = key in labels
        ok = {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels.get(key) not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }[op]
        if not ok:
            return False
    return True


def _port_matches(entry: dict[str, Any], pod: Pod, port: int, protocol: str) -> bool:
    if entry.get("protocol", "TCP") != protocol:
        return False
    want = entry.get("port")
    if want is None:
        return True  # every port of that protocol
    if isinstance(want, str):
        numbers = [
            p["containerPort"]
            for c in pod.containers
            for p in c.get("ports", [])
            if p.get("name") == want and p.get("protocol", "TCP") == protocol
        ]
        return port in numbers
    end = entry.get("endPort", want)
    return bool(want <= port <= end)


def _peer_matches(entry: dict[str, Any], policy_ns: str, peer: Peer) -> bool:
    if "ipBlock" in entry:
        # Only clients outside the cluster are modelled by address; pod traffic to a pod is
        # matched by selectors (ipBlock is meant for cluster-external addresses).
        return peer.namespace is None
    if peer.namespace is None:
        return False  # selectors match pods only
    ns_selector = entry.get("namespaceSelector")
    pod_selector = entry.get("podSelector")
    if ns_selector is None:
        return peer.namespace == policy_ns and selects(pod_selector, peer.labels)
    return selects(ns_selector, peer.ns_labels()) and selects(pod_selector, peer.labels)


def _selects_for_ingress(policy: dict[str, Any], pod: Pod) -> bool:
    spec = policy["spec"]
    namespace = policy["metadata"].get("namespace", pod.namespace)
    types = spec.get("policyTypes") or ["Ingress"]
    return (
        namespace == pod.namespace
        and "Ingress" in types
        and selects(spec.get("podSelector") or {}, pod.labels)
    )


def reachable(
    objects: list[dict[str, Any]], pod: Pod, peer: Peer, port: int, protocol: str = "TCP"
) -> bool:
    """Whether peer may open a connection to pod's port under the NetworkPolicies in objects."""
    policies = [o for o in objects if o["kind"] == "NetworkPolicy" and _selects_for_ingress(o, pod)]
    if not policies:
        return True
    for policy in policies:
        policy_ns = policy["metadata"].get("namespace", pod.namespace)
        for rule in policy["spec"].get("ingress") or []:
            ports = rule.get("ports")
            peers = rule.get("from")
            port_ok = ports is None or any(_port_matches(e, pod, port, protocol) for e in ports)
            peer_ok = peers is None or any(_peer_matches(e, policy_ns, peer) for e in peers)
            if port_ok and peer_ok:
                return True
    return False
