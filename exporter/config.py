"""The sidecar's configuration: a YAML file, ``KV_HEADROOM_*`` variables and flags → one Config.

Precedence is flags > env > file > defaults. Every value in every layer is checked, even one a
higher layer overrides, and nothing is raised until all of them have been: one ConfigError then
lists every problem, so an operator fixes a broken deploy in one pass rather than one per restart.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

import yaml

from exporter.capacity.gpus import lookup_gpu, parse_bytes
from exporter.capacity.kvcache import KV_CACHE_DTYPES
from exporter.capacity.releases import parse_version
from exporter.errors import InputError
from exporter.sources.vllm import redact
from exporter.webconfig import WebConfig, WebConfigError, load_web_config

ENV_PREFIX = "KV_HEADROOM_"
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
class Deployment:
    """What the sidecar assumes where vLLM itself does not say; None = unknown."""

    vllm_version: str | None = None
    gpu: str | None = None
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    max_num_seqs: int | None = None
    max_model_len: int | None = None
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float | None = None
    kv_cache_dtype: str | None = None
    dtype: str | None = None
    quantization: str | None = None
    block_size: int | None = None
    enforce_eager: bool | None = None
    num_gpu_blocks_override: int | None = None
    kv_cache_memory_bytes: int | None = None
    weights_bytes: int | None = None


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

    @property
    def listen_address(self) -> str:
        host = f"[{self.listen_host}]" if ":" in self.listen_host else self.listen_host
        return f"{host}:{self.listen_port}"


class _Bad(Exception):
    """A value's problem, raised before it is known which layer the value came from."""


# A parser gets the raw value and whether it arrived as text (env, flags), where a string is
# the only spelling; in YAML a quoted "true" or "256" is a mistake worth reporting.
Parser = Callable[[object, bool], Any]


def _str(value: object, text: bool) -> str:
    if isinstance(value, str) and value.strip():
        return value.strip()
    if isinstance(value, int | float) and not isinstance(value, bool):
        raise _Bad(f'must be a string; quote it: "{value}"')
    raise _Bad("must be a non-empty string")


def _float(value: object, text: bool) -> float | None:
    if text and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _int(value: object, text: bool) -> int:
    if text and isinstance(value, str) and value.strip().isdecimal():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise _Bad("must be a whole number greater than 0")
    return value


def _utilization(value: object, text: bool) -> float:
    u = _float(value, text)
    if u is None or not 0 < u <= 1:
        raise _Bad("must be a fraction in (0, 1], e.g. 0.9")
    return u


_BOOL_WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def _bool(value: object, text: bool) -> bool:
    if isinstance(value, bool):
        return value
    if text and isinstance(value, str) and value.strip().lower() in _BOOL_WORDS:
        return _BOOL_WORDS[value.strip().lower()]
    raise _Bad("must be true or false" + ("" if text else " (a YAML boolean, not quoted)"))


_UNITS: tuple[tuple[str, float], ...] = (
    *(("y", 31_536_000), ("w", 604_800), ("d", 86_400), ("h", 3600), ("m", 60)),
    *(("s", 1), ("ms", 0.001)),
)
_DURATION_RE = re.compile("".join(rf"(?:(\d+(?:\.\d+)?){u})?" for u, _ in _UNITS))


def _duration(value: object, text: bool) -> float:
    seconds = _float(value, True)  # a plain number is seconds, in YAML as in a flag
    m = _DURATION_RE.fullmatch(value.strip()) if isinstance(value, str) else None
    if m and any(m.groups()):
        seconds = sum(float(n) * s for n, (_, s) in zip(m.groups(), _UNITS, strict=True) if n)
    if seconds is None:
        raise _Bad("must be a duration like 2s, 500ms, 1m30s or a number of seconds")
    if not 0 < seconds < math.inf:
        raise _Bad("must be greater than 0")
    return seconds


def _size(value: object, text: bool) -> int:
    is_int = isinstance(value, int) and not isinstance(value, bool)
    try:  # parse_bytes says what is wrong in the words `plan` uses for the same mistake
        return parse_bytes(str(value) if is_int or isinstance(value, str) else "?", "")
    except InputError as e:
        raise _Bad(e.problem) from None


def _url(value: object, text: bool) -> str:
    url = _str(value, text)
    try:
        parts = urlsplit(url)
        _ = parts.port  # only reading it finds a port that is not a number
    except ValueError as e:
        raise _Bad(f"not a URL: {e}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _Bad("must be an http(s) URL with a host, e.g. http://127.0.0.1:8000")
    return url.rstrip("/")  # callers append /metrics and friends


def _address(value: object, text: bool) -> tuple[str, int]:
    host, colon, port = _str(value, text).rpartition(":")
    if not colon:
        raise _Bad("must be host:port, e.g. :9847 or 127.0.0.1:9847")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise _Bad(f"{host!r} in brackets is not an IPv6 address") from None
    elif ":" in host:
        raise _Bad("put an IPv6 address in brackets, e.g. [::1]:9847")
    if not port.isdecimal() or not 1 <= int(port) <= 65535:
        raise _Bad("the port must be 1-65535")
    return host, int(port)


def _enum(*choices: str) -> Parser:
    def parse(value: object, text: bool) -> str:
        if isinstance(value, str) and value.strip().lower() in choices:
            return value.strip().lower()
        raise _Bad(f"use one of {', '.join(choices)}")

    return parse


def _devices(value: object, text: bool) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else value
    what = "must be a list of GPU indices or UUIDs, e.g. [0, GPU-8c1...]"
    if not isinstance(items, list | tuple) or not items:
        raise _Bad(what)
    # YAML reads an unquoted index as an int; a UUID arrives as a string.
    out = tuple(
        str(i).strip() for i in items if isinstance(i, int | str) and not isinstance(i, bool)
    )
    if len(out) != len(items) or not all(out) or any(d.startswith("-") for d in out):
        raise _Bad(what)
    return out


def _checked(check: Callable[[str], object]) -> Parser:
    """A string the capacity code must accept, judged by that code's own parser."""

    def parse(value: object, text: bool) -> str:
        try:
            check(s := _str(value, text))
        except InputError as e:
            raise _Bad(e.problem) from None
        return s

    return parse


def _show_duration(seconds: float) -> str:
    ms = round(seconds * 1000)
    if ms % 1000:
        return f"{ms}ms" if ms < 1000 else f"{seconds:g}s"
    out, rest = "", ms // 1000
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        if rest >= size:
            out, rest = out + f"{rest // size}{unit}", rest % size
    return out


def _show_size(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def _show(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return ",".join(value) if isinstance(value, tuple) else str(value)


@dataclass(frozen=True)
class _Spec:
    key: str  # dotted, as in the YAML file
    attr: str  # where it lands on Config, dotted for deployment fields
    parse: Parser
    show: Callable[[Any], str] = _show
    flag_name: str | None = None  # when the flag is not the key spelt with dashes
    help: str = ""  # one line for --help and the generated configuration table

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.key.upper().replace(".", "_")

    @property
    def flag(self) -> str:
        return self.flag_name or "--" + self.key.replace("_", "-")


def _dep(name: str, parse: Parser, help: str, show: Callable[[Any], str] = _show) -> _Spec:
    return _Spec(f"deployment.{name}", f"deployment.{name}", parse, show, help=help)


_WHERE_VLLM_SAYS = " (where vLLM's page and command line do not say)"
_SPECS = (
    _Spec("vllm.url", "vllm_url", _url, redact, help="vLLM's base URL; /metrics is read"),
    _Spec(
        "vllm.timeout",
        "vllm_timeout_seconds",
        _duration,
        _show_duration,
        help="per request to vLLM and NVML; unless set, 1.5s or 3/4 of poll.interval if less",
    ),
    _Spec(
        "vllm.max_page_bytes",
        "vllm_max_page_bytes",
        _size,
        _show_size,
        help="a larger /metrics page is refused (vLLM marked down)",
    ),
    _Spec(
        "web.listen_address",
        "listen_address",
        _address,
        help="host:port to serve /metrics, /healthz, /readyz and / on",
    ),
    # Spelt as exporter-toolkit spells it, so one flag and one file serve every exporter.
    _Spec(
        "web.config_file",
        "web_config_file",
        _str,
        flag_name="--web.config.file",
        help="exporter-toolkit web config (TLS, basic auth), as node-exporter reads it",
    ),
    _Spec(
        "poll.interval",
        "poll_interval_seconds",
        _duration,
        _show_duration,
        help="time between polls, start to start",
    ),
    _Spec(
        "poll.window",
        "window_seconds",
        _duration,
        _show_duration,
        help="context lengths and ratios are taken over this window",
    ),
    _Spec(
        "poll.history",
        "history_seconds",
        _duration,
        _show_duration,
        help="how far back the sidecar keeps observations",
    ),
    _Spec("model.path", "model_path", _str, help="the model's directory or its config.json"),
    _Spec(
        "log.format",
        "log_format",
        _enum("auto", "json", "console"),
        help="auto: console on a terminal, JSON lines otherwise",
    ),
    _Spec(
        "log.level",
        "log_level",
        _enum("debug", "info", "warning", "error"),
        help="least level logged",
    ),
    _Spec("nvml.enabled", "nvml_enabled", _bool, help="read GPU memory through NVML"),
    _Spec(
        "nvml.devices", "nvml_devices", _devices, help="GPU indices or UUIDs to read (default: all)"
    ),
    _Spec(
        "proc.path",
        "proc_path",
        _str,
        help="where the host's /proc is mounted, to read vLLM's flags",
    ),
    _dep("vllm_version", _checked(parse_version), "vLLM release" + _WHERE_VLLM_SAYS),
    _dep("gpu", _checked(lookup_gpu), "GPU catalogue name or memory size" + _WHERE_VLLM_SAYS),
    _dep("tensor_parallel_size", _int, "vLLM --tensor-parallel-size" + _WHERE_VLLM_SAYS),
    _dep("pipeline_parallel_size", _int, "vLLM --pipeline-parallel-size" + _WHERE_VLLM_SAYS),
    _dep("max_num_seqs", _int, "vLLM --max-num-seqs" + _WHERE_VLLM_SAYS),
    _dep("max_model_len", _int, "vLLM --max-model-len" + _WHERE_VLLM_SAYS),
    _dep("max_num_batched_tokens", _int, "vLLM --max-num-batched-tokens" + _WHERE_VLLM_SAYS),
    _dep(
        "gpu_memory_utilization", _utilization, "vLLM --gpu-memory-utilization" + _WHERE_VLLM_SAYS
    ),
    _dep("kv_cache_dtype", _enum(*KV_CACHE_DTYPES), "vLLM --kv-cache-dtype" + _WHERE_VLLM_SAYS),
    _dep("dtype", _str, "vLLM --dtype" + _WHERE_VLLM_SAYS),
    _dep("quantization", _str, "vLLM --quantization" + _WHERE_VLLM_SAYS),
    _dep("block_size", _int, "vLLM --block-size" + _WHERE_VLLM_SAYS),
    _dep("enforce_eager", _bool, "vLLM --enforce-eager" + _WHERE_VLLM_SAYS),
    _dep("num_gpu_blocks_override", _int, "vLLM --num-gpu-blocks-override" + _WHERE_VLLM_SAYS),
    _dep(
        "kv_cache_memory_bytes",
        _size,
        "vLLM --kv-cache-memory-bytes" + _WHERE_VLLM_SAYS,
        _show_size,
    ),
    _dep(
        "weights_bytes",
        _size,
        "the whole checkpoint's size, when the model dir lacks it",
        _show_size,
    ),
)
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
    """The parsed YAML document; raises _Bad with the whole problem line."""
    try:
        text = read_text(path)
    except UnicodeDecodeError as e:
        why = f"not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start})"
        raise _Bad(_problem(named_by, CONFIG_FILE_KEY, path, why)) from None
    except OSError as e:
        reason = _READ_ERRORS.get(type(e), f"cannot read it: {e.strerror or e}")
        raise _Bad(_problem(named_by, CONFIG_FILE_KEY, path, reason)) from None
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise _Bad(f"{path}: {at}invalid YAML: {e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise _Bad(f"{path}: invalid YAML: {e}") from None


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
        except _Bad as e:
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
        except _Bad as e:
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
    for key, setting in found.items():
        attr = _BY_KEY[key].attr
        if attr == "listen_address":
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
    )


def _misordered(found: dict[str, _Setting], low: str, high: str, strict: bool) -> list[str]:
    lo, hi = (
        found.get(k) or _Setting("default", "default", None, _get(Config(), _BY_KEY[k].attr))
        for k in (low, high)
    )
    if lo.value < hi.value or (not strict and lo.value == hi.value):
        return []
    # Blame the value from the layer the operator touched last and quote the other one.
    low_blamed = _RANK[lo.source] >= _RANK[hi.source]
    key, bad, other_key, other = (low, lo, high, hi) if low_blamed else (high, hi, low, lo)
    than = [["at least", "greater than"], ["at most", "less than"]][low_blamed][strict]
    origin = ", the default" if other.source == "default" else f" from {other.where}"
    shown = f"{other_key} ({_show_duration(other.value)}{origin})"
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
        (CONFIG_FILE_KEY, config.config_file, _show)
    ]
    rows += [(s.key, _get(config, s.attr), s.show) for s in _SPECS]
    return [
        (key, "(not set)" if value is None else show(value), config.sources.get(key, "default"))
        for key, value, show in rows
    ]
