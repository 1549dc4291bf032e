"""The kustomizations deploy/README.md tells a user to write, as the tests render them."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.conftest import DEPLOY, kustomize, overlay, vllm_deployment

RECIPE_MARK = "<!-- recipe: existing-deployment"
PARAMETERS_KIND = "Parameters"


def readme_recipe() -> dict[str, Any]:
    """The kustomization of deploy/README.md's "For your own vLLM Deployment", verbatim."""
    text = (DEPLOY / "README.md").read_text()
    at = text.index(RECIPE_MARK)
    block = re.search(r"```yaml\n(.*?)```", text[at:], re.S)
    assert block is not None, "deploy/README.md: no yaml block after the recipe mark"
    recipe: dict[str, Any] = yaml.safe_load(block.group(1))
    return recipe


def set_parameters(kustomization: dict[str, Any], **values: Any) -> dict[str, Any]:
    """The kustomization with its Parameters patch changed (added when it has none)."""
    patches = kustomization.setdefault("patches", [])
    for entry in patches:
        patch = yaml.safe_load(entry["patch"])
        if patch.get("kind") == PARAMETERS_KIND:
            patch["spec"].update(values)
            entry["patch"] = yaml.safe_dump(patch)
            break
    else:
        patch = {
            "apiVersion": "vllm-kv-headroom/v1",
            "kind": PARAMETERS_KIND,
            "metadata": {"name": "vllm-kv-headroom"},
            "spec": values,
        }
        patches.append({"patch": yaml.safe_dump(patch)})
    transformers = kustomization.setdefault("transformers", [])
    if "<path>/deploy/kubernetes/apply-parameters" not in transformers:
        transformers.append("<path>/deploy/kubernetes/apply-parameters")
    return kustomization


OPEN_POLICY = "networkpolicy"  # for pods no policy selected before
SIDECAR_ONLY_POLICY = "networkpolicy-sidecar-only"  # for pods your policies already select

# A restriction a user may already have: vLLM's port only from the API gateway's namespace.
USER_POLICY = """\
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: my-vllm-from-gateway-only}
spec:
  podSelector: {matchLabels: {app: my-vllm}}
  policyTypes: [Ingress]
  ingress:
    - from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: gateway}}}]
"""


@dataclass(frozen=True)
class Combination:
    """One documented way to deploy: monitor kind, which NetworkPolicy (if any), whether the
    user's own policy already selects the vLLM pods, and the Parameters."""

    monitor: str  # podmonitor | servicemonitor
    policy: str | None  # None, OPEN_POLICY or SIDECAR_ONLY_POLICY
    parameters: tuple[tuple[str, Any], ...]  # () = the defaults
    user_policy: bool = False

    @property
    def id(self) -> str:
        params = "custom" if self.parameters else "defaults"
        user = "-user-policy" if self.user_policy else ""
        return f"{self.monitor}-{self.policy or 'no-policy'}{user}-{params}"

    @property
    def vllm_port(self) -> int:
        port: int = dict(self.parameters).get("vllmPort", 8000)
        return port


CUSTOM = (
    ("vllmPort", 8080),
    ("prometheusNamespace", "observability"),
    ("prometheusPodLabel", "app"),
    ("prometheusPodLabelValue", "prom"),
    ("release", "prom-stack"),
    ("runbookBaseUrl", "https://wiki.example.com/kv-headroom-runbook"),
    ("sidecarSelector", 'namespace="llm",job=~"llm/.*kv-headroom.*"'),
    ("capacityCeilings", 'label_replace(vector(8), "model", "org/model-a", "", "")'),
)


def combinations() -> Iterator[Combination]:
    """Every combination deploy/README.md documents: no policy (with or without one of the
    user's own), the open policy where none was, the sidecar-only one where one was."""
    for monitor, params in itertools.product(("podmonitor", "servicemonitor"), ((), CUSTOM)):
        yield Combination(monitor, None, params)
        yield Combination(monitor, None, params, user_policy=True)
        yield Combination(monitor, OPEN_POLICY, params)
        yield Combination(monitor, SIDECAR_ONLY_POLICY, params, user_policy=True)


def render_combination(tmp_path: Path, combo: Combination) -> list[dict[str, Any]]:
    """The README's recipe with that monitor, policy and Parameters, around a Deployment
    whose vLLM listens on the Parameters' port."""
    recipe = readme_recipe()
    recipe["resources"] = [
        r.replace("/podmonitor", f"/{combo.monitor}") if "deploy/kubernetes" in r else r
        for r in recipe["resources"]
    ]
    files = {"my-vllm.yaml": vllm_deployment(port=combo.vllm_port)}
    if combo.policy:
        recipe["resources"].append(f"<path>/deploy/kubernetes/{combo.policy}")
    if combo.user_policy:
        recipe["resources"].append("user-policy.yaml")
        files["user-policy.yaml"] = USER_POLICY
    recipe["namespace"] = "llm"
    if combo.parameters:
        set_parameters(recipe, **dict(combo.parameters))
    return kustomize(overlay(tmp_path / combo.id, recipe, files))
