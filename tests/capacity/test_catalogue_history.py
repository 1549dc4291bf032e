"""The catalogue keeps every name it ever listed (tests/fixtures/models/ever_listed.json)."""

from __future__ import annotations

import json

import pytest

from exporter.cli import main
from tests.conftest import FIXTURES

HISTORY = json.loads((FIXTURES / "models" / "ever_listed.json").read_text())
RESTORABLE = sorted(set(HISTORY["listed"]) - set(HISTORY["no_public_config"]))


@pytest.mark.parametrize("name", RESTORABLE)
def test_every_name_the_catalogue_listed_still_plans(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Offline (the suite's default): the catalogue alone must answer. Exit 1 is a plan too:
    # vLLM would refuse this deployment, and the plan says why.
    code = main(["plan", "--model", name, "--no-what-if", "--output", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code in (0, 1)
    assert doc["model"] == name


def test_a_restored_base_name_says_which_config_it_plans_with(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["plan", "--model", "google/gemma-2-27b", "--no-what-if"])
    captured = capsys.readouterr()
    assert code == 0
    assert captured.out.startswith("google/gemma-2-27b on H100-80GB")
    assert captured.err == (
        "kv-headroom plan: google/gemma-2-27b plans with google/gemma-2-27b-it's config.json: "
        "base and instruct share this config's geometry\n"
    )


@pytest.mark.parametrize("name", sorted(HISTORY["no_public_config"]))
def test_a_name_without_a_public_config_points_to_the_hub_and_a_path(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["plan", "--model", name])
    err = capsys.readouterr().err
    assert code == 2
    assert "nor in the Hugging Face cache (HF_HUB_OFFLINE=1)" in err
    assert "--model PATH" in err
