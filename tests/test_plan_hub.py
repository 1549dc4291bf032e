"""``kv-headroom plan --model ORG/NAME`` against a stand-in Hugging Face Hub on 127.0.0.1."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.capacity.arch import parse_config
from exporter.cli import main
from exporter.hub import load_from_hub, weights_from_parameters
from tests.hub_standin import TOKEN, StandinHub, standin_hub


@pytest.fixture(name="hub")
def _hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[StandinHub]:
    import huggingface_hub.constants

    with standin_hub() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
        monkeypatch.delenv("HF_HUB_OFFLINE")
        # The library reads HF_HUB_OFFLINE once, at import; the suite imported it offline.
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
        yield hub


def plan_json(capsys: pytest.CaptureFixture[str], model: str) -> tuple[int, dict[str, object]]:
    code = main(["plan", "--model", model, "--gpu", "H100", "--output", "json", "--no-what-if"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out else {}


def test_a_model_absent_from_the_catalogue_plans_by_its_hub_id(
    hub: StandinHub, capsys: pytest.CaptureFixture[str]
) -> None:
    code, doc = plan_json(capsys, "deepseek-ai/DeepSeek-V2-Lite-Chat")
    assert code == 0
    assert doc["model"] == "deepseek-ai/DeepSeek-V2-Lite-Chat"
    assert doc["kv_bytes_per_token"] == 27 * (512 + 64) * 2  # MLA, read from its config.json


def test_a_gated_model_is_refused_without_a_token(
    hub: StandinHub, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["plan", "--model", "meta-llama/Llama-3.1-8B"])
    err = capsys.readouterr().err
    assert code == 2
    assert "is gated on the Hugging Face Hub" in err
    assert "set HF_TOKEN" in err
    assert len(err.strip().splitlines()) == 1


def test_a_gated_model_plans_with_hf_token(
    hub: StandinHub, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    code, doc = plan_json(capsys, "meta-llama/Llama-3.1-8B")
    assert code == 0
    assert doc["kv_bytes_per_token"] == 32 * 8 * 128 * 2 * 2


def test_exact_weights_come_from_the_safetensors_metadata(
    hub: StandinHub, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    code = main(["plan", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "H100", "--no-what-if"])
    out = capsys.readouterr().out
    weights = next(line for line in out.splitlines() if "− weights" in line)
    assert code == 0
    # 8,030,261,248 BF16 parameters × 2 B, plus the 32 MiB rotary table vLLM loads with them
    assert "14.99 GiB" in weights
    assert "exact (safetensors metadata on the Hub: 8,030,261,248 BF16 parameters)" in weights
    assert "+ 32 MiB rotary table" in weights


def test_no_weight_file_is_requested(
    hub: StandinHub, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    plan_json(capsys, "meta-llama/Llama-3.1-8B")
    files = {path.rsplit("/", 1)[-1] for method, path, _ in hub.requests if "/resolve/" in path}
    assert files <= {"config.json", "hf_quant_config.json"}


def test_a_quantized_repack_reads_its_quantization_from_the_hub(hub: StandinHub) -> None:
    model = load_from_hub("nvidia/Llama-3.1-70B-Instruct-FP8")
    arch = parse_config(model.config, model.config_path, name=model.repo_id)
    assert model.config["quantization_config"]["quantization"]["quant_algo"] == "FP8"
    assert arch.quantization is not None
    assert arch.quantization.method == "modelopt"


def test_a_model_planned_once_plans_offline_from_the_cache(
    hub: StandinHub, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    _, online = plan_json(capsys, "meta-llama/Llama-3.1-8B")
    asked = len(hub.requests)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_TOKEN")
    code, offline = plan_json(capsys, "meta-llama/Llama-3.1-8B")
    assert code == 0
    assert len(hub.requests) == asked  # nothing asked of the Hub
    assert offline["num_blocks"] == online["num_blocks"]
    assert offline["sources"] == online["sources"]  # the exact weights too, from the cache


def test_offline_a_model_never_fetched_says_so_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["plan", "--model", "meta-llama/Llama-3.1-8B"])
    err = capsys.readouterr().err
    assert code == 2
    assert "nor in the Hugging Face cache (HF_HUB_OFFLINE=1)" in err
    assert "--model PATH" in err
    assert len(err.strip().splitlines()) == 1


def test_a_name_the_hub_does_not_know_suggests_a_path(
    hub: StandinHub, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["plan", "--model", "no-such-org/Qwen3-8B-typo"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"nor a model on the Hub ({hub.url})" in err
    assert "did you mean Qwen/Qwen3-8B" in err
    assert "--model PATH (its dir or config.json)" in err
    assert len(err.strip().splitlines()) == 1


def test_an_fp32_checkpoint_leaves_the_weights_to_the_estimate() -> None:
    # vLLM casts fp32 weights to 16 bits on load: the file size is not what the GPU holds.
    assert weights_from_parameters({"F32": 1_000_000})[0] is None


def test_fp8_weights_with_their_scales_count_each_dtype_at_its_width() -> None:
    assert weights_from_parameters({"F8_E4M3": 1_000, "BF16": 10, "F32": 4})[0] == 1_036


def test_without_huggingface_hub_a_hub_id_names_the_extra_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The sidecar image leaves the library out (tests/deploy/test_image.py); None in
    # sys.modules makes its import fail as it does there.
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    code = main(["plan", "--model", "meta-llama/Llama-3.1-8B"])
    err = capsys.readouterr().err
    assert code == 2
    assert "pip install 'vllm-kv-headroom[hub]'" in err
    assert "--model PATH" in err
    assert len(err.strip().splitlines()) == 1
