"""``kv-headroom plan`` as a user runs it: the table, the JSON contract, the errors."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.cli import main
from tests.conftest import FIXTURES

LLAMA_DIR = FIXTURES / "models" / "meta-llama__Llama-3.1-8B-Instruct"


def run_plan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["plan", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_output_has_the_contract_keys(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_plan(
        capsys, "--model", "Llama-3.1-8B-Instruct", "--gpu", "H100-80GB", "--output", "json"
    )
    doc = json.loads(out)
    assert code == 0
    for key in (
        "kv_bytes_per_token",
        "kv_budget_bytes",
        "block_size",
        "num_blocks",
        "kv_capacity_tokens",
        "max_concurrency",
        "max_sequences",
    ):
        assert key in doc
    assert set(doc["memory"]) == {
        "gpu_total_bytes",
        "ceiling_bytes",
        "device_cap_bytes",
        "weights_bytes",
        "activation_bytes",
        "non_torch_bytes",
        "cuda_graph_bytes",
    }


def test_json_max_sequences_are_keyed_by_the_contexts_asked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, out, _ = run_plan(
        capsys,
        "--model",
        "Llama-3.1-8B-Instruct",
        "--context",
        "2000",
        "--context",
        "p50=1200,p95=4000",
        "--output",
        "json",
    )
    doc = json.loads(out)
    assert list(doc["max_sequences"]) == ["2000", "p50", "p95"]
    assert doc["contexts"]["p95"] == 4000
    assert doc["max_sequences"]["p50"] > doc["max_sequences"]["p95"]


def test_table_shows_the_chain_and_what_ifs(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_plan(capsys, "--model", "Llama-3.1-8B-Instruct", "--context", "p95=4000")
    assert code == 0
    for row in (
        "GPU memory (CUDA total)",
        "× gpu-memory-utilization",
        "− weights",
        "− activation peak",
        "= KV budget per GPU",
        "÷ KV bytes per token",
        "= blocks",
        "= KV cache size",
        "sequences that fit @ p95",
        "What if",
        "FP8 KV cache",
    ):
        assert row in out


def test_model_dir_with_a_safetensors_index_uses_its_total_size(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    shutil.copy(LLAMA_DIR / "config.json", tmp_path / "config.json")
    index = {"metadata": {"total_size": 20 * 2**30}, "weight_map": {}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    _, out, _ = run_plan(capsys, "--model", str(tmp_path), "--output", "json", "--no-what-if")
    doc = json.loads(out)
    # total_size, plus the rotary table vLLM loads beside it (131,072 positions × 128 × 2 B)
    assert doc["memory"]["weights_bytes"] == 20 * 2**30 + 131072 * 128 * 2
    assert "metadata.total_size" in doc["sources"]["weights"]


def test_model_dir_reads_a_modelopt_hf_quant_config_beside_config_json(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # ModelOpt 0.29 and before keep the quantization in hf_quant_config.json; vLLM reads it.
    nvidia = FIXTURES / "models" / "nvidia__Llama-3.1-70B-Instruct-FP8"
    shutil.copy(nvidia / "config.json", tmp_path / "config.json")
    args = ("--model", str(tmp_path), "--gpu", "H100-80GB", "--output", "json", "--no-what-if")
    _, out, _ = run_plan(capsys, *args)
    without = json.loads(out)
    shutil.copy(nvidia / "hf_quant_config.json", tmp_path / "hf_quant_config.json")
    _, out, _ = run_plan(capsys, *args)
    doc = json.loads(out)
    # FP8 weights (the 16-bit embedding and LM head stay) and an FP8 KV cache under auto.
    assert 0.5 < doc["memory"]["weights_bytes"] / without["memory"]["weights_bytes"] < 0.53
    assert doc["kv_bytes_per_token"] * 2 == without["kv_bytes_per_token"]


def test_hugging_face_cache_layout_resolves_the_current_snapshot(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    repo = tmp_path / "models--meta-llama--Llama-3.1-8B-Instruct"
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123\n")
    shutil.copy(LLAMA_DIR / "config.json", snap / "config.json")
    _, out, _ = run_plan(capsys, "--model", str(repo), "--output", "json", "--no-what-if")
    assert json.loads(out)["model"] == "meta-llama/Llama-3.1-8B-Instruct"


def test_vllm_refusing_to_start_exits_1_with_its_message(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run_plan(
        capsys,
        "--model",
        "Llama-3.1-8B-Instruct",
        "--gpu",
        "L4",
        "--max-model-len",
        "131072",
        "--no-what-if",
    )
    assert code == 1
    assert "vLLM would refuse to start" in out
    assert "estimated maximum model length is" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "no/such-model"], "--model = 'no/such-model': is neither a path"),
        (["--model", "Llama-3.1-8B-Instruct", "--gpu", "Z9000"], "--gpu = 'Z9000': unknown GPU"),
        (
            ["--model", "Llama-3.1-8B-Instruct", "--gpu-memory-utilization", "1.5"],
            "--gpu-memory-utilization = '1.5': must be a fraction in (0, 1]",
        ),
        (
            ["--model", "Llama-3.1-8B-Instruct", "--gpu-memory-utilization", "abc"],
            "--gpu-memory-utilization = 'abc': must be a fraction in (0, 1]",
        ),
        (
            ["--model", "Llama-3.1-8B-Instruct", "--max-model-len", "-5"],
            "--max-model-len = '-5': not a token count",
        ),
        (
            ["--model", "Llama-3.1-8B-Instruct", "--gpu", "-80GB"],
            "--gpu = '-80GB': a GPU's memory must be greater than 0",
        ),
        (
            ["--model", "Llama-3.1-8B-Instruct", "--max-num-seqs", "0"],
            "--max-num-seqs = '0': must be a whole number greater than 0",
        ),
        (
            ["--model", "Llama-3.1-8B-Instruct", "--block-size", "7"],
            "--block-size = '7': vLLM accepts only 1, 8, 16, 32, 64, 128",
        ),
        (
            ["--model", "Llama-3.1-8B-Instruct", "--vllm-version", "9.9.9"],
            "pass --vllm-version 0.34.0",
        ),
        (["--gpu", "L4"], "one of the arguments --model --list-models --list-gpus is required"),
        (["--modle", "X"], "unknown flag --modle; did you mean --model?"),
        (
            ["--model", "Llama-3.1-8B-Instruct", "--gppu", "L4"],
            "unknown flag --gppu; did you mean --gpu?",
        ),
        (["--model=Llama-3.1-8B-Instruct", "--frobnicate"], "unknown flag --frobnicate"),
        (
            ["--model", "Llama-3.1-8B-Instruct", "--gpu", "4xH100", "-tp", "2"],
            "--gpu = '4xH100': 4 GPUs, but --tensor-parallel-size 2 × "
            "--pipeline-parallel-size 1 = 2",
        ),
        (
            ["--model", "Llama-3.1-8B-Instruct", "--gpu", "3xH100", "-pp", "2"],
            "--gpu = '3xH100': 3 GPUs do not split into --pipeline-parallel-size 2 stages",
        ),
        (
            ["--model", "Llama-3.1-8B-Instruct", "--tensor-parallel-size", "3"],
            "must divide the model's 32 attention heads",
        ),
        (["--model", "Llama-3.1-8B-Instruct", "--context", "lots"], "--context = 'lots'"),
        (["--model", "Llama-3.1-8B-Instruct", "--vllm-version", "latest"], "not a vLLM release"),
        (["--model", "Qwen/Qwen3.5-27B", "--mamba-ssm-cache-dtype", "fp8"], "'fp8'"),
        (
            [
                "--model",
                "Llama-3.1-8B-Instruct",
                "--vllm-version",
                "0.11.0",
                "--model-runner",
                "v2",
            ],
            "--model-runner = 'v2': vLLM 0.11.0 has one model runner",
        ),
    ],
)
def test_bad_input_exits_2_with_one_line_naming_the_value(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, out, err = run_plan(capsys, *args)
    assert code == 2
    assert out == ""
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_invalid_json_config_names_file_and_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "config.json").write_text('{"num_hidden_layers": 32,\n  oops}')
    code, _, err = run_plan(capsys, "--model", str(tmp_path))
    assert code == 2
    assert f"{tmp_path / 'config.json'}: is not valid JSON (line 2" in err


def test_model_dir_without_config_says_so(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run_plan(capsys, "--model", str(tmp_path))
    assert code == 2
    assert "config.json: no config.json here" in err


def test_config_without_sizes_asks_for_the_weights(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # KV fields only: no vocab_size or intermediate_size to count parameters from.
    config = {
        "model_type": "llama",
        "num_hidden_layers": 80,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "torch_dtype": "bfloat16",
        "max_position_embeddings": 8192,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    code, _, err = run_plan(capsys, "--model", str(tmp_path))
    assert code == 2
    assert "pass --weights-bytes" in err


def test_console_script_runs_without_a_traceback_on_bad_input(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("[]")
    env = {**os.environ, "PYTHONWARNINGS": "error"}
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "plan", "--model", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "must hold a JSON object" in proc.stderr


def test_the_sizing_rules_of_the_newest_known_release_apply_to_its_patch_releases(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run_plan(capsys, "--model", "Llama-3.1-8B-Instruct", "--vllm-version", "0.33.4")
    assert code == 0
    assert "vLLM 0.33.4" in out


def test_a_deployment_that_cannot_start_is_offered_the_longest_context_that_fits(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run_plan(
        capsys, "--model", "Llama-3.1-8B-Instruct", "--gpu", "L4", "--output", "json"
    )
    doc = json.loads(out)
    assert code == 1
    longest = doc["startup_error"]["estimated_max_model_len"]
    change = next(w for w in doc["what_if"] if w["change"].startswith("--max-model-len"))
    assert change["change"] == f"--max-model-len {longest} (the longest)"
    assert change["max_sequences"]["max_model_len"] >= 1  # it would start and serve one


def test_a_closed_pipe_ends_plan_quietly_with_exit_0() -> None:
    proc = subprocess.run(
        f"{shlex.quote(sys.executable)} -m exporter plan --model Llama-3.1-8B-Instruct | head -1;"
        " exit ${PIPESTATUS[0]}",
        shell=True,
        executable="bash",
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout.startswith("meta-llama/Llama-3.1-8B-Instruct on H100-80GB")


def test_help_shows_defaults_and_marks_the_model_as_required(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run_plan(capsys, "--help")
    text = " ".join(out.split())  # argparse wraps to the terminal's width
    assert code == 0
    assert "(default: H100-80GB)" in text
    assert "(default: 0.32.0)" in text
    assert "(--model MODEL | --list-models | --list-gpus)" in text


def test_a_model_not_found_suggests_close_names_and_a_downloaded_config(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run_plan(capsys, "--model", "google/gemma-2-27b-instruct")
    assert code == 2
    assert "did you mean google/gemma-2-27b-it or " in err
    assert "--model PATH (its dir or config.json)" in err
    assert len(err.strip().splitlines()) == 1


def test_a100_plans_the_common_part_and_says_so_on_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run_plan(
        capsys, "--model", "Llama-3.1-8B-Instruct", "--gpu", "A100", "--no-what-if"
    )
    assert code == 0
    assert out.startswith("meta-llama/Llama-3.1-8B-Instruct on A100-SXM4-80GB")
    assert err == (
        "kv-headroom plan: --gpu A100 taken as A100-SXM4-80GB, the common one; "
        "name A100-SXM4-40GB or A100-PCIE-40GB if that is yours\n"
    )


def test_a_gpu_count_is_the_tensor_parallel_size(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run_plan(
        capsys, "--model", "Llama-3.1-8B-Instruct", "--gpu", "8xH200", "--output", "json"
    )
    doc = json.loads(out)
    assert (doc["gpu"], doc["tensor_parallel_size"], doc["pipeline_parallel_size"]) == (
        "H200-141GB",
        8,
        1,
    )


def test_a_gpu_count_with_pipeline_stages_splits_over_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, out, _ = run_plan(
        capsys, "--model", "Llama-3.1-8B-Instruct", "--gpu", "4x L40S", "-pp", "2",
        "--output", "json", "--no-what-if",
    )  # fmt: skip
    doc = json.loads(out)
    assert (doc["tensor_parallel_size"], doc["pipeline_parallel_size"]) == (2, 2)


def plan_blocks(capsys: pytest.CaptureFixture[str], *flags: str) -> int:
    code, out, _ = run_plan(
        capsys, "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100",
        "--output", "json", "--no-what-if", *flags,
    )  # fmt: skip
    assert code == 0
    blocks: int = json.loads(out)["num_blocks"]
    return blocks


def test_flashinfer_installed_plans_a_release_before_0_11_1_without_the_sorting_peak(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # vLLM 0.10.2 from the vllm/vllm-openai image samples sort-free: a smaller profile peak.
    pip = plan_blocks(capsys, "--vllm-version", "0.10.2")
    image = plan_blocks(capsys, "--vllm-version", "0.10.2", "--flashinfer", "installed")
    assert image > pip
    assert plan_blocks(capsys, "--vllm-version", "0.10.2", "--flashinfer", "absent") == pip


def test_flashinfer_changes_nothing_from_0_17(capsys: pytest.CaptureFixture[str]) -> None:
    assert plan_blocks(capsys, "--flashinfer", "installed") == plan_blocks(capsys)


def test_model_runner_v1_on_026_subtracts_the_graph_estimate_v2_skips(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # VLLM_USE_V2_MODEL_RUNNER=0 puts a dense model back on the V1 runner in 0.26, whose
    # profile run charges the CUDA-graph estimate; V2 (0.26's default for it) charges none.
    base = ("--model", "Llama-3.1-8B-Instruct", "--vllm-version", "0.26.0", "--output", "json")
    budgets = {}
    for runner in ("v1", "v2"):
        code, out, _ = run_plan(capsys, *base, "--model-runner", runner)
        assert code == 0
        budgets[runner] = json.loads(out)["memory"]["cuda_graph_bytes"]
    assert budgets["v2"] == 0 < budgets["v1"]
