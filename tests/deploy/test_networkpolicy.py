"""No outage from monitoring, and no opening either: nothing restricts traffic unless a
NetworkPolicy is asked for, and the opt-in policies, in every documented combination, leave
every peer able to reach exactly the ports of the vLLM pod it could reach before, except
the sidecar's, which only Prometheus reaches. Decided from the rendered policies by
tests/deploy/netpol.py."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import KUBERNETES, kustomize, pod_spec
from tests.deploy.netpol import Peer, Pod, reachable
from tests.deploy.recipes import (
    OPEN_POLICY,
    Combination,
    combinations,
    render_combination,
)

SIDECAR_PORT = 9847
NAMESPACE = "llm"
OTHER_PORTS = ((6379, "TCP"), (29500, "TCP"), (53, "UDP"))  # multi-node, a debugger, DNS-ish


@functools.cache
def _rendered(combo: Combination, tmp: str) -> tuple[dict[str, Any], ...]:
    return tuple(render_combination(Path(tmp), combo))


def rendered(tmp_path_factory: pytest.TempPathFactory, combo: Combination) -> list[dict[str, Any]]:
    return list(_rendered(combo, str(tmp_path_factory.getbasetemp())))


def vllm_pod(objects: list[dict[str, Any]]) -> Pod:
    (workload,) = [o for o in objects if o["kind"] == "Deployment"]
    template = workload["spec"]["template"]
    return Pod(NAMESPACE, template["metadata"]["labels"], pod_spec(workload)["containers"])


def prometheus_peer(combo: Combination) -> Peer:
    params = {
        "prometheusNamespace": "monitoring",
        "prometheusPodLabel": "app.kubernetes.io/name",
        "prometheusPodLabelValue": "prometheus",
        **dict(combo.parameters),
    }
    return Peer(
        "prometheus",
        params["prometheusNamespace"],
        {params["prometheusPodLabel"]: params["prometheusPodLabelValue"]},
    )


def peers(combo: Combination) -> list[Peer]:
    return [
        prometheus_peer(combo),
        Peer("a client in vLLM's namespace", NAMESPACE, {"app": "chat"}),
        Peer("a client in another namespace", "apps", {"app": "gateway"}),
        Peer("an ingress controller", "ingress-nginx", {"app.kubernetes.io/name": "ingress"}),
        Peer("the API gateway", "gateway", {"app": "gateway"}),
        Peer("a client outside the cluster"),
    ]


def ports(combo: Combination) -> list[tuple[int, str]]:
    return [(combo.vllm_port, "TCP"), (SIDECAR_PORT, "TCP"), *OTHER_PORTS]


COMBINATIONS = list(combinations())
WITH_POLICY = [c for c in COMBINATIONS if c.policy]
WITHOUT_POLICY = [c for c in COMBINATIONS if not c.policy]


def ours(obj: dict[str, Any]) -> bool:
    labels = obj["metadata"].get("labels") or {}
    return bool(labels.get("app.kubernetes.io/part-of") == "vllm-kv-headroom")


def without_ours(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The objects as they were before our policy: the user's own policies stay."""
    return [o for o in objects if not (o["kind"] == "NetworkPolicy" and ours(o))]


@pytest.mark.parametrize("combo", WITHOUT_POLICY, ids=lambda c: c.id)
def test_no_network_policy_is_rendered_unless_asked_for(
    tmp_path_factory: pytest.TempPathFactory, combo: Combination
) -> None:
    assert not [
        o for o in rendered(tmp_path_factory, combo) if o["kind"] == "NetworkPolicy" and ours(o)
    ]


@pytest.mark.parametrize("path", ["example", "podmonitor", "servicemonitor"])
def test_shipped_kustomizations_render_no_network_policy(path: str) -> None:
    assert "NetworkPolicy" not in {o["kind"] for o in kustomize(KUBERNETES / path)}


@pytest.mark.parametrize("combo", WITH_POLICY, ids=lambda c: c.id)
def test_vllm_port_stays_reachable_from_everywhere_it_was(
    tmp_path_factory: pytest.TempPathFactory, combo: Combination
) -> None:
    after = rendered(tmp_path_factory, combo)
    before = without_ours(after)
    pod = vllm_pod(after)
    lost = [
        peer.name
        for peer in peers(combo)
        if reachable(before, pod, peer, combo.vllm_port)
        and not reachable(after, pod, peer, combo.vllm_port)
    ]
    assert not lost, f"vLLM's port {combo.vllm_port} no longer reachable from {lost}"


@pytest.mark.parametrize("combo", WITH_POLICY, ids=lambda c: c.id)
def test_policy_changes_nothing_but_the_sidecar_port(
    tmp_path_factory: pytest.TempPathFactory, combo: Combination
) -> None:
    after = rendered(tmp_path_factory, combo)
    before = without_ours(after)
    pod = vllm_pod(after)
    changed = [
        (peer.name, port, protocol)
        for peer in peers(combo)
        for port, protocol in ports(combo)
        if port != SIDECAR_PORT
        and reachable(before, pod, peer, port, protocol)
        != reachable(after, pod, peer, port, protocol)
    ]
    assert not changed


@pytest.mark.parametrize("combo", WITH_POLICY, ids=lambda c: c.id)
def test_policy_admits_only_prometheus_to_the_sidecar_port(
    tmp_path_factory: pytest.TempPathFactory, combo: Combination
) -> None:
    """Besides Prometheus, only peers the user's own policies already admitted to it."""
    objects = rendered(tmp_path_factory, combo)
    pod = vllm_pod(objects)
    before = without_ours(objects) if combo.user_policy else []
    admitted = [
        p.name
        for p in peers(combo)
        if reachable(objects, pod, p, SIDECAR_PORT)
        and not (before and reachable(before, pod, p, SIDECAR_PORT))
    ]
    assert admitted == ["prometheus"]


OLD_POLICY = """\
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: vllm-kv-headroom-allow-prometheus}
spec:
  podSelector: {matchLabels: {vllm-kv-headroom/sidecar: "true"}}
  policyTypes: [Ingress]
  ingress:
    - from:
        - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}
          podSelector: {matchLabels: {app.kubernetes.io/name: prometheus}}
      ports: [{port: kv-headroom, protocol: TCP}]
"""


def test_the_proof_catches_a_policy_that_cuts_vllm_off(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The policy the podmonitor used to include (issue 16): Prometheus only, port 9847."""
    (combo,) = [
        c
        for c in WITH_POLICY
        if c.monitor == "podmonitor" and not c.parameters and not c.user_policy
    ]
    objects = without_ours(rendered(tmp_path_factory, combo))
    objects.append(yaml.safe_load(OLD_POLICY))
    pod = vllm_pod(objects)
    client = Peer("client", NAMESPACE, {"app": "chat"})
    assert reachable(objects, pod, prometheus_peer(combo), SIDECAR_PORT)
    assert not reachable(objects, pod, client, combo.vllm_port)


def test_open_policy_would_undo_a_users_restriction(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Why the sidecar-only policy exists: on pods the user's policy already restricts, the
    open one lets in what that policy keeps out."""
    combo = Combination("podmonitor", OPEN_POLICY, (), user_policy=True)
    after = render_combination(tmp_path_factory.mktemp("open-on-restricted"), combo)
    pod = vllm_pod(after)
    client = Peer("client", "apps", {"app": "chat"})
    assert not reachable(without_ours(after), pod, client, combo.vllm_port)
    assert reachable(after, pod, client, combo.vllm_port)
