"""Figures worked out from the deployment alone are redone only when an input changes."""

from __future__ import annotations

from exporter.config import Config
from exporter.observe import Folder, fold
from exporter.poller import Poller, PollerDeps
from exporter.recent import Recent
from exporter.sources.records import ModelCard
from exporter.sources.vllm import CARD
from exporter.sources.vllm_page import parse_page
from tests.conftest import FIXTURES


def test_a_result_is_kept_for_the_same_or_an_equal_input_and_made_anew_for_another() -> None:
    made: list[str] = []
    recent: Recent[str] = Recent(size=2)

    def get(*key: object) -> str:
        def make() -> str:
            made.append(repr(key))
            return made[-1]

        return recent.get(key, make)

    first = get("a", (1, 2))
    assert get("a", (1, 2)) is first  # an equal tuple, built again
    get("b", (1, 2))
    assert len(made) == 2
    get("c", (1, 2))  # pushes the oldest out
    get("a", (1, 2))
    assert len(made) == 4


def test_the_deployment_is_the_same_object_until_what_it_comes_from_changes() -> None:
    page = parse_page((FIXTURES / "vllm" / "vllm-0.32-cpu-preempted.txt").read_text())
    poller = Poller(Config(nvml_enabled=False), None, PollerDeps())  # type: ignore[arg-type]
    folder = Folder()
    poller.readings.put(CARD, "vllm", ModelCard(names=("m",), max_model_len=2048, root=None))
    resolved = []
    for now in (0.0, 2.0):
        folded = fold(folder, now, page)
        poller.history.append(folded.observation)
        folder = folded.folder
        resolved.append(poller._resolve())
    assert resolved[1] is resolved[0]
    poller.readings.put(CARD, "vllm", ModelCard(names=("m",), max_model_len=4096, root=None))
    changed = poller._resolve()
    assert changed is not resolved[0]
    assert changed.max_model_len == 4096
