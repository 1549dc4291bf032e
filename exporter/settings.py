"""Settings as spec rows: one row is a dotted YAML key, its parser, its ``KV_HEADROOM_*``
variable, its flag and its help line, from which the configuration, ``serve``'s flags and
docs/configuration.md are all made.

It sits below ``config`` so that a source can declare its own rows (``sources.base.Plugin``)
without importing the configuration that collects them.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import urlsplit

from exporter.capacity.gpus import parse_bytes
from exporter.errors import InputError

ENV_PREFIX = "KV_HEADROOM_"
T = TypeVar("T")


class Bad(Exception):
    """A value's problem, raised before it is known which layer the value came from."""


# A parser gets the raw value and whether it arrived as text (env, flags), where a string is
# the only spelling; in YAML a quoted "true" or "256" is a mistake worth reporting.
Parser = Callable[[object, bool], Any]


def parse_str(value: object, text: bool) -> str:
    if isinstance(value, str) and value.strip():
        return value.strip()
    if isinstance(value, int | float) and not isinstance(value, bool):
        raise Bad(f'must be a string; quote it: "{value}"')
    raise Bad("must be a non-empty string")


def _float(value: object, text: bool) -> float | None:
    if text and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def parse_int(value: object, text: bool) -> int:
    if text and isinstance(value, str) and value.strip().isdecimal():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise Bad("must be a whole number greater than 0")
    return value


def parse_utilization(value: object, text: bool) -> float:
    u = _float(value, text)
    if u is None or not 0 < u <= 1:
        raise Bad("must be a fraction in (0, 1], e.g. 0.9")
    return u


_BOOL_WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def parse_bool(value: object, text: bool) -> bool:
    if isinstance(value, bool):
        return value
    if text and isinstance(value, str) and value.strip().lower() in _BOOL_WORDS:
        return _BOOL_WORDS[value.strip().lower()]
    raise Bad("must be true or false" + ("" if text else " (a YAML boolean, not quoted)"))


_UNITS: tuple[tuple[str, float], ...] = (
    *(("y", 31_536_000), ("w", 604_800), ("d", 86_400), ("h", 3600), ("m", 60)),
    *(("s", 1), ("ms", 0.001)),
)
_DURATION_RE = re.compile("".join(rf"(?:(\d+(?:\.\d+)?){u})?" for u, _ in _UNITS))


def parse_duration(value: object, text: bool) -> float:
    seconds = _float(value, True)  # a plain number is seconds, in YAML as in a flag
    m = _DURATION_RE.fullmatch(value.strip()) if isinstance(value, str) else None
    if m and any(m.groups()):
        seconds = sum(float(n) * s for n, (_, s) in zip(m.groups(), _UNITS, strict=True) if n)
    if seconds is None:
        raise Bad("must be a duration like 2s, 500ms, 1m30s or a number of seconds")
    if not 0 < seconds < math.inf:
        raise Bad("must be greater than 0")
    return seconds


def parse_size(value: object, text: bool) -> int:
    is_int = isinstance(value, int) and not isinstance(value, bool)
    try:  # parse_bytes says what is wrong in the words `plan` uses for the same mistake
        return parse_bytes(str(value) if is_int or isinstance(value, str) else "?", "")
    except InputError as e:
        raise Bad(e.problem) from None


def parse_url(value: object, text: bool) -> str:
    url = parse_str(value, text)
    try:
        parts = urlsplit(url)
        _ = parts.port  # only reading it finds a port that is not a number
    except ValueError as e:
        raise Bad(f"not a URL: {e}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Bad("must be an http(s) URL with a host, e.g. http://127.0.0.1:8000")
    return url.rstrip("/")  # callers append /metrics and friends


def parse_address(value: object, text: bool) -> tuple[str, int]:
    host, colon, port = parse_str(value, text).rpartition(":")
    if not colon:
        raise Bad("must be host:port, e.g. :9847 or 127.0.0.1:9847")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise Bad(f"{host!r} in brackets is not an IPv6 address") from None
    elif ":" in host:
        raise Bad("put an IPv6 address in brackets, e.g. [::1]:9847")
    if not port.isdecimal() or not 1 <= int(port) <= 65535:
        raise Bad("the port must be 1-65535")
    return host, int(port)


def parse_enum(*choices: str) -> Parser:
    def parse(value: object, text: bool) -> str:
        if isinstance(value, str) and value.strip().lower() in choices:
            return value.strip().lower()
        raise Bad(f"use one of {', '.join(choices)}")

    return parse


def parse_devices(value: object, text: bool) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else value
    what = "must be a list of GPU indices or UUIDs, e.g. [0, GPU-8c1...]"
    if not isinstance(items, list | tuple) or not items:
        raise Bad(what)
    # YAML reads an unquoted index as an int; a UUID arrives as a string.
    out = tuple(
        str(i).strip() for i in items if isinstance(i, int | str) and not isinstance(i, bool)
    )
    if len(out) != len(items) or not all(out) or any(d.startswith("-") for d in out):
        raise Bad(what)
    return out


def parse_checked(check: Callable[[str], object]) -> Parser:
    """A string the capacity code must accept, judged by that code's own parser."""

    def parse(value: object, text: bool) -> str:
        try:
            check(s := parse_str(value, text))
        except InputError as e:
            raise Bad(e.problem) from None
        return s

    return parse


def show_duration(seconds: float) -> str:
    ms = round(seconds * 1000)
    if ms % 1000:
        return f"{ms}ms" if ms < 1000 else f"{seconds:g}s"
    out, rest = "", ms // 1000
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        if rest >= size:
            out, rest = out + f"{rest // size}{unit}", rest % size
    return out


def show_size(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def show(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return ",".join(value) if isinstance(value, tuple) else str(value)


@dataclass(frozen=True)
class Spec(Generic[T]):
    """One setting. ``attr`` names its ``Config`` field (dotted for deployment fields); a
    source's own setting has none and lands in ``Config.settings`` under its key, read back
    typed with ``Config.get(spec)``, which gives ``default`` when it was not set."""

    key: str  # dotted, as in the YAML file
    attr: str | None
    parse: Callable[[object, bool], T]
    show: Callable[[Any], str] = show
    flag_name: str | None = None  # when the flag is not the key spelt with dashes
    help: str = ""  # one line for --help and the generated configuration table
    default: Any = None  # a source's setting's default (a Config field has its own)

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.key.upper().replace(".", "_")

    @property
    def flag(self) -> str:
        return self.flag_name or "--" + self.key.replace("_", "-")
