"""The vLLM server's flags are read from its command line as vLLM itself would read them."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest

from exporter.sources.base import Readings
from exporter.sources.cmdline import FLAGS, ProcessSource, find_vllm_processes, parse_flags
from exporter.sources.records import Flags, VllmProcess

SERVER = "vllm.entrypoints.openai.api_server"


def no_files(path: str) -> str:
    raise AssertionError(f"unexpected read of {path}")


def parse(*argv: str) -> dict[str, object]:
    flags = parse_flags(argv, read_text=no_files)
    assert flags.problems == ()
    return dict(flags.values)


def test_vllm_serve_takes_the_model_from_the_positional_and_flags_after_it() -> None:
    flags = parse_flags(["/usr/local/bin/vllm", "serve", "/models/llama", "--max-num-seqs", "64"])
    assert flags.model == "/models/llama"
    assert dict(flags.values) == {"model": "/models/llama", "max_num_seqs": 64}
    assert dict(flags.origin) == {"model": "cmdline", "max_num_seqs": "cmdline"}


def test_python_m_api_server_takes_the_model_from_dash_dash_model() -> None:
    argv = ["python3", "-m", SERVER, "--model", "/models/qwen", "--port", "8000"]
    assert parse(*argv) == {"model": "/models/qwen", "port": 8000}
    assert parse_flags(argv).model == "/models/qwen"


@pytest.mark.parametrize("python", ["python", "python3", "/usr/bin/python3.11"])
def test_any_python_interpreter_running_the_server_module_is_understood(python: str) -> None:
    assert parse(python, "-u", "-m", SERVER, "--model", "m")["model"] == "m"


def test_console_script_run_through_its_shebang_is_understood() -> None:
    argv = ["/usr/bin/python3", "/usr/local/bin/vllm", "serve", "org/model", "-tp", "2"]
    assert parse(*argv) == {"model": "org/model", "tensor_parallel_size": 2}


def test_flag_equals_value_is_the_same_as_flag_space_value() -> None:
    assert parse("vllm", "serve", "m", "--gpu-memory-utilization=0.85", "--host=0.0.0.0") == {
        "model": "m",
        "gpu_memory_utilization": 0.85,
        "host": "0.0.0.0",
    }


def test_underscores_are_accepted_in_place_of_dashes() -> None:
    values = parse("vllm", "serve", "m", "--max_model_len", "8192", "--kv_cache_dtype=fp8")
    assert values["max_model_len"] == 8192
    assert values["kv_cache_dtype"] == "fp8"


def test_tp_and_pp_are_short_for_tensor_and_pipeline_parallel_size() -> None:
    values = parse("vllm", "serve", "m", "-tp", "4", "-pp", "2")
    assert values["tensor_parallel_size"] == 4
    assert values["pipeline_parallel_size"] == 2


def test_switches_take_no_value_and_no_forms_turn_them_off() -> None:
    switches = ["--enforce-eager", "--no-enable-prefix-caching", "--no-async-scheduling"]
    values = parse("vllm", "serve", "m", *switches)
    assert values["enforce_eager"] is True
    assert values["enable_prefix_caching"] is False
    assert values["async_scheduling"] is False

    # A switch takes no value, so a positional after it is still the model.
    values = parse("vllm", "serve", "--enable-prefix-caching", "m", "--dtype", "half")
    assert values == {"enable_prefix_caching": True, "model": "m", "dtype": "half"}


def test_vllms_other_switches_leave_the_model_positional_after_them() -> None:
    # Switches the sidecar does not read (vLLM has about a hundred).
    for switch in ("--enable-eplb", "--skip-tokenizer-init", "--enable-sleep-mode"):
        assert parse("vllm", "serve", switch, "m", "--max-num-seqs", "8") == {
            "model": "m",
            "max_num_seqs": 8,
        }


def test_the_extensible_kv_cache_switch_is_read_in_both_forms() -> None:
    # 0.34 sizes its cache after warmup unless --no-enable-extensible-kv-cache.
    on = parse("vllm", "serve", "--enable-extensible-kv-cache", "m")
    assert on == {"enable_extensible_kv_cache": True, "model": "m"}
    off = parse("vllm", "serve", "m", "--no-enable-extensible-kv-cache")
    assert off["enable_extensible_kv_cache"] is False


def test_lowercase_k_is_a_thousand_and_uppercase_k_is_1024_as_in_vllm() -> None:
    assert parse("vllm", "serve", "m", "--max-model-len", "32k")["max_model_len"] == 32_000
    assert parse("vllm", "serve", "m", "--max-model-len", "128K")["max_model_len"] == 131_072
    assert parse("vllm", "serve", "m", "--max-model-len=25.6k")["max_model_len"] == 25_600


def test_kv_cache_memory_bytes_accepts_binary_suffixes() -> None:
    values = parse("vllm", "serve", "m", "--kv-cache-memory-bytes", "8G")
    assert values["kv_cache_memory_bytes"] == 8 * 2**30


def test_config_yaml_applies_and_explicit_flags_override_it(tmp_path: Path) -> None:
    config = tmp_path / "vllm.yaml"
    config.write_text("max_model_len: 8192\ngpu-memory-utilization: 0.9\nenforce_eager: true\n")
    flags = parse_flags(["vllm", "serve", "m", "--config", str(config), "--max-model-len", "4096"])
    assert flags.problems == ()
    assert dict(flags.values) == {
        "model": "m",
        "max_model_len": 4096,
        "gpu_memory_utilization": 0.9,
        "enforce_eager": True,
    }
    assert flags.origin["max_model_len"] == "cmdline"
    assert flags.origin["gpu_memory_utilization"] == f"config file {config}"


def test_unreadable_config_is_a_problem_and_the_other_flags_still_count(tmp_path: Path) -> None:
    missing = tmp_path / "absent.yaml"
    flags = parse_flags(["vllm", "serve", "m", f"--config={missing}", "--max-num-seqs", "8"])
    assert dict(flags.values) == {"model": "m", "max_num_seqs": 8}
    assert len(flags.problems) == 1
    assert str(missing) in flags.problems[0]
    assert "No such file" in flags.problems[0]


def test_a_bad_value_is_a_problem_naming_flag_and_value_and_the_flag_is_skipped() -> None:
    flags = parse_flags(["vllm", "serve", "m", "--max-num-seqs", "abc", "--block-size", "32"])
    assert dict(flags.values) == {"model": "m", "block_size": 32}
    assert flags.problems == ("--max-num-seqs = 'abc': not an integer; ignored",)


def test_served_model_name_keeps_the_first_of_its_names() -> None:
    values = parse("vllm", "serve", "/models/x", "--served-model-name", "chat", "chat-v2")
    assert values["served_model_name"] == "chat"
    assert values["model"] == "/models/x"


def test_unknown_flags_are_ignored_with_their_values() -> None:
    values = parse("vllm", "serve", "--seed", "0", "--trust-remote-code", "m", "--port", "9000")
    assert values == {"model": "m", "port": 9000}


def test_a_bad_value_in_the_config_file_names_the_file_and_key(tmp_path: Path) -> None:
    config = tmp_path / "vllm.yaml"
    config.write_text("max_num_seqs: lots\nblock_size: 32\n")
    flags = parse_flags(["vllm", "serve", "m", "--config", str(config)])
    assert flags.values["block_size"] == 32
    assert flags.problems == (f"{config}: max_num_seqs = 'lots': not an integer; ignored",)


def test_max_model_len_auto_is_minus_one_as_vllm_stores_it() -> None:
    assert parse("vllm", "serve", "m", "--max-model-len", "auto")["max_model_len"] == -1
    assert parse("vllm", "serve", "m", "--max-model-len", "-1")["max_model_len"] == -1


def test_a_switch_given_a_value_is_a_problem() -> None:
    flags = parse_flags(["vllm", "serve", "m", "--enforce-eager=true"])
    assert "enforce_eager" not in flags.values
    assert flags.problems == ("--enforce-eager = 'true': is a switch: takes no value; ignored",)


def write_proc(root: Path, pid: int, argv: list[str] | None, environ: str = "") -> None:
    entry = root / str(pid)
    entry.mkdir()
    if argv is not None:
        (entry / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in argv))
    (entry / "environ").write_bytes(environ.replace("\n", "\0").encode())


def test_only_the_api_server_is_found_in_a_pod_with_other_processes(tmp_path: Path) -> None:
    write_proc(tmp_path, 1, ["/pause"])
    write_proc(
        tmp_path, 7, ["vllm", "serve", "m", "--port", "8000"], "CUDA_VISIBLE_DEVICES=0,1\nHOME=/"
    )
    write_proc(tmp_path, 42, ["VLLM::EngineCore"])
    write_proc(tmp_path, 50, ["python3", "-m", "http.server"])
    write_proc(tmp_path, 60, ["/venv/bin/kv-headroom", "serve"])
    write_proc(tmp_path, 61, ["grep", "vllm"])
    write_proc(tmp_path, 70, None)  # exited between listing and reading
    (tmp_path / "self").mkdir()
    [server] = find_vllm_processes(str(tmp_path))
    assert server.pid == 7
    assert server.argv == ("vllm", "serve", "m", "--port", "8000")
    assert dict(server.environ) == {"CUDA_VISIBLE_DEVICES": "0,1", "HOME": "/"}


def test_a_forked_child_still_showing_the_servers_argv_is_not_a_second_server(
    tmp_path: Path,
) -> None:
    argv = ["vllm", "serve", "m"]
    write_proc(tmp_path, 7, argv)
    write_proc(tmp_path, 9, argv)
    (tmp_path / "7" / "stat").write_text("7 (vllm) S 1 7 7 0")
    (tmp_path / "9" / "stat").write_text("9 (vllm serve) S 7 7 7 0")
    assert [p.pid for p in find_vllm_processes(str(tmp_path))] == [7]


def test_unreadable_environ_is_empty(tmp_path: Path) -> None:
    write_proc(tmp_path, 7, ["vllm", "serve", "m"])
    (tmp_path / "7" / "environ").unlink()
    assert dict(find_vllm_processes(str(tmp_path))[0].environ) == {}


def test_kernel_threads_with_an_empty_cmdline_are_skipped(tmp_path: Path) -> None:
    write_proc(tmp_path, 2, [])
    assert find_vllm_processes(str(tmp_path)) == []


def test_a_missing_proc_tree_finds_nothing(tmp_path: Path) -> None:
    assert find_vllm_processes(str(tmp_path / "nope")) == []


# ProcessSource: which vLLM process's flags are believed. Only the one that serves the
# sidecar's --vllm.url: its port (--port, vLLM's default 8000) and its address (--host, or
# every interface when unset, which localhost reaches).


async def believed(url: str, *argv: str) -> Flags | None:
    """The flags ProcessSource takes from a host running one vLLM with ``argv``."""
    process = VllmProcess(4242, argv, {})
    parts = urlsplit(url)
    assert parts.hostname is not None
    assert parts.port is not None
    source = ProcessSource(
        proc_path="/nonexistent",
        host=parts.hostname,
        port=parts.port,
        within=5.0,
        find=lambda _p: [process],
        read_flags=lambda p: parse_flags(p.argv, read_text=no_files),
    )
    readings = Readings()
    assert await source.poll(0.0, readings) is None
    return readings.get(FLAGS)


async def test_an_unrelated_vllm_on_the_host_is_not_believed_for_a_remote_url() -> None:
    flags = await believed("http://10.255.255.1:8000", "vllm", "serve", "other/model")
    assert flags is None


async def test_a_vllm_on_another_port_is_not_believed() -> None:
    flags = await believed("http://127.0.0.1:8000", "vllm", "serve", "m", "--port", "8001")
    assert flags is None


async def test_a_vllm_bound_to_another_address_is_not_believed_for_localhost() -> None:
    argv = ("vllm", "serve", "m", "--host", "10.0.0.5", "--port", "8000")
    assert await believed("http://127.0.0.1:8000", *argv) is None


async def test_the_pods_vllm_on_the_default_port_is_believed_for_localhost() -> None:
    flags = await believed("http://localhost:8000", "vllm", "serve", "m", "--max-num-seqs", "8")
    assert flags is not None
    assert flags.values["max_num_seqs"] == 8


async def test_a_vllm_bound_to_the_urls_address_and_port_is_believed() -> None:
    argv = ("vllm", "serve", "m", "--host", "10.0.0.5", "--port", "9000")
    flags = await believed("http://10.0.0.5:9000", *argv)
    assert flags is not None
    assert flags.model == "m"
