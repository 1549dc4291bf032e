"""``kv-headroom plan`` for a deployment that would not start, and ``--fit``, as a user
runs them: the table, the JSON, the exit status."""

from __future__ import annotations

import json

import pytest

from exporter.cli import main

QWEN_72B = "Qwen/Qwen2.5-72B-Instruct"


def run_plan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["plan", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_deployment_that_cannot_start_exits_1_naming_what_would(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run_plan(capsys, "--model", QWEN_72B)
    assert code == 1
    assert "vLLM would refuse to start: torch.OutOfMemoryError: CUDA out of memory" in out
    section = out.split("What would start")[1].split("What if")[0]
    assert "TP on this GPU         --tensor-parallel-size 4" in section
    assert "--gpu H200-141GB --tensor-parallel-size 2" in section


def test_no_what_if_row_says_only_would_not_start(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run_plan(capsys, "--model", "Qwen/Qwen3-30B-A3B", "--gpu", "L4")
    refused = [line for line in out.splitlines() if "would not start" in line]
    assert refused
    assert all("would not start: " in line for line in refused)


def test_json_names_the_cause_and_what_would_work(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_plan(capsys, "--model", QWEN_72B, "--output", "json")
    doc = json.loads(out)
    assert code == 1
    assert doc["startup_error"]["cause"] == "load_oom"
    assert doc["startup_error"]["why"].startswith("CUDA OOM loading the weights")
    tp = next(s for s in doc["what_would_work"] if s["dial"] == "tensor_parallel")
    assert (tp["change"], tp["starts"], tp["gpus"]) == ("--tensor-parallel-size 4", True, 4)
    refused = [w for w in doc["what_if"] if w.get("starts") is False]
    assert refused
    assert all(w["why_not"] for w in refused)


def test_json_says_why_a_dial_has_nothing_that_starts(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run_plan(capsys, "--model", QWEN_72B, "--output", "json")
    fp8 = next(s for s in json.loads(out)["what_would_work"] if s["dial"] == "kv_cache_dtype")
    assert fp8["starts"] is False
    assert fp8["change"] is None
    assert "CUDA OOM loading the weights" in fp8["why_not"]


def test_vllms_no_available_memory_message_is_followed_by_its_cause(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, out, _ = run_plan(
        capsys, "--model", "Llama-3.1-8B-Instruct", "--weights-bytes", "76GiB", "--no-what-if"
    )
    assert "vLLM would refuse to start: No available memory for the cache blocks" in out
    assert "  that is: no room for one KV block: weights and overhead" in out


def test_no_what_if_leaves_out_what_would_start(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_plan(capsys, "--model", QWEN_72B, "--no-what-if")
    assert code == 1
    assert "What would start" not in out


def test_a_deployment_that_starts_has_no_what_would_start(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run_plan(capsys, "--model", "Llama-3.1-8B-Instruct", "--output", "json")
    assert code == 0
    assert json.loads(out)["what_would_work"] == []


def test_fit_lists_the_deployments_that_hold_them_and_exits_0(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run_plan(capsys, "--model", QWEN_72B, "--fit", "64:8k")
    lines = out.splitlines()
    assert code == 0
    assert "hold 64 sequences of 8,192 tokens at once (--max-model-len 8192)" in lines[0]
    assert "--gpu H100-80GB --tensor-parallel-size 4 --kv-cache-dtype fp8" in out


def test_fit_json_lists_the_fewest_gpus_first(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_plan(capsys, "--model", QWEN_72B, "--fit", "64:8192", "--output", "json")
    doc = json.loads(out)
    counts = [d["gpus"] for d in doc["deployments"]]
    assert code == 0
    assert doc["fit"] == {"sequences": 64, "tokens": 8192, "max_model_len": 8192}
    assert counts == sorted(counts)
    assert all(d["held"] >= 64 for d in doc["deployments"])


def test_fit_that_nothing_holds_exits_1_saying_so(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_plan(
        capsys, "--model", "meta-llama/Meta-Llama-3.1-405B", "--fit", "4096:131072"
    )
    assert code == 1
    assert "none of the table's GPUs at TP 1, 2, 4 or 8 with either KV dtype holds them" in out


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("64", "--fit = '64': write SEQUENCES:TOKENS"),
        ("0:8192", "--fit = '0:8192': both must be greater than 0"),
        ("x:8k", "--fit = 'x:8k': write SEQUENCES:TOKENS"),
    ],
)
def test_a_bad_fit_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], value: str, message: str
) -> None:
    code, out, err = run_plan(capsys, "--model", QWEN_72B, "--fit", value)
    assert code == 2
    assert out == ""
    assert message in err


def test_fit_with_traffic_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_plan(capsys, "--model", QWEN_72B, "--fit", "8:8k", "--traffic", "demo")
    assert code == 2
    assert "--fit" in err
