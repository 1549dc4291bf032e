"""Shared helpers for the deploy/ tests: rendering kustomizations and finding the sidecar."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import require

ROOT = Path(__file__).resolve().parent.parent.parent
DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
SIDECAR = "kv-headroom"  # the container's name in the component
# Components (kind: Component) need kustomize v3.7+, which kubectl embeds from 1.21.
MIN_KUBECTL = (1, 21)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "slow: builds wheels, or the image, and runs them (one to four minutes)"
    )


@functools.cache
def kubectl_problem() -> str | None:
    """Why kustomizations cannot be rendered here, or None when they can."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return "kubectl is not installed (it renders the kustomizations)"
    out = subprocess.run(
        [kubectl, "version", "--client"], capture_output=True, text=True, timeout=30, check=False
    ).stdout
    m = re.search(r"Client Version: v(\d+)\.(\d+)", out)
    if m is None or (int(m[1]), int(m[2])) < MIN_KUBECTL:
        return f"kubectl {out.strip() or '?'} predates kustomize components (needs 1.21+)"
    return None


def kustomize(path: Path) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize path` renders; fails when kubectl cannot."""
    require(kubectl_problem())
    proc = subprocess.run(
        ["kubectl", "kustomize", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, f"kubectl kustomize {path}:\n{proc.stderr}"
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc is not None]


def kustomization_dirs() -> list[Path]:
    """Every folder under deploy/kubernetes with a kustomization, sorted."""
    return sorted(p.parent for p in KUBERNETES.rglob("kustomization.yaml"))


def is_component(path: Path) -> bool:
    data = yaml.safe_load((path / "kustomization.yaml").read_text())
    return bool(data.get("kind") == "Component")


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def sidecar_of(workload: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = pod_spec(workload)["containers"]
    (container,) = [c for c in containers if c["name"] == SIDECAR]
    return container


# Directories that are inputs to other kustomizations, not something to apply: the default
# Parameters object renders to nothing (kustomize drops local-config objects), and
# apply-parameters renders the transformer that fills them in.
PARAMETER_DIRS = ("parameters", "apply-parameters")


def applicable_dirs() -> list[Path]:
    """Kustomizations a user applies: neither components nor the parameter plumbing."""
    return [
        p
        for p in kustomization_dirs()
        if not is_component(p) and p.relative_to(KUBERNETES).as_posix() not in PARAMETER_DIRS
    ]


def overlay(tmp_path: Path, kustomization: dict[str, Any], files: dict[str, str]) -> Path:
    """A user's kustomization in tmp_path: `<path>` in its entries stands for the repository
    root (kustomize refuses absolute paths; a relative one works from anywhere)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    root = os.path.relpath(ROOT, tmp_path)
    text = yaml.safe_dump(kustomization, sort_keys=False).replace("<path>", root)
    (tmp_path / "kustomization.yaml").write_text(text)
    for name, content in files.items():
        (tmp_path / name).write_text(content)
    return tmp_path


def vllm_deployment(name: str = "my-vllm", port: int = 8000) -> str:
    """An existing vLLM Deployment as a user has it, annotated for the sidecar component; its
    container port unnamed, as in vLLM's own Kubernetes example."""
    container_port: dict[str, Any] = {"containerPort": port, "protocol": "TCP"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "annotations": {"vllm-kv-headroom/inject": "true"}},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [
                        {
                            "name": "vllm",
                            "image": "vllm/vllm-openai:v0.32.0",
                            "args": ["--model=/models/Qwen2.5-7B-Instruct", f"--port={port}",
                                     "--served-model-name=qwen2.5-7b-instruct"],
                            "ports": [container_port],
                            "volumeMounts": [{"name": "models", "mountPath": "/models"}],
                        }
                    ],
                    "volumes": [{"name": "models", "emptyDir": {}}],
                },
            },
        },
    }  # fmt: skip
    return yaml.safe_dump(deployment, sort_keys=False)


@contextlib.contextmanager
def simulated_vllm(max_seconds: int) -> Iterator[str]:
    """``tests/deploy/simulated_vllm.py`` in its own process for at most ``max_seconds``;
    yields its URL (the helper prints its port first, or exits)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.deploy.simulated_vllm", "--max-seconds", str(max_seconds)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("port "), f"simulator did not start: {line!r}"
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
