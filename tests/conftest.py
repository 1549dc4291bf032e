from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

import pytest
import structlog

from tests.processes import withhold_harness_env

FIXTURES = Path(__file__).parent / "fixtures"


def _interrupted(signum: int, frame: FrameType | None) -> NoReturn:
    raise KeyboardInterrupt


def pytest_configure(config: pytest.Config) -> None:
    """A SIGTERM (a CI timeout, a ``kill``) ends the run as Ctrl-C does, so the fixtures'
    teardown still runs. The vLLM servers, sidecars and Prometheus the suite starts live
    in their own process groups, so a run killed outright leaves them running: five vLLM
    servers outlived one killed run here and ate a later run's CPU for half an hour.

    And before any test starts a sidecar with the environment it inherits, the harness's
    own variables leave that environment (tests/processes.py)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupted)
    withhold_harness_env()


def require(problem: str | None) -> None:
    """Fail, never skip, where what a test checks cannot run here (a tool missing, a
    runtime that cannot start): a skipped check reads as a passed one in a green run.
    ``.ci/run`` installs what the suite needs; ``tests/test_no_skips.py`` keeps it so."""
    if problem is not None:
        missing(problem)


def missing(problem: str) -> NoReturn:
    """``require``'s failure, for a caller that narrows on it."""
    pytest.fail(f"cannot check this here: {problem}", pytrace=False)


def fixture_config(name: str) -> dict[str, Any]:
    """A verbatim config.json from tests/fixtures/models/<org>__<name>/."""
    data: dict[str, Any] = json.loads((FIXTURES / "models" / name / "config.json").read_text())
    return data


@pytest.fixture(name="fixtures")
def _fixtures() -> Path:
    return FIXTURES


@pytest.fixture(autouse=True)
def _no_hugging_face_hub(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Nothing in the suite reaches huggingface.co: a model id the catalogue lacks resolves
    offline against an empty cache, unless a test points HF_ENDPOINT at the stand-in Hub
    (tests/hub_standin.py). Subprocesses inherit the same environment."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path_factory.mktemp("hf-home")))
    for name in ("HF_HUB_CACHE", "HF_ASSETS_CACHE", "HF_ENDPOINT", "HF_TOKEN"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def _logging_as_it_was() -> Iterator[None]:
    """Each test leaves structlog as it found it: a benchmark's ``main`` run in-process
    quiets the logs to errors, and every later test that reads a log event saw none."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)
