"""The built-in catalogue: verbatim configs, and every model plans with no extra flags."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from exporter.capacity.catalogue import close_models, describe
from exporter.cli import main
from exporter.sources.model_dir import load_catalogue, load_restored
from tests.conftest import FIXTURES

MODELS = FIXTURES / "models"
CATALOGUE = load_catalogue()
NAMES = [m.name for m in CATALOGUE]


def _builder() -> object:
    spec = importlib.util.spec_from_file_location("build_catalogue", MODELS / "build_catalogue.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_catalogue_is_built_from_the_verbatim_configs() -> None:
    built = _builder().build()  # type: ignore[attr-defined]
    shipped = json.loads(
        (MODELS.parents[2] / "exporter" / "capacity" / "data" / "models.json").read_text()
    )
    assert shipped == built


def test_every_entry_names_a_public_source() -> None:
    assert all(m.source.startswith("https://github.com/") for m in CATALOGUE)


def test_catalogue_covers_the_families_people_serve() -> None:
    prefixes = (
        "meta-llama/Llama-3",
        "meta-llama/Llama-4",
        "Qwen/Qwen2.5",
        "Qwen/Qwen3-",
        "Qwen/Qwen3.5",
        "deepseek-ai/DeepSeek-V3",
        "deepseek-ai/DeepSeek-R1",
        "openai/gpt-oss",
        "google/gemma-2",
        "google/gemma-3",
        "mistralai/Mistral",
        "mistralai/Mixtral",
        "microsoft/Phi-3",
        "microsoft/phi-4",
        "ibm-granite/granite-3",
        "zai-org/GLM",
        "moonshotai/Kimi-K2",
    )
    missing = [p for p in prefixes if not any(n.startswith(p) for n in NAMES)]
    assert not missing
    assert len(NAMES) >= 60


@pytest.mark.parametrize("gpu", ["H100-80GB", "L4"])
def test_every_catalogue_model_plans_with_no_extra_flags(
    gpu: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # 0: it fits; 1: vLLM would refuse (too big for the card). 2 would mean we cannot plan it.
    codes = {name: main(["plan", "--model", name, "--gpu", gpu, "--no-what-if"]) for name in NAMES}
    capsys.readouterr()
    assert {name: c for name, c in codes.items() if c not in (0, 1)} == {}


def test_a_catalogue_model_plans_from_the_console() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "plan", "--model", "Qwen/Qwen3-8B", "--gpu", "L40S"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "estimate (config parameters" in proc.stdout


def test_published_checkpoint_size_is_used_for_the_weights(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["plan", "--model", "google/gemma-2-9b-it", "--output", "json", "--no-what-if"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    # The index's total_size, plus the rotary cos/sin table vLLM loads beside the weights
    # (8,192 positions × 256 dims × 2 B; weights.rotary_cache_bytes).
    assert doc["memory"]["weights_bytes"] == 18_483_411_968 + 8192 * 256 * 2
    assert doc["sources"]["weights"].startswith("published checkpoint")


def test_list_models_says_what_each_entry_holds(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--list-models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == NAMES + [m.name for m in load_restored()]
    gemma = next(line for line in lines if line.startswith("google/gemma-2-9b-it "))
    assert "hybrid_sliding" in gemma
    assert "checkpoint 17.2 GiB (published)" in gemma


def test_describe_marks_quantized_moe_entries() -> None:
    entry = next(m for m in CATALOGUE if m.name == "Qwen/Qwen3-30B-A3B-FP8")
    assert "MoE 8/128" in describe(entry)
    assert "fp8 weights" in describe(entry)


def test_a_modelopt_entry_carries_its_hf_quant_config(capsys: pytest.CaptureFixture[str]) -> None:
    entry = next(m for m in CATALOGUE if m.name == "nvidia/Llama-3.1-70B-Instruct-FP8")
    assert "quantization_config" not in entry.config  # config.json stays verbatim
    assert "modelopt weights" in describe(entry)
    assert main(["plan", "--model", entry.name, "--output", "json", "--no-what-if"]) in (0, 1)
    doc = json.loads(capsys.readouterr().out)
    assert doc["kv_bytes_per_token"] == 80 * 8 * 128 * 2  # one byte per element: FP8 KV


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("google/gemma-2-27b", "google/gemma-2-27b-it"),
        ("qwen3-8", "Qwen/Qwen3-8B"),
        ("Qwen/Qwen2.5-72B-Instruct-AWQ", "Qwen/Qwen2.5-72B-Instruct"),
    ],
)
def test_a_name_not_in_the_catalogue_finds_the_closest_first(typed: str, meant: str) -> None:
    assert close_models(CATALOGUE, typed)[0] == meant


def test_a_name_like_none_in_the_catalogue_finds_nothing() -> None:
    assert close_models(CATALOGUE, "zzzz") == []


def test_list_models_says_which_entry_a_restored_name_plans_with(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["plan", "--list-models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(
        line.split() == ["google/gemma-2-27b", "=", "google/gemma-2-27b-it"] for line in lines
    )
