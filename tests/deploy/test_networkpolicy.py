"""No outage from monitoring: nothing restricts traffic unless the NetworkPolicy is asked for,
and the opt-in policy, in every documented combination, leaves every peer able to reach
every port of the vLLM pod it could reach before, except the sidecar's, which it keeps for
Prometheus. Decided from the rendered policies by tests/deploy/netpol.py."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import KUBERNETES, kustomize, pod_spec
from tests.deploy.netpol import Peer, Pod, reachable
from tests.deploy.recipes import Combination, combinations, render_combination

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
        Peer("a client outside the cluster"),
    ]


def ports(combo: Combination) -> list[tuple[int, str]]:
    return [(combo.vllm_port, "TCP"), (SIDECAR_PORT, "TCP"), *OTHER_PORTS]


COMBINATIONS = list(combinations())
WITH_POLICY = [c for c in COMBINATIONS if c.networkpolicy]
WITHOUT_POLICY = [c for c in COMBINATIONS if not c.networkpolicy]


@pytest.mark.parametrize("combo", WITHOUT_POLICY, ids=lambda c: c.id)
def test_no_network_policy_is_rendered_unless_asked_for(
    tmp_path_factory: pytest.TempPathFactory, combo: Combination
) -> None:
    kinds = {o["kind"] for o in rendered(tmp_path_factory, combo)}
    assert "NetworkPolicy" not in kinds


@pytest.mark.parametrize("path", ["example", "podmonitor", "servicemonitor"])
def test_shipped_kustomizations_render_no_network_policy(path: str) -> None:
    assert "NetworkPolicy" not in {o["kind"] for o in kustomize(KUBERNETES / path)}


@pytest.mark.parametrize("combo", WITH_POLICY, ids=lambda c: c.id)
def test_vllm_port_stays_reachable_from_everywhere_it_was(
    tmp_path_factory: pytest.TempPathFactory, combo: Combination
) -> None:
    after = rendered(tmp_path_factory, combo)
    before = [o for o in after if o["kind"] != "NetworkPolicy"]
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
    before = [o for o in after if o["kind"] != "NetworkPolicy"]
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
    objects = rendered(tmp_path_factory, combo)
    pod = vllm_pod(objects)
    admitted = [p.name for p in peers(combo) if reachable(objects, pod, p, SIDECAR_PORT)]
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
    (combo,) = [c for c in WITH_POLICY if c.monitor == "podmonitor" and not c.parameters]
    objects = [o for o in rendered(tmp_path_factory, combo) if o["kind"] != "NetworkPolicy"]
    objects.append(yaml.safe_load(OLD_POLICY))
    pod = vllm_pod(objects)
    client = Peer("client", NAMESPACE, {"app": "chat"})
    assert reachable(objects, pod, prometheus_peer(combo), SIDECAR_PORT)
    assert not reachable(objects, pod, client, combo.vllm_port)
