"""The sidecar's configuration: a YAML file, ``KV_HEADROOM_*`` variables and flags → one Config.

Precedence is flags > env > file > defaults. Every value in every layer is checked, even one a
higher layer overrides, and nothing is raised until all of them have been: one ConfigError then
lists every problem, so an operator fixes a broken deploy in one pass rather than one per restart.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar, cast

import yaml

from exporter.capacity.gpus import lookup_gpu
from exporter.capacity.kvcache import KV_CACHE_DTYPES
from exporter.capacity.releases import parse_version
from exporter.deployment import Deployment
from exporter.errors import InputError
from exporter.settings import (
    ENV_PREFIX,
    Bad,
    Parser,
    Spec,
    parse_address,
    parse_bool,
    parse_checked,
    parse_devices,
    parse_duration,
    parse_enum,
    parse_int,
    parse_size,
    parse_str,
    parse_url,
    parse_utilization,
    show,
    show_duration,
    show_size,
)
from exporter.sources.registry import REGISTRY
from exporter.sources.vllm import redact
from exporter.webconfig import WebConfig, WebConfigError, load_web_config

CONFIG_FILE_KEY = "config.file"
CONFIG_FILE_ENV = ENV_PREFIX + "CONFIG_FILE"
# Unless set, vLLM's timeout is this share of a poll interval shorter than its default, so
# a poll that times out still leaves the rest of the interval for the snapshot.
TIMEOUT_SHARE = 0.75


class ConfigError(Exception):
    """Every problem found, one line each: ``<where>: <key> = <value>: <what to do>``."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("invalid configuration:\n" + "\n".join(f"  - {p}" for p in problems))


@dataclass(frozen=True)
class Config:
    """Everything the sidecar runs with; ``sources`` says where each dotted key came from."""

    vllm_url: str = "http://127.0.0.1:8000"
    vllm_timeout_seconds: float = 1.5
    vllm_max_page_bytes: int = 16 * 1024 * 1024
    listen_host: str = ""  # every interface, as ":9847" means to Prometheus exporters
    listen_port: int = 9847
    web_config_file: str | None = None  # exporter-toolkit web config: TLS, basic auth
    web_config: WebConfig | None = None  # what that file says, checked at load
    poll_interval_seconds: float = 2.0
    window_seconds: float = 600.0
    history_seconds: float = 900.0
    model_path: str | None = None
    log_format: str = "auto"  # console on a TTY, json otherwise
    log_level: str = "info"
    nvml_enabled: bool = True
    nvml_devices: tuple[str, ...] | None = None  # None: every GPU NVML sees
    proc_path: str = "/proc"
    deployment: Deployment = field(default_factory=Deployment)
    config_file: str | None = None
    # Read-only so a Config handed around cannot be changed behind its back. Two configs that
    # run the same are equal whatever their provenance, and a mapping proxy has no hash.
    sources: Mapping[str, str] = field(
        default_factory=lambda: MappingProxyType({}), hash=False, compare=False
    )
    # The settings a source declares for itself (sources.registry), by dotted key: only what
    # was set; ``get`` gives the spec's default for the rest. Compared, not hashed, like above.
    settings: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}), hash=False)

    @property
    def listen_address(self) -> str:
        host = f"[{self.listen_host}]" if ":" in self.listen_host else self.listen_host
        return f"{host}:{self.listen_port}"

    def get(self, spec: Spec[T]) -> T:
        """A setting's value, typed by its spec: its Config field, else what was set, else
        the spec's default."""
        if spec.attr is not None:
            value: T = _get(self, spec.attr)
            return value
        return cast(T, self.settings.get(spec.key, spec.default))

    def value(self, key: str) -> Any:
        """A setting's value by its dotted key (a source's enable flag, say)."""
        return self.get(_BY_KEY[key])


T = TypeVar("T")


def _dep(name: str, parse: Parser, help: str, show: Callable[[Any], str] = show) -> Spec[Any]:
    return Spec(f"deployment.{name}", f"deployment.{name}", parse, show, help=help)


_WHERE_VLLM_SAYS = " (where vLLM's page and command line do not say)"
_CORE_SPECS: tuple[Spec[Any], ...] = (
    Spec("vllm.url", "vllm_url", parse_url, redact, help="vLLM's base URL; /metrics is read"),
    Spec(
        "vllm.timeout",
        "vllm_timeout_seconds",
        parse_duration,
        show_duration,
        help="per request to vLLM and NVML; unless set, 1.5s or 3/4 of poll.interval if less",
    ),
    Spec(
        "vllm.max_page_bytes",
        "vllm_max_page_bytes",
        parse_size,
        show_size,
        help="a larger /metrics page is refused (vLLM marked down)",
    ),
    Spec(
        "web.listen_address",
        "listen_address",
        parse_address,
        help="host:port to serve /metrics, /healthz, /readyz and / on",
    ),
    # Spelt as exporter-toolkit spells it, so one flag and one file serve every exporter.
    Spec(
        "web.config_file",
        "web_config_file",
        parse_str,
        flag_name="--web.config.file",
        help="exporter-toolkit web config (TLS, basic auth), as node-exporter reads it",
    ),
    Spec(
        "poll.interval",
        "poll_interval_seconds",
        parse_duration,
        show_duration,
        help="time between polls, start to start",
    ),
    Spec(
        "poll.window",
        "window_seconds",
        parse_duration,
        show_duration,
        help="context lengths and ratios are taken over this window",
    ),
    Spec(
        "poll.history",
        "history_seconds",
        parse_duration,
        show_duration,
        help="how far back the sidecar keeps observations",
    ),
    Spec("model.path", "model_path", parse_str, help="the model's directory or its config.json"),
    Spec(
        "log.format",
        "log_format",
        parse_enum("auto", "json", "console"),
        help="auto: console on a terminal, JSON lines otherwise",
    ),
    Spec(
        "log.level",
        "log_level",
        parse_enum("debug", "info", "warning", "error"),
        help="least level logged",
    ),
    Spec("nvml.enabled", "nvml_enabled", parse_bool, help="read GPU memory through NVML"),
    Spec(
        "nvml.devices",
        "nvml_devices",
        parse_devices,
        help="GPU indices or UUIDs to read (default: all)",
    ),
    Spec(
        "proc.path",
        "proc_path",
        parse_str,
        help="where the host's /proc is mounted, to read vLLM's flags",
    ),
    _dep("vllm_version", parse_checked(parse_version), "vLLM release" + _WHERE_VLLM_SAYS),
    _dep("gpu", parse_checked(lookup_gpu), "GPU catalogue name or memory size" + _WHERE_VLLM_SAYS),
    _dep("tensor_parallel_size", parse_int, "vLLM --tensor-parallel-size" + _WHERE_VLLM_SAYS),
    _dep("pipeline_parallel_size", parse_int, "vLLM --pipeline-parallel-size" + _WHERE_VLLM_SAYS),
    _dep("max_num_seqs", parse_int, "vLLM --max-num-seqs" + _WHERE_VLLM_SAYS),
    _dep("max_model_len", parse_int, "vLLM --max-model-len" + _WHERE_VLLM_SAYS),
    _dep("max_num_batched_tokens", parse_int, "vLLM --max-num-batched-tokens" + _WHERE_VLLM_SAYS),
    _dep(
        "gpu_memory_utilization",
        parse_utilization,
        "vLLM --gpu-memory-utilization" + _WHERE_VLLM_SAYS,
    ),
    _dep(
        "kv_cache_dtype", parse_enum(*KV_CACHE_DTYPES), "vLLM --kv-cache-dtype" + _WHERE_VLLM_SAYS
    ),
    _dep("dtype", parse_str, "vLLM --dtype" + _WHERE_VLLM_SAYS),
    _dep("quantization", parse_str, "vLLM --quantization" + _WHERE_VLLM_SAYS),
    _dep("block_size", parse_int, "vLLM --block-size" + _WHERE_VLLM_SAYS),
    _dep("enforce_eager", parse_bool, "vLLM --enforce-eager" + _WHERE_VLLM_SAYS),
    _dep("num_gpu_blocks_override", parse_int, "vLLM --num-gpu-blocks-override" + _WHERE_VLLM_SAYS),
    _dep(
        "kv_cache_memory_bytes",
        parse_size,
        "vLLM --kv-cache-memory-bytes" + _WHERE_VLLM_SAYS,
        show_size,
    ),
    _dep(
        "weights_bytes",
        parse_size,
        "the whole checkpoint's size, when the model dir lacks it",
        show_size,
    ),
    _dep(
        "flashinfer",
        parse_enum("installed", "absent"),
        "FlashInfer in vLLM's image: before 0.11.1 its sampler does not sort, a smaller "
        "profile peak (the vllm/vllm-openai image: installed; pip install vllm: absent, "
        "the default)",
    ),
    _dep(
        "model_runner",
        parse_enum("v1", "v2"),
        "VLLM_USE_V2_MODEL_RUNNER=0 (v1) or =1 (v2) in vLLM's environment, vLLM 0.12+: the "
        "runner moves the graph estimate, the sampler's peak and its kept state (default: the "
        "release's choice for the model)",
    ),
)
# The sidecar's own settings, then each registered source's (sources/registry.py), in the
# registry's order: a source brings its keys, variables, flags and docs rows with it.
_SPECS: tuple[Spec[Any], ...] = (*_CORE_SPECS, *(s for p in REGISTRY for s in p.settings))
_BY_KEY = {s.key: s for s in _SPECS}
SPECS_BY_KEY = _BY_KEY  # for the command line, which spells each key as a flag
_BY_ENV = {s.env: s for s in _SPECS}
_SECTIONS = {  # section -> its keys, as an unknown key's problem lists them
    sec: ", ".join(k.partition(".")[2] for k in _BY_KEY if k.startswith(sec + "."))
    for sec in dict.fromkeys(k.partition(".")[0] for k in _BY_KEY)
}
# (lower, higher, strictly): the timeout must end before the next poll starts, and the
# window and history must each hold at least one of what they are built from.
_ORDER = (
    ("vllm.timeout", "poll.interval", True),
    ("poll.interval", "poll.window", False),
    ("poll.window", "poll.history", False),
)
_RANK = {"default": 0, "file": 1, "env": 2, "flag": 3}


def _get(config: Config, attr: str) -> Any:
    obj: Any = config
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class _Setting:
    source: str  # file, env, flag or default
    where: str  # the path, "env NAME" or "--flag"
    raw: object
    value: Any = None


def _problem(where: str, key: str, value: object, what: str) -> str:
    return str(InputError(where, key, value, what))


_READ_ERRORS: dict[type[OSError], str] = {
    FileNotFoundError: "no such file",
    IsADirectoryError: "is a directory, not a file",
    PermissionError: "permission denied; make it readable by the sidecar's user",
}


def _read_file(path: str, named_by: str, read_text: Callable[[str], str]) -> Any:
    """The parsed YAML document; raises Bad with the whole problem line."""
    try:
        text = read_text(path)
    except UnicodeDecodeError as e:
        why = f"not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start})"
        raise Bad(_problem(named_by, CONFIG_FILE_KEY, path, why)) from None
    except OSError as e:
        reason = _READ_ERRORS.get(type(e), f"cannot read it: {e.strerror or e}")
        raise Bad(_problem(named_by, CONFIG_FILE_KEY, path, reason)) from None
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise Bad(f"{path}: {at}invalid YAML: {e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise Bad(f"{path}: invalid YAML: {e}") from None


def _name(key: object) -> str:
    """A YAML key as a problem names it: quoted when odd, since each problem is one line."""
    return key if isinstance(key, str) and key.isprintable() and key else repr(key)


def _file_settings(path: str, data: Any, problems: list[str]) -> list[tuple[str, _Setting]]:
    if data is None:  # an empty file
        return []
    if not isinstance(data, dict):
        problems.append(f"{path}: the top level must be a mapping of {', '.join(_SECTIONS)}")
        return []
    out = []
    for section, body in data.items():
        if section not in _SECTIONS:
            valid = ", ".join(_SECTIONS)
            problems.append(_problem(path, _name(section), None, f"unknown key; valid: {valid}"))
            continue
        valid = _SECTIONS[section]
        if not isinstance(body, dict):
            if body is not None:  # a section left empty, `poll:`, is just no settings
                problems.append(_problem(path, section, body, f"must be a mapping of {valid}"))
            continue
        for leaf, raw in body.items():
            key = f"{section}.{_name(leaf)}"
            if key not in _BY_KEY:
                problems.append(_problem(path, key, None, f"unknown key; valid: {valid}"))
            elif raw is not None:  # an explicit null keeps the default
                out.append((key, _Setting("file", path, raw)))
    return out


def load_config(
    flags: Mapping[str, object | None],
    env: Mapping[str, str],
    read_text: Callable[[str], str] = lambda path: Path(path).read_text(encoding="utf-8"),
) -> Config:
    """Merge the layers over the defaults; raises ConfigError listing every problem."""
    problems: list[str] = []
    given: list[tuple[str, _Setting]] = []  # lowest precedence first, so later ones win
    file_flag, file_env = flags.get(CONFIG_FILE_KEY), env.get(CONFIG_FILE_ENV)
    config_file = str(file_flag) if file_flag is not None else file_env or None
    if config_file is not None:
        named_by = "--config.file" if file_flag is not None else f"env {CONFIG_FILE_ENV}"
        try:
            given += _file_settings(
                config_file, _read_file(config_file, named_by, read_text), problems
            )
        except Bad as e:
            problems.append(str(e))
    for name, text in sorted(env.items()):
        # An empty variable is how templated deploys leave one unset.
        if not name.startswith(ENV_PREFIX) or name == CONFIG_FILE_ENV or text == "":
            continue
        if name in _BY_ENV:
            given.append((_BY_ENV[name].key, _Setting("env", f"env {name}", text)))
        else:
            near = difflib.get_close_matches(name, [*_BY_ENV, CONFIG_FILE_ENV], n=1)
            hint = f"; did you mean {near[0]}?" if near else ""
            problems.append(_problem(f"env {_name(name)}", "", None, f"unknown setting{hint}"))
    for key, raw in flags.items():
        if key in _BY_KEY and raw is not None:
            given.append((key, _Setting("flag", _BY_KEY[key].flag, raw)))
        elif key != CONFIG_FILE_KEY and raw is not None:
            problems.append(_problem(f"--{key}", "", None, "unknown setting"))

    found: dict[str, _Setting] = {}
    failed: set[str] = set()  # keys whose winning value is bad: no cross-checks on those
    for key, setting in given:
        try:
            value = _BY_KEY[key].parse(setting.raw, setting.source != "file")
            found[key] = replace(setting, value=value)
            failed.discard(key)
        except Bad as e:
            problems.append(_problem(setting.where, key, setting.raw, str(e)))
            failed.add(key)
    if "vllm.timeout" not in found and "poll.interval" in found:
        # The timeout is only a default the operator never chose: let it follow the interval
        # they did choose rather than refuse it (`--poll.interval 1s` against 1.5s).
        follows = min(Config.vllm_timeout_seconds, TIMEOUT_SHARE * found["poll.interval"].value)
        found["vllm.timeout"] = _Setting("default", "default", None, follows)
    for low, high, strict in _ORDER:
        if not failed & {low, high}:
            problems += _misordered(found, low, high, strict)
    web_config = None
    if "web.config_file" in found:
        setting = found["web.config_file"]
        try:
            web_config = load_web_config(setting.value, setting.where, "web.config_file", read_text)
        except WebConfigError as e:
            problems += e.problems
    if problems:
        raise ConfigError(problems)

    kwargs: dict[str, Any] = {}
    deployment: dict[str, Any] = {}
    settings: dict[str, Any] = {}
    for key, setting in found.items():
        attr = _BY_KEY[key].attr
        if attr is None:  # a source's own setting
            settings[key] = setting.value
        elif attr == "listen_address":
            kwargs["listen_host"], kwargs["listen_port"] = setting.value
        elif attr.startswith("deployment."):
            deployment[attr.partition(".")[2]] = setting.value
        else:
            kwargs[attr] = setting.value
    sources = {s.key: found[s.key].source if s.key in found else "default" for s in _SPECS}
    if config_file is not None:
        sources[CONFIG_FILE_KEY] = "flag" if file_flag is not None else "env"
    return Config(
        **kwargs,
        web_config=web_config,
        deployment=Deployment(**deployment),
        config_file=config_file,
        sources=MappingProxyType(sources),
        settings=MappingProxyType(settings),
    )


def _misordered(found: dict[str, _Setting], low: str, high: str, strict: bool) -> list[str]:
    lo, hi = (
        found.get(k) or _Setting("default", "default", None, Config().value(k)) for k in (low, high)
    )
    if lo.value < hi.value or (not strict and lo.value == hi.value):
        return []
    # Blame the value from the layer the operator touched last and quote the other one.
    low_blamed = _RANK[lo.source] >= _RANK[hi.source]
    key, bad, other_key, other = (low, lo, high, hi) if low_blamed else (high, hi, low, lo)
    than = [["at least", "greater than"], ["at most", "less than"]][low_blamed][strict]
    origin = ", the default" if other.source == "default" else f" from {other.where}"
    shown = f"{other_key} ({show_duration(other.value)}{origin})"
    return [_problem(bad.where, key, bad.raw, f"must be {than} {shown}")]


def check_paths(
    config: Config,
    is_dir: Callable[[str], bool] = lambda p: Path(p).is_dir(),
    is_file: Callable[[str], bool] = lambda p: Path(p).is_file(),
) -> list[str]:
    """Problems with the paths a config names, for ``serve --check-config``.

    Not part of ``load_config``: a running sidecar may start before the model volume is
    filled (vLLM downloads into it) and reports the model source down until it is; a check
    run by hand wants to hear about a typo now.
    """
    problems = []
    model = config.model_path
    if model is not None and not (is_dir(model) or is_file(model)):
        where = _where(config, "model.path")
        problems.append(_problem(where, "model.path", model, "no such file or directory"))
    if config.sources.get("proc.path", "default") != "default" and not is_dir(config.proc_path):
        where = _where(config, "proc.path")
        problems.append(_problem(where, "proc.path", config.proc_path, "no such directory"))
    return problems


def _where(config: Config, key: str) -> str:
    source = config.sources.get(key, "default")
    spec = _BY_KEY[key]
    return {"flag": spec.flag, "env": f"env {spec.env}"}.get(source, config.config_file or source)


def describe(config: Config) -> list[tuple[str, str, str]]:
    """(dotted key, value as shown, where it came from) for every setting, file first."""
    rows: list[tuple[str, Any, Callable[[Any], str]]] = [
        (CONFIG_FILE_KEY, config.config_file, show)
    ]
    rows += [(s.key, config.get(s), s.show) for s in _SPECS]
    return [
        (key, "(not set)" if value is None else show(value), config.sources.get(key, "default"))
        for key, value, show in rows
    ]
