"""The image from deploy/Dockerfile, built and run as Kubernetes runs it.

No registry and no Docker daemon here: the base is a root filesystem built from Debian's
packages (mmdebstrap, python3 and its venv module), the wheels are built on the host, and
podman builds offline (`--network none`, WHEELS=offline). The container then runs as
deploy/README.md's recipe renders the sidecar: its arguments, environment and
securityContext (read-only root, no capabilities, no privilege escalation, the image's own
non-root user), next to the simulated vLLM, and must serve /healthz, /readyz and /metrics.

Flags every podman call needs on these machines (../shared/reference/containers-here.md):
runc, because crun refuses the kernel's hybrid cgroups, and explicit ulimits, because the
defaults ask for more than the machine lets a process raise.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require
from tests.deploy.conftest import (
    DEPLOY,
    kustomize,
    overlay,
    sidecar_of,
    simulated_vllm,
    vllm_deployment,
)
from tests.deploy.recipes import readme_recipe
from tests.processes import free_port, http_get
from tests.test_wheel import wheel_context

pytestmark = pytest.mark.slow

PODMAN = ["podman", "--runtime", "runc"]
LIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"]
# Built once per machine and kept: ~15 s, and it changes only with Debian's bookworm.
BASE = "localhost/vllm-kv-headroom-base:bookworm"
READY_WITHIN = 60.0
# What the venv adds to the base: the sidecar and its dependencies measured 27 MB; the
# official slim Python image is about 130 MB, so this holds the documented 170 MB total.
MAX_ADDED_BYTES = 40e6


def _podman(*args: str, timeout: float = 120, check: bool = True) -> str:
    proc = subprocess.run(
        [*PODMAN, *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check:
        assert proc.returncode == 0, f"podman {' '.join(args)}:\n{proc.stdout}{proc.stderr}"
    return proc.stdout


def _skip_reason() -> str | None:
    if shutil.which("podman") is None:
        return "podman is not installed (.ci/run installs podman, buildah, mmdebstrap, runc)"
    probe = subprocess.run(
        [*PODMAN, "info"], capture_output=True, text=True, timeout=60, check=False
    )
    if probe.returncode != 0:
        return f"podman cannot run here: {probe.stderr.strip()[-300:]}"
    exists = subprocess.run(
        [*PODMAN, "image", "exists", BASE], capture_output=True, timeout=60, check=False
    )
    if exists.returncode != 0 and shutil.which("mmdebstrap") is None:
        return f"no {BASE} and no mmdebstrap to build it from Debian packages"
    return None


def _ensure_base(workdir: Path) -> None:
    exists = subprocess.run(
        [*PODMAN, "image", "exists", BASE], capture_output=True, timeout=60, check=False
    )
    if exists.returncode == 0:
        return
    tar = workdir / "base.tar"
    proc = subprocess.run(
        ["mmdebstrap", "--quiet", "--variant=minbase", "--include=python3,python3-venv",
         "bookworm", str(tar)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    _podman("import", str(tar), BASE, timeout=300)
    tar.unlink()


def _context(workdir: Path) -> Path:
    """What the Dockerfile copies, plus wheelhouse/: the project's wheel and its
    dependencies, built by the host's pip (the build itself has no network)."""
    # The byte-identical wheel lets podman's layer cache serve an unchanged tree without
    # reinstalling.
    ctx, env = wheel_context(workdir)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "-w", str(ctx / "wheelhouse"), str(ctx)],
        capture_output=True, text=True, timeout=600, check=False, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    shutil.rmtree(ctx / "build", ignore_errors=True)
    for info in ctx.glob("*.egg-info"):
        shutil.rmtree(info)
    return ctx


def rendered_sidecar() -> dict[str, Any]:
    """The sidecar container as deploy/README.md's recipe for an existing Deployment renders
    it, environment resolved."""
    with tempfile.TemporaryDirectory() as tmp:
        files = {"my-vllm.yaml": vllm_deployment()}
        objects = kustomize(overlay(Path(tmp) / "recipe", readme_recipe(), files))
    (workload,) = [o for o in objects if o["kind"] == "Deployment"]
    container = sidecar_of(workload)
    configmaps = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(configmaps[source["configMapRef"]["name"]]["data"])
    container["resolved_env"] = env
    return container


@dataclass
class Built:
    tag: str
    image_id: str
    rebuilt_id: str
    build_seconds: float
    rebuild_seconds: float
    size: int
    base_size: int
    user: str
    rendered_image: str


@dataclass
class Ran:
    uid: int | None
    healthz: int
    readyz: int
    metrics: str
    logs: str


def _run_container(tag: str, sidecar: dict[str, Any], vllm_url: str) -> Ran:
    """The image, run with the rendered container's settings; the vLLM URL and listen port
    change only because the simulated vLLM and this test share the host's network."""
    port = free_port()
    ctx = sidecar["securityContext"]
    args = [
        a for a in sidecar["args"] if not a.startswith(("--vllm.url=", "--web.listen-address="))
    ]
    args += [f"--vllm.url={vllm_url}", f"--web.listen-address=127.0.0.1:{port}"]
    flags = ["--network", "host", "--security-opt", "no-new-privileges"]
    if ctx["readOnlyRootFilesystem"]:
        flags.append("--read-only")
    # Kubernetes mounts no writable /tmp either; podman would add a tmpfs there by default.
    flags.append("--read-only-tmpfs=false")
    if ctx["capabilities"]["drop"] == ["ALL"]:
        flags += ["--cap-drop", "ALL"]
    for key, value in sidecar["resolved_env"].items():
        flags += ["--env", f"{key}={value}"]
    # runAsUser is left to the image's USER: that is what runAsNonRoot checks.
    name = f"kv-headroom-test-{uuid.uuid4().hex[:8]}"
    _podman("run", "--detach", "--name", name, *LIMITS, *flags, tag, *args)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + READY_WITHIN
        readyz = 0
        while time.monotonic() < deadline:
            readyz, _ = http_get(url + "/readyz", timeout=2)
            if readyz == 200:
                break
            time.sleep(0.5)
        healthz, _ = http_get(url + "/healthz", timeout=2)
        _, metrics = http_get(url + "/metrics", timeout=5)
        uid = None
        pid = _podman("inspect", "--format", "{{.State.Pid}}", name).strip()
        with contextlib.suppress(OSError, StopIteration, ValueError):
            status = Path(f"/proc/{pid}/status").read_text().splitlines()
            uid = int(next(li for li in status if li.startswith("Uid:")).split()[1])
        logs = _podman("logs", name, check=False)
        return Ran(uid, healthz, readyz, metrics, logs)
    finally:
        _podman("rm", "--force", "--time", "5", name, check=False)


def _build(ctx: Path, tag: str) -> tuple[str, float]:
    """The image's id and the seconds the build took."""
    started = time.monotonic()
    _podman(
        "build", *LIMITS, "--network", "none", "--build-arg", f"BASE={BASE}",
        "--build-arg", "WHEELS=offline", "--tag", tag, "--file", str(DEPLOY / "Dockerfile"),
        str(ctx), timeout=900,
    )  # fmt: skip
    seconds = time.monotonic() - started
    return _podman("image", "inspect", "--format", "{{.Id}}", tag).strip(), seconds


@pytest.fixture(scope="module")
def image() -> Iterator[Built]:
    require(_skip_reason())
    workdir = Path(tempfile.mkdtemp(prefix="kv-headroom-image-"))
    sidecar = rendered_sidecar()
    # The repository the manifests reference, under localhost/ and a tag of this run (the
    # machine's image store is shared; other runs must not see half a build).
    repository = sidecar["image"].rsplit(":", 1)[0].rsplit("/", 1)[-1]
    tag = f"localhost/{repository}:test-{uuid.uuid4().hex[:8]}"
    try:
        _ensure_base(workdir)
        ctx = _context(workdir)
        image_id, build_s = _build(ctx, tag)
        rebuilt_id, rebuild_s = _build(ctx, tag)  # unchanged source: every layer cached
        size, user = _podman(
            "image", "inspect", "--format", "{{.Size}} {{.Config.User}}", tag
        ).split()
        base_size = int(_podman("image", "inspect", "--format", "{{.Size}}", BASE).strip())
        built = Built(
            tag,
            image_id,
            rebuilt_id,
            build_s,
            rebuild_s,
            int(size),
            base_size,
            user,
            sidecar["image"],
        )
        print(
            f"\nimage build {build_s:.0f} s, cached rebuild {rebuild_s:.1f} s; size "
            f"{built.size / 1e6:.0f} MB = base {base_size / 1e6:.0f} MB + "
            f"{(built.size - base_size) / 1e6:.1f} MB"
        )
        yield built
    finally:
        _podman("rmi", "--force", tag, check=False)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def ran(image: Built) -> Ran:
    with simulated_vllm(max_seconds=180) as vllm_url:
        return _run_container(image.tag, rendered_sidecar(), vllm_url)


def test_image_is_the_one_the_manifests_reference(image: Built) -> None:
    assert image.rendered_image.rsplit(":", 1)[0].endswith("/vllm-kv-headroom")
    assert image.tag.startswith("localhost/vllm-kv-headroom:")


def test_image_runs_as_a_numeric_non_root_user(image: Built, ran: Ran) -> None:
    user = image.user.partition(":")[0]
    assert user.isdigit()  # runAsNonRoot can verify only a numeric user
    assert int(user) != 0
    assert ran.uid == int(user)


def test_container_on_a_read_only_root_becomes_ready(ran: Ran) -> None:
    assert ran.readyz == 200, ran.logs[-3000:]
    assert ran.healthz == 200


def test_container_serves_metrics_from_the_simulated_vllm(ran: Ran) -> None:
    assert 'kv_headroom_source_up{source="vllm"} 1.0' in ran.metrics, ran.logs[-3000:]
    assert "kv_headroom_kv_capacity_tokens{" in ran.metrics


def test_container_logs_no_error(ran: Ran) -> None:
    assert "Traceback" not in ran.logs
    assert "Read-only file system" not in ran.logs
    assert '"level": "error"' not in ran.logs


def test_image_adds_little_to_its_base(image: Built) -> None:
    assert image.size - image.base_size <= MAX_ADDED_BYTES


def test_unchanged_source_rebuilds_from_the_cache(image: Built) -> None:
    """The same id: every layer came from podman's cache (a reinstall would differ)."""
    assert image.rebuilt_id == image.image_id
