"""The sidecar's configuration: file, environment and flags merged, every problem reported."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.cli import main
from exporter.config import Config, ConfigError, check_paths, describe, load_config
from exporter.deployment import Deployment
from exporter.sources.registry import REGISTRY

NO_FLAGS: dict[str, object | None] = {}


def write(tmp_path: Path, text: str, name: str = "config.yaml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def load_file(
    tmp_path: Path,
    text: str,
    flags: Mapping[str, object | None] = NO_FLAGS,
    env: Mapping[str, str] | None = None,
) -> Config:
    return load_config({"config.file": write(tmp_path, text), **flags}, env or {})


def problems_of(tmp_path: Path, text: str, env: Mapping[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_file(tmp_path, text, env=env)
    return list(info.value.problems)


def only_problem(tmp_path: Path, text: str) -> str:
    problems = problems_of(tmp_path, text)
    assert len(problems) == 1, problems
    return problems[0]


def test_defaults_apply_when_nothing_is_given() -> None:
    config = load_config(NO_FLAGS, {})
    assert config == Config()
    assert (config.listen_host, config.listen_port) == ("", 9847)
    assert config.vllm_max_page_bytes == 16 << 20
    assert config.deployment == Deployment()
    assert config.config_file is None


def test_file_values_are_read(tmp_path: Path) -> None:
    config = load_file(
        tmp_path,
        """
vllm: {url: "http://vllm:8000/", timeout: 1s}
web: {listen_address: "127.0.0.1:9000"}
poll: {interval: 5s, window: 5m, history: 1h}
model: {path: /models/llama}
log: {format: json, level: debug}
nvml: {enabled: false, devices: [0, GPU-8c1a]}
proc: {path: /host/proc}
deployment:
  vllm_version: "0.19.0"
  gpu: H100-80GB
  tensor_parallel_size: 2
  max_num_seqs: 256
  gpu_memory_utilization: 0.95
  kv_cache_dtype: fp8
  enforce_eager: true
""",
    )
    assert config.vllm_url == "http://vllm:8000"
    assert config.vllm_timeout_seconds == 1.0
    assert (config.listen_host, config.listen_port) == ("127.0.0.1", 9000)
    assert (config.poll_interval_seconds, config.window_seconds) == (5.0, 300.0)
    assert config.history_seconds == 3600.0
    assert config.model_path == "/models/llama"
    assert (config.log_format, config.log_level) == ("json", "debug")
    assert config.nvml_enabled is False
    assert config.nvml_devices == ("0", "GPU-8c1a")
    assert config.proc_path == "/host/proc"
    assert config.deployment == Deployment(
        vllm_version="0.19.0",
        gpu="H100-80GB",
        tensor_parallel_size=2,
        max_num_seqs=256,
        gpu_memory_utilization=0.95,
        kv_cache_dtype="fp8",
        enforce_eager=True,
    )


def test_env_overrides_file(tmp_path: Path) -> None:
    env = {"KV_HEADROOM_POLL_INTERVAL": "3s", "KV_HEADROOM_DEPLOYMENT_MAX_NUM_SEQS": "64"}
    config = load_file(tmp_path, "poll: {interval: 5s}\ndeployment: {max_num_seqs: 8}", env=env)
    assert config.poll_interval_seconds == 3.0
    assert config.deployment.max_num_seqs == 64


def test_flag_overrides_env() -> None:
    config = load_config({"vllm.url": "http://flag:1"}, {"KV_HEADROOM_VLLM_URL": "http://env:2"})
    assert config.vllm_url == "http://flag:1"


def test_config_file_path_can_come_from_env(tmp_path: Path) -> None:
    path = write(tmp_path, "log: {level: warning}")
    config = load_config(NO_FLAGS, {"KV_HEADROOM_CONFIG_FILE": path})
    assert config.log_level == "warning"
    assert config.config_file == path


def test_sources_record_where_each_value_came_from(tmp_path: Path) -> None:
    config = load_file(
        tmp_path,
        "poll: {window: 5m}\nlog: {level: debug}\nmodel: {path: /m}",
        flags={"log.level": "error"},
        env={"KV_HEADROOM_MODEL_PATH": "/env"},
    )
    assert config.sources["poll.window"] == "file"
    assert config.sources["model.path"] == "env"
    assert config.sources["log.level"] == "flag"
    assert config.sources["poll.interval"] == "default"
    assert config.sources["config.file"] == "flag"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1m30s", 90.0), ("500ms", 0.5), ("10m", 600.0), ("1h", 3600.0), ("1.5s", 1.5), ("7", 7.0)],
)
def test_durations_accept_prometheus_style_and_plain_seconds(text: str, seconds: float) -> None:
    short = {"vllm.timeout": "100ms", "poll.interval": "250ms", "poll.history": "1h"}
    config = load_config({**short, "poll.window": text}, {})
    assert config.window_seconds == seconds


def test_plain_yaml_number_is_a_duration_in_seconds(tmp_path: Path) -> None:
    assert load_file(tmp_path, "poll: {interval: 4}").poll_interval_seconds == 4.0


@pytest.mark.parametrize(
    ("text", "size"), [("16MiB", 16 << 20), ("2GB", 2 * 10**9), ("1024", 1024), ("1.5GiB", 3 << 29)]
)
def test_sizes_accept_units(text: str, size: int) -> None:
    env = {"KV_HEADROOM_VLLM_MAX_PAGE_BYTES": text, "KV_HEADROOM_DEPLOYMENT_WEIGHTS_BYTES": text}
    config = load_config(NO_FLAGS, env)
    assert config.vllm_max_page_bytes == size
    assert config.deployment.weights_bytes == size


@pytest.mark.parametrize(
    ("address", "host", "port"),
    [
        (":9847", "", 9847),
        ("127.0.0.1:9000", "127.0.0.1", 9000),
        ("[::1]:9000", "::1", 9000),
        ("localhost:1", "localhost", 1),
    ],
)
def test_listen_address_forms(address: str, host: str, port: int) -> None:
    config = load_config({"web.listen_address": address}, {})
    assert (config.listen_host, config.listen_port) == (host, port)
    assert config.listen_address == address


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("9847", "host:port"),
        ("::1:9000", "brackets"),
        ("[nope]:9000", "not an IPv6 address"),
        (":0", "1-65535"),
        (":65536", "1-65535"),
    ],
)
def test_bad_listen_address_is_rejected(address: str, why: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config({"web.listen_address": address}, {})
    (problem,) = info.value.problems
    assert problem.startswith(f"--web.listen-address: web.listen_address = {address!r}: ")
    assert why in problem


def test_unknown_top_level_key_is_named_with_the_valid_ones(tmp_path: Path) -> None:
    problem = only_problem(tmp_path, "polling: {interval: 2s}")
    assert problem.startswith(f"{tmp_path / 'config.yaml'}: polling: unknown key; valid: ")
    assert "vllm, web, poll, model, log, nvml, proc, deployment" in problem


def test_unknown_nested_key_is_named_with_its_dotted_path(tmp_path: Path) -> None:
    problem = only_problem(tmp_path, "deployment: {max_num_seq: 8}")
    assert ": deployment.max_num_seq: unknown key; valid: vllm_version, gpu," in problem


def test_wrong_type_says_what_is_expected(tmp_path: Path) -> None:
    problem = only_problem(tmp_path, "poll: {interval: [1]}")
    assert problem.endswith(
        "poll.interval = [1]: must be a duration like 2s, 500ms, 1m30s or a number of seconds"
    )


def test_section_that_is_not_a_mapping_is_rejected(tmp_path: Path) -> None:
    problem = only_problem(tmp_path, "poll: 2s")
    assert problem.endswith("poll = '2s': must be a mapping of interval, window, history")


def test_top_level_that_is_not_a_mapping_is_rejected(tmp_path: Path) -> None:
    assert "the top level must be a mapping" in only_problem(tmp_path, "- vllm\n- poll\n")


def test_empty_file_and_null_values_keep_the_defaults(tmp_path: Path) -> None:
    assert load_file(tmp_path, "") == Config(config_file=str(tmp_path / "config.yaml"))
    config = load_file(tmp_path, "web: {listen_address: null}\npoll:\n")
    assert config.listen_port == 9847
    assert config.sources["web.listen_address"] == "default"


def test_invalid_yaml_reports_line_and_column(tmp_path: Path) -> None:
    problem = only_problem(tmp_path, "vllm:\n  url: http://x\n  timeout: [1s\n")
    assert problem.startswith(f"{tmp_path / 'config.yaml'}: line 4, column 1: invalid YAML: ")


def test_missing_file_is_reported(tmp_path: Path) -> None:
    path = str(tmp_path / "absent.yaml")
    with pytest.raises(ConfigError) as info:
        load_config({"config.file": path}, {})
    assert info.value.problems == (f"--config.file: config.file = {path!r}: no such file",)


def test_unreadable_file_is_reported(tmp_path: Path) -> None:
    path = write(tmp_path, "poll: {interval: 2s}")
    flags = {"config.file": path}
    if os.geteuid() == 0:  # root reads a mode-000 file, so have the OS error handed over instead

        def read_text(p: str) -> str:
            raise PermissionError(13, "Permission denied", p)

        with pytest.raises(ConfigError) as info:
            load_config(flags, {}, read_text=read_text)
    else:
        Path(path).chmod(0)
        with pytest.raises(ConfigError) as info:
            load_config(flags, {})
    (problem,) = info.value.problems
    assert problem.startswith(f"--config.file: config.file = {path!r}: permission denied")


def test_file_that_is_not_utf8_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"model: {path: /mod\xe8les}\n")
    with pytest.raises(ConfigError) as info:
        load_config(NO_FLAGS, {"KV_HEADROOM_CONFIG_FILE": str(path)})
    (problem,) = info.value.problems
    assert problem.startswith(f"env KV_HEADROOM_CONFIG_FILE: config.file = '{path}': not UTF-8")
    assert "0xe8 at offset 18" in problem


def test_several_problems_are_all_listed_at_once(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_file(
            tmp_path,
            "vllm: {url: ftp://x}\npoll: {interval: soon}\nlog: {level: loud}\nextra: 1\n",
            flags={"web.listen_address": "nowhere"},
            env={"KV_HEADROOM_DEPLOYMENT_MAX_NUM_SEQS": "many"},
        )
    text = str(info.value)
    assert text.startswith("invalid configuration:\n  - ")
    assert len(info.value.problems) == 6
    for fragment in ("vllm.url", "poll.interval", "log.level", "extra", "web.listen_address"):
        assert fragment in text
    assert "env KV_HEADROOM_DEPLOYMENT_MAX_NUM_SEQS: deployment.max_num_seqs = 'many'" in text


def test_bad_value_in_a_lower_layer_is_reported_even_when_overridden(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, "log: {level: loud}", env={"KV_HEADROOM_LOG_LEVEL": "info"})
    assert problems == [
        f"{tmp_path / 'config.yaml'}: log.level = 'loud': use one of debug, info, warning, error"
    ]


def test_bool_given_as_a_string_in_the_file_is_rejected(tmp_path: Path) -> None:
    problem = only_problem(tmp_path, 'nvml: {enabled: "false"}')
    assert problem.endswith(
        "nvml.enabled = 'false': must be true or false (a YAML boolean, not quoted)"
    )


def test_bool_spelled_as_text_in_env_is_accepted() -> None:
    assert load_config(NO_FLAGS, {"KV_HEADROOM_NVML_ENABLED": "false"}).nvml_enabled is False


def test_bool_where_an_int_is_expected_is_rejected(tmp_path: Path) -> None:
    problem = only_problem(tmp_path, "deployment: {block_size: true}")
    assert problem.endswith("deployment.block_size = True: must be a whole number greater than 0")


def test_number_where_a_string_is_expected_asks_for_quotes(tmp_path: Path) -> None:
    problem = only_problem(tmp_path, "deployment: {vllm_version: 0.19}")
    assert problem.endswith('deployment.vllm_version = 0.19: must be a string; quote it: "0.19"')


def test_timeout_not_below_the_poll_interval_is_rejected() -> None:
    with pytest.raises(ConfigError) as info:
        load_config({"vllm.timeout": "2s"}, {})
    assert info.value.problems == (
        "--vllm.timeout: vllm.timeout = '2s': must be less than poll.interval (2s, the default)",
    )


def test_ordering_problem_blames_the_value_set_last() -> None:
    with pytest.raises(ConfigError) as info:
        load_config({"poll.interval": "15m"}, {"KV_HEADROOM_POLL_WINDOW": "10m"})
    assert info.value.problems == (
        "--poll.interval: poll.interval = '15m': must be at most poll.window "
        "(10m from env KV_HEADROOM_POLL_WINDOW)",
    )


def test_history_shorter_than_window_is_rejected(tmp_path: Path) -> None:
    problem = only_problem(tmp_path, "poll: {window: 20m}")
    assert problem.endswith("poll.window = '20m': must be at most poll.history (15m, the default)")


def test_gpu_name_is_validated(tmp_path: Path) -> None:
    assert load_config(NO_FLAGS, {"KV_HEADROOM_DEPLOYMENT_GPU": "h100"}).deployment.gpu == "h100"
    assert load_config(NO_FLAGS, {"KV_HEADROOM_DEPLOYMENT_GPU": "80GB"}).deployment.gpu == "80GB"
    problem = only_problem(tmp_path, "deployment: {gpu: H100-9000}")
    assert "deployment.gpu = 'H100-9000': unknown GPU; did you mean H100-80GB" in problem


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"KV_HEADROOM_DEPLOYMENT_KV_CACHE_DTYPE": "fp4"}, "use one of auto, fp16"),
        ({"KV_HEADROOM_DEPLOYMENT_GPU_MEMORY_UTILIZATION": "1.2"}, "(0, 1]"),
        ({"KV_HEADROOM_DEPLOYMENT_GPU_MEMORY_UTILIZATION": "0"}, "(0, 1]"),
        ({"KV_HEADROOM_DEPLOYMENT_TENSOR_PARALLEL_SIZE": "0"}, "greater than 0"),
        ({"KV_HEADROOM_VLLM_URL": "127.0.0.1:8000"}, "http(s) URL with a host"),
        ({"KV_HEADROOM_VLLM_URL": "http://"}, "http(s) URL with a host"),
        ({"KV_HEADROOM_POLL_INTERVAL": "0s"}, "greater than 0"),
        ({"KV_HEADROOM_POLL_INTERVAL": "2 minutes"}, "must be a duration"),
        ({"KV_HEADROOM_VLLM_MAX_PAGE_BYTES": "16KB"}, "not a size"),
        ({"KV_HEADROOM_NVML_DEVICES": "0,,1"}, "GPU indices or UUIDs"),
    ],
)
def test_out_of_range_values_are_rejected(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(NO_FLAGS, env)
    ((name, value),) = env.items()
    (problem,) = info.value.problems
    assert problem.startswith(f"env {name}: ")
    assert f" = {value!r}: " in problem
    assert fragment in problem


def test_unknown_env_variable_suggests_the_close_name() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(NO_FLAGS, {"KV_HEADROOM_POLL_INTERVALL": "2s", "PATH": "/bin"})
    assert info.value.problems == (
        "env KV_HEADROOM_POLL_INTERVALL: unknown setting; did you mean KV_HEADROOM_POLL_INTERVAL?",
    )


def test_empty_env_variable_counts_as_unset() -> None:
    config = load_config(NO_FLAGS, {"KV_HEADROOM_MODEL_PATH": "", "KV_HEADROOM_CONFIG_FILE": ""})
    assert config == Config()


def test_config_is_frozen_and_its_sources_read_only() -> None:
    config = load_config(NO_FLAGS, {})
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.vllm_url = "http://other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.sources["vllm.url"] = "flag"  # type: ignore[index]
    assert hash(config) == hash(load_config(NO_FLAGS, {}))


def test_describe_lists_every_setting_with_its_source(tmp_path: Path) -> None:
    path = write(tmp_path, "poll: {interval: 90}\ndeployment: {weights_bytes: 16GiB}")
    config = load_config(
        {"config.file": path, "vllm.url": "http://user:secret@vllm:8000"},
        {"KV_HEADROOM_NVML_DEVICES": "0,1"},
    )
    rows = describe(config)
    assert rows[0] == ("config.file", path, "flag")
    by_key = {key: (shown, source) for key, shown, source in rows}
    assert by_key["vllm.url"] == ("http://user:***@vllm:8000", "flag")
    assert by_key["poll.interval"] == ("1m30s", "file")
    assert by_key["vllm.timeout"] == ("1.5s", "default")
    assert by_key["vllm.max_page_bytes"] == ("16MiB", "default")
    assert by_key["web.listen_address"] == (":9847", "default")
    assert by_key["nvml.enabled"] == ("true", "default")
    assert by_key["nvml.devices"] == ("0,1", "env")
    assert by_key["model.path"] == ("(not set)", "default")
    assert by_key["deployment.weights_bytes"] == ("16GiB", "file")
    assert by_key["web.config_file"] == ("(not set)", "default")
    # The sidecar's own settings, then those each registered source declares (dcgm's three).
    from_sources = sum(len(plugin.settings) for plugin in REGISTRY)
    # The eighteen ``deployment:`` keys: what the sidecar may be told where vLLM does not say
    # (the resolved ``Deployment`` has more fields, read from vLLM alone).
    assert len(rows) == 1 + 14 + 18 + from_sources


YAML_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=6,
)
KEYS = st.sampled_from(
    [
        "vllm.url",
        "vllm.timeout",
        "web.listen_address",
        "poll.interval",
        "nvml.devices",
        "deployment.gpu",
        "deployment.max_num_seqs",
        "deployment.weights_bytes",
        "log.level",
    ]
) | st.tuples(st.sampled_from(["poll", "x\ny"]), st.text(max_size=4)).map(".".join)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(KEYS, YAML_VALUES, max_size=5), st.text(max_size=8))
def test_any_file_content_gives_a_config_or_a_config_error(
    values: dict[str, object], env_value: str
) -> None:
    doc: dict[str, dict[str, object]] = {}
    for key, value in values.items():
        section, _, leaf = key.partition(".")
        doc.setdefault(section, {})[leaf] = value
    text = yaml.safe_dump(doc)
    env = {"KV_HEADROOM_POLL_WINDOW": env_value, "KV_HEADROOM_CONFIG_FILE": "c.yaml"}
    problems: tuple[str, ...] = ()
    try:
        load_config(NO_FLAGS, env, read_text=lambda _: text)
    except ConfigError as e:
        problems = e.problems
    assert all(p and "\n" not in p for p in problems)


def test_the_default_timeout_follows_a_short_poll_interval() -> None:
    config = load_config({"poll.interval": "1s"}, {})
    assert config.vllm_timeout_seconds == 0.75
    assert config.sources["vllm.timeout"] == "default"


def test_a_long_poll_interval_keeps_the_default_timeout() -> None:
    assert load_config({"poll.interval": "30s"}, {}).vllm_timeout_seconds == 1.5


def test_check_paths_names_a_model_path_that_does_not_exist(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope")
    config = load_config({"model.path": missing}, {})
    assert check_paths(config) == [
        f"--model.path: model.path = {missing!r}: no such file or directory"
    ]


def test_check_paths_accepts_a_model_dir(tmp_path: Path) -> None:
    assert check_paths(load_config({"model.path": str(tmp_path)}, {})) == []


def run_serve(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["serve", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_serve_check_config_refuses_a_missing_model_path_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run_serve(capsys, "--check-config", "--model.path", "/nonexistent")
    assert code == 2
    assert out == ""
    assert err == (
        "kv-headroom serve: --model.path: model.path = '/nonexistent': no such file or directory\n"
    )


def test_serve_accepts_a_one_second_poll_interval(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_serve(capsys, "--check-config", "--poll.interval", "1s")
    assert code == 0
    assert re.search(r"^vllm.timeout +750ms  \(default\)$", out, re.M)


def test_serve_bad_flag_value_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_serve(capsys, "--check-config", "--poll.interval", "abc")
    assert code == 2
    assert len(err.splitlines()) == 1
    assert err.startswith("kv-headroom serve: --poll.interval: poll.interval = 'abc': ")


def test_serve_unknown_flag_is_one_line_not_a_usage_dump(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run_serve(capsys, "--poll-intervall", "1s")
    assert code == 2
    assert len(err.splitlines()) == 1
    assert "unknown flag --poll-intervall; did you mean --poll.interval?" in err


def test_serve_help_shows_each_flags_default(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_serve(capsys, "--help")
    text = " ".join(out.split())
    assert code == 0
    assert "(default: http://127.0.0.1:8000)" in text
    assert "(default: :9847)" in text
    assert "(default: 2s)" in text
