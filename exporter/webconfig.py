"""The web configuration file of Prometheus's exporter-toolkit (``--web.config.file``).

The same YAML the official exporters read — ``tls_server_config``, ``http_server_config``,
``basic_auth_users`` (bcrypt hashes) and ``rate_limit`` — so one file, one Secret, serves
node-exporter, DCGM's exporter and this sidecar alike. It is read and checked whole at
start-up: every problem is one line naming the file, the key and the value (never the value
of a password hash), and the sidecar exits 2. Differences from exporter-toolkit, each
forced by Python's TLS or aiohttp and each said where it applies:

- the file is read once, at start: restart the sidecar to pick up a new certificate;
- ``client_auth_type`` ``RequestClientCert`` and ``RequireAnyClientCert`` (ask for a client
  certificate but do not verify it) cannot be had from Python's ``ssl``: they are rejected;
- ``curve_preferences`` sets the one ECDH curve OpenSSL offers (the first listed);
- ``cipher_suites`` applies to TLS 1.2 and below, as in Go; TLS 1.3 suites are fixed;
- ``http_server_config.http2`` is accepted and has no effect (aiohttp serves HTTP/1.1).
"""

from __future__ import annotations

import contextlib
import os
import re
import ssl
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from exporter.errors import InputError

_TOP = ("tls_server_config", "http_server_config", "basic_auth_users", "rate_limit")
_TLS_KEYS = (
    "cert",
    "key",
    "client_ca",
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "client_allowed_sans",
    "min_version",
    "max_version",
    "cipher_suites",
    "prefer_server_cipher_suites",
    "curve_preferences",
)
_HTTP_KEYS = ("http2", "headers")
_RATE_KEYS = ("interval", "burst")
# exporter-toolkit's list: any other header is refused there too.
_HEADERS = (
    "Content-Security-Policy",
    "X-Frame-Options",
    "X-Content-Type-Options",
    "X-XSS-Protection",
    "Strict-Transport-Security",
)
_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_UNVERIFIED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert")
_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# Go's crypto/tls names → OpenSSL's, for the suites Go's tls.CipherSuites() lists.
_CIPHERS = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
}
_TLS13_SUITES = ("TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256")
_CURVES = {"CurveP256": "prime256v1", "CurveP384": "secp384r1", "CurveP521": "secp521r1"}
_CURVES["X25519"] = "X25519"
# $2a$, $2b$, $2x$ or $2y$ (htpasswd writes 2y), a two-digit cost, 22 + 31 characters.
_BCRYPT = re.compile(r"\$2[abxy]\$\d\d\$[./A-Za-z0-9]{53}")
_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)(h|ms|m|s|us|µs|ns))+")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s|us|µs|ns)")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


class WebConfigError(Exception):
    def __init__(self, problems: list[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(problems))


@dataclass(frozen=True)
class TlsServerConfig:
    cert_file: str | None = None
    key_file: str | None = None
    cert: str | None = field(default=None, repr=False)
    key: str | None = field(default=None, repr=False)
    client_ca_file: str | None = None
    client_ca: str | None = field(default=None, repr=False)
    client_auth_type: str = "NoClientCert"
    client_allowed_sans: tuple[str, ...] = ()
    min_version: str = "TLS12"
    max_version: str = "TLS13"
    cipher_suites: tuple[str, ...] = ()
    prefer_server_cipher_suites: bool = True
    curve_preferences: tuple[str, ...] = ()


@dataclass(frozen=True)
class RateLimit:
    interval_seconds: float  # one request per interval on average
    burst: int  # and up to this many at once


@dataclass(frozen=True)
class WebConfig:
    path: str
    tls: TlsServerConfig | None = None
    # user → bcrypt hash; never in a repr, a log line or an error message
    users: Mapping[str, bytes] = field(
        default_factory=lambda: MappingProxyType({}), repr=False, hash=False
    )
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    rate_limit: RateLimit | None = None


class _Problems:
    def __init__(self, path: str) -> None:
        self.path = path
        self.lines: list[str] = []

    def add(self, key: str, value: object, what: str) -> None:
        self.lines.append(str(InputError(self.path, key, value, what)))


def _section(
    doc: Mapping[Any, Any], name: str, keys: tuple[str, ...], problems: _Problems
) -> dict[str, Any]:
    body = doc.get(name)
    if body is None:
        return {}
    if not isinstance(body, dict):
        problems.add(name, _shown(body), f"must be a mapping of {', '.join(keys)}")
        return {}
    out = {}
    for key, value in body.items():
        if key not in keys:
            problems.add(f"{name}.{key}", None, f"unknown key; valid: {', '.join(keys)}")
        elif value is not None:
            out[key] = value
    return out


def _shown(value: object) -> object:
    text = repr(value)
    return value if len(text) <= 80 else text[:77] + "..."


def _string(sec: dict[str, Any], name: str, key: str, problems: _Problems) -> str | None:
    value = sec.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        shown = None if key in ("key", "cert", "client_ca") else _shown(value)
        problems.add(f"{name}.{key}", shown, "must be a non-empty string")
        return None
    return value


def _strings(sec: dict[str, Any], name: str, key: str, problems: _Problems) -> tuple[str, ...]:
    value = sec.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        problems.add(f"{name}.{key}", _shown(value), "must be a list of strings")
        return ()
    return tuple(value)


def _go_duration(text: object) -> float | None:
    """Seconds in a Go duration (``1s``, ``100ms``, ``1m30s``, ``0``), or None."""
    if isinstance(text, int | float) and not isinstance(text, bool) and text == 0:
        return 0.0
    if not isinstance(text, str):
        return None
    text = text.strip()
    if text == "0":
        return 0.0
    if not _DURATION.fullmatch(text):
        return None
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART.findall(text))


def _beside(config_path: str, file: str | None) -> str | None:
    """A relative path is relative to the web config file's folder, as in exporter-toolkit."""
    if file is None or os.path.isabs(file):
        return file
    return os.path.join(os.path.dirname(config_path), file)


def _tls(sec: dict[str, Any], problems: _Problems) -> TlsServerConfig:
    name = "tls_server_config"
    s = {k: _string(sec, name, k, problems) for k in _TLS_KEYS[:7]}
    for key in ("min_version", "max_version"):
        s[key] = _string(sec, name, key, problems)
    for inline, file in (
        ("cert", "cert_file"),
        ("key", "key_file"),
        ("client_ca", "client_ca_file"),
    ):
        if s[inline] is not None and s[file] is not None:
            problems.add(f"{name}.{inline}", None, f"give either {inline} or {file}, not both")
    for inline, file in (("cert", "cert_file"), ("key", "key_file")):
        if s[inline] is None and s[file] is None:
            problems.add(f"{name}.{file}", None, f"is required (or {inline}, the PEM inline)")
    auth = s["client_auth_type"] or "NoClientCert"
    has_ca = s["client_ca"] is not None or s["client_ca_file"] is not None
    if auth in _UNVERIFIED_CLIENT_AUTH:
        problems.add(
            f"{name}.client_auth_type",
            auth,
            "not supported here: Python's TLS verifies every client certificate it asks for; "
            "use VerifyClientCertIfGiven or RequireAndVerifyClientCert with client_ca_file",
        )
    elif auth not in _CLIENT_AUTH:
        valid = ", ".join([*_CLIENT_AUTH, *_UNVERIFIED_CLIENT_AUTH])
        problems.add(f"{name}.client_auth_type", auth, f"use one of {valid}")
    elif auth != "NoClientCert" and not has_ca:
        problems.add(f"{name}.client_ca_file", None, f"is required with client_auth_type {auth}")
    elif auth == "NoClientCert" and has_ca:
        problems.add(
            f"{name}.client_auth_type",
            auth,
            "client_ca_file is set but no client certificate is asked for; "
            "set client_auth_type: RequireAndVerifyClientCert",
        )
    sans = _strings(sec, name, "client_allowed_sans", problems)
    if sans and auth != "RequireAndVerifyClientCert":
        problems.add(
            f"{name}.client_allowed_sans",
            None,
            "needs client_auth_type: RequireAndVerifyClientCert (else there may be no SAN)",
        )
    for key in ("min_version", "max_version"):
        if s[key] is not None and s[key] not in _VERSIONS:
            problems.add(f"{name}.{key}", s[key], f"use one of {', '.join(_VERSIONS)}")
    ciphers = _strings(sec, name, "cipher_suites", problems)
    for c in ciphers:
        if c not in _CIPHERS and c not in _TLS13_SUITES:
            problems.add(f"{name}.cipher_suites", c, "not a cipher suite Go's crypto/tls offers")
    curves = _strings(sec, name, "curve_preferences", problems)
    for c in curves:
        if c not in _CURVES:
            problems.add(f"{name}.curve_preferences", c, f"use one of {', '.join(_CURVES)}")
    prefer = sec.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer, bool):
        problems.add(f"{name}.prefer_server_cipher_suites", _shown(prefer), "must be true or false")
        prefer = True
    for key in ("cert_file", "key_file", "client_ca_file"):
        s[key] = _beside(problems.path, s[key])
    return TlsServerConfig(
        cert_file=s["cert_file"],
        key_file=s["key_file"],
        cert=s["cert"],
        key=s["key"],
        client_ca_file=s["client_ca_file"],
        client_ca=s["client_ca"],
        client_auth_type=auth,
        client_allowed_sans=sans,
        min_version=s["min_version"] or "TLS12",
        max_version=s["max_version"] or "TLS13",
        cipher_suites=ciphers,
        prefer_server_cipher_suites=prefer,
        curve_preferences=curves,
    )


def _users(doc: Mapping[Any, Any], problems: _Problems) -> dict[str, bytes]:
    body = doc.get("basic_auth_users")
    if body is None:
        return {}
    if not isinstance(body, dict):
        problems.add("basic_auth_users", None, "must be a mapping of user name to bcrypt hash")
        return {}
    users = {}
    for user, hashed in body.items():
        if not isinstance(user, str) or not user or ":" in user:
            problems.add(f"basic_auth_users.{user!r}", None, "a user name is a string without ':'")
        elif not isinstance(hashed, str) or not _BCRYPT.fullmatch(hashed.strip()):
            # The value is not shown: a plain password put here by mistake stays out of logs.
            problems.add(
                f"basic_auth_users.{user}",
                None,
                "not a bcrypt hash (like $2y$10$ and 53 more characters; make one with "
                "htpasswd -nBC 10 \"\" | tr -d ':\\n'); the value is not shown",
            )
        else:
            users[user] = hashed.strip().encode()
    return users


def _headers(sec: dict[str, Any], problems: _Problems) -> dict[str, str]:
    body = sec.get("headers")
    if body is None:
        return {}
    if not isinstance(body, dict):
        problems.add("http_server_config.headers", _shown(body), "must be a mapping")
        return {}
    out = {}
    for header, value in body.items():
        if header not in _HEADERS:
            problems.add(
                f"http_server_config.headers.{header}",
                None,
                f"this header cannot be set; valid: {', '.join(_HEADERS)}",
            )
        elif not isinstance(value, str) or "\n" in value or "\r" in value:
            problems.add(f"http_server_config.headers.{header}", _shown(value), "one line of text")
        elif value:
            out[header] = value
    return out


def _rate_limit(doc: Mapping[Any, Any], problems: _Problems) -> RateLimit | None:
    sec = _section(doc, "rate_limit", _RATE_KEYS, problems)
    if not sec:
        return None
    interval = _go_duration(sec.get("interval", "0"))
    burst = sec.get("burst", 0)
    if interval is None:
        problems.add("rate_limit.interval", _shown(sec.get("interval")), "a duration like 1s")
        return None
    if isinstance(burst, bool) or not isinstance(burst, int) or burst < 0:
        problems.add("rate_limit.burst", _shown(burst), "must be a whole number, 0 or more")
        return None
    if interval == 0:
        return None  # exporter-toolkit: an interval of 0 turns the limiter off
    return RateLimit(interval, max(1, burst))


def parse_web_config(path: str, text: str) -> WebConfig:
    """The file's settings; raises WebConfigError listing every problem."""
    problems = _Problems(path)
    try:
        doc = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise WebConfigError([f"{path}: {at}invalid YAML: {e.problem or e.context}"]) from None
    except yaml.YAMLError as e:
        raise WebConfigError([f"{path}: invalid YAML: {e}"]) from None
    if doc is None:
        return WebConfig(path)
    if not isinstance(doc, dict):
        raise WebConfigError([f"{path}: the top level must be a mapping of {', '.join(_TOP)}"])
    for key in doc:
        if key not in _TOP:
            problems.add(str(key), None, f"unknown key; valid: {', '.join(_TOP)}")
    tls_sec = _section(doc, "tls_server_config", _TLS_KEYS, problems)
    tls = _tls(tls_sec, problems) if "tls_server_config" in doc else None
    http = _section(doc, "http_server_config", _HTTP_KEYS, problems)
    if "http2" in http and not isinstance(http["http2"], bool):
        problems.add("http_server_config.http2", _shown(http["http2"]), "must be true or false")
    headers = _headers(http, problems)
    users = _users(doc, problems)
    rate = _rate_limit(doc, problems)
    if problems.lines:
        raise WebConfigError(problems.lines)
    config = WebConfig(
        path,
        tls,
        MappingProxyType(users),
        MappingProxyType(headers),
        rate,
    )
    if tls is not None:
        ssl_context(config)  # a certificate that does not load is a start-up error too
    return config


def load_web_config(
    path: str,
    named_by: str,
    key: str,
    read_text: Callable[[str], str] = lambda p: Path(p).read_text(encoding="utf-8"),
) -> WebConfig:
    """Read and check the file ``named_by`` (a flag, env or config file) gives as ``key``."""
    try:
        text = read_text(path)
    except UnicodeDecodeError:
        why = "not UTF-8 text"
    except FileNotFoundError:
        why = "no such file"
    except IsADirectoryError:
        why = "is a directory, not a file"
    except PermissionError:
        why = "permission denied; make it readable by the sidecar's user"
    except OSError as e:
        why = f"cannot read it: {e.strerror or e}"
    else:
        return parse_web_config(path, text)
    raise WebConfigError([str(InputError(named_by, key, path, why))])


def _tls_file_problem(path: str, key: str, file: str, e: Exception) -> WebConfigError:
    if isinstance(e, FileNotFoundError):
        why = "no such file"
    elif isinstance(e, PermissionError):
        why = "permission denied; make it readable by the sidecar's user"
    elif isinstance(e, IsADirectoryError):
        why = "is a directory, not a file"
    elif "KEY_VALUES_MISMATCH" in str(e):
        why = "the key does not belong to the certificate"
    elif isinstance(e, ssl.SSLError):
        why = f"not a PEM file OpenSSL can load ({e.reason or e})"
    else:
        why = f"cannot be loaded: {e}"
    return WebConfigError([str(InputError(path, f"tls_server_config.{key}", file, why))])


def ssl_context(config: WebConfig) -> ssl.SSLContext:
    """The server-side TLS context the file describes; raises WebConfigError."""
    tls = config.tls
    assert tls is not None
    path = config.path
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = _VERSIONS[tls.min_version]
    ctx.maximum_version = _VERSIONS[tls.max_version]
    with contextlib.ExitStack() as stack:
        cert_file, key_file = tls.cert_file, tls.key_file
        if tls.cert is not None:
            cert_file = stack.enter_context(_pem_in_memory("cert", tls.cert))
        if tls.key is not None:
            key_file = stack.enter_context(_pem_in_memory("key", tls.key))
        assert cert_file is not None
        assert key_file is not None
        named = {
            "cert_file": tls.cert_file or "(inline cert)",
            "key_file": tls.key_file or "(inline key)",
        }
        for key, file in (("cert_file", cert_file), ("key_file", key_file)):
            try:
                Path(file).read_bytes()
            except OSError as e:
                raise _tls_file_problem(path, key, named[key], e) from None
        try:
            ctx.load_cert_chain(cert_file, key_file)
        except (OSError, ssl.SSLError) as e:
            # OpenSSL says "PEM lib" for either file: the certificate alone tells which.
            blamed = "key_file" if _loads_as_certificate(cert_file) else "cert_file"
            raise _tls_file_problem(path, blamed, named[blamed], e) from None
    ctx.verify_mode = _CLIENT_AUTH[tls.client_auth_type]
    if tls.client_ca_file is not None or tls.client_ca is not None:
        try:
            ctx.load_verify_locations(cafile=tls.client_ca_file, cadata=tls.client_ca)
        except (OSError, ssl.SSLError) as e:
            raise _tls_file_problem(
                path, "client_ca_file", tls.client_ca_file or "(inline client_ca)", e
            ) from None
    ciphers = [_CIPHERS[c] for c in tls.cipher_suites if c in _CIPHERS]
    if ciphers:
        ctx.set_ciphers(":".join(ciphers))
    if tls.prefer_server_cipher_suites:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    if tls.curve_preferences:
        ctx.set_ecdh_curve(_CURVES[tls.curve_preferences[0]])
    return ctx


def _loads_as_certificate(file: str) -> bool:
    try:
        ssl.create_default_context(cafile=file)
    except (OSError, ssl.SSLError, ValueError):
        return False
    return True


@contextlib.contextmanager
def _pem_in_memory(name: str, text: str) -> Iterator[str]:
    """A path OpenSSL can read inline PEM from, for as long as the context lasts.

    ``ssl`` loads a certificate chain from files only. The pod's root filesystem is
    read-only and a private key has no business on a disk: on Linux the PEM lives in an
    anonymous memory file, reached through ``/proc/self/fd``; elsewhere in a private
    temporary directory, removed as soon as it is read.
    """
    data = text.encode("utf-8")
    if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
        fd = os.memfd_create(f"kv-headroom-{name}", os.MFD_CLOEXEC)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="kv-headroom-tls-") as folder:
        file = os.path.join(folder, f"{name}.pem")
        handle = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(handle, "wb") as f:
            f.write(data)
        yield file


def allowed_san(peercert: Mapping[str, Any] | None, allowed: tuple[str, ...]) -> bool:
    """Does the verified client certificate carry one of the allowed SANs (DNS, IP, email,
    URI), as exporter-toolkit's ``client_allowed_sans`` demands?"""
    if not allowed:
        return True
    if not peercert:
        return False
    names = {value for _kind, value in peercert.get("subjectAltName", ())}
    return any(name in names for name in allowed)
