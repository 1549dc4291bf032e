"""TLS, basic auth and request limits from an exporter-toolkit web config file, on the real
``kv-headroom serve`` process (TLS on 127.0.0.1 with a certificate made for the test), and
the same middleware in-process for what needs no TLS."""

from __future__ import annotations

import base64
import contextlib
import http.client
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer

from exporter.config import Config
from exporter.server import create_app
from exporter.webconfig import parse_web_config, ssl_context
from tests.conftest import require
from tests.faults.conftest import ThreadedVllm
from tests.faults.test_process import check_config, events, listening, start, wait_until
from tests.sidecar.conftest import TINYLLAMA, fixture_page, unused_port

PASSWORD = "correct horse battery staple"
VLLM_SECRET = "vllm-scrape-secret"
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()


def make_certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1, valid for a day."""
    require(None if shutil.which("openssl") else "no openssl CLI")
    cert, key = folder / "server.crt", folder / "server.key"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec",
            "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(key), "-out", str(cert), "-days", "1",
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    return cert, key


@dataclass
class Served:
    port: int
    tls: ssl.SSLContext
    proc: subprocess.Popen[str]

    def get(self, path: str, headers: dict[str, str] | None = None) -> http.client.HTTPResponse:
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.tls, timeout=10)
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        resp.read()
        conn.close()
        return resp


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


@pytest.fixture(name="served", scope="module")
def _served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("tls")
    make_certificate(folder)
    web = folder / "web.yml"
    # Relative paths, as exporter-toolkit reads them: next to the web config file.
    web.write_text(
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
        f"basic_auth_users:\n  alice: {HASH}\n"
    )
    vllm = ThreadedVllm(fixture_page("vllm-0.32-cpu-preempted.txt"))
    port = unused_port()
    url = vllm.fake.url.replace("http://", f"http://scraper:{VLLM_SECRET}@")
    proc = start(
        "--web.listen-address", f"127.0.0.1:{port}", "--web.config.file", str(web),
        "--vllm.url", url, "--no-nvml.enabled", "--log.format", "json",
        "--model.path", TINYLLAMA,
    )  # fmt: skip
    tls = ssl.create_default_context(cafile=str(folder / "server.crt"))
    try:
        wait_until(lambda: listening(port), "the TLS port open", proc)
        yield Served(port, tls, proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
        vllm.close()


def test_no_credentials_is_401_with_a_basic_challenge(served: Served) -> None:
    resp = served.get("/metrics")
    assert resp.status == 401
    assert resp.getheader("WWW-Authenticate", "").startswith('Basic realm="kv-headroom"')


def test_wrong_password_is_401(served: Served) -> None:
    assert served.get("/metrics", basic("alice", "wrong")).status == 401


def test_unknown_user_is_401(served: Served) -> None:
    assert served.get("/metrics", basic("mallory", PASSWORD)).status == 401


def test_right_password_over_tls_is_200(served: Served) -> None:
    assert served.get("/metrics", basic("alice", PASSWORD)).status == 200


def test_status_page_needs_the_password_too(served: Served) -> None:
    assert served.get("/").status == 401


def test_probes_answer_without_a_password(served: Served) -> None:
    # Kubelet probes cannot carry a password; they say only "ok" / "ready".
    assert served.get("/healthz").status == 200


def test_plain_http_on_the_tls_port_gets_no_answer(served: Served) -> None:
    def plain_get() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=10)
        try:
            conn.request("GET", "/healthz")
            conn.getresponse()
        finally:
            conn.close()

    with pytest.raises((OSError, http.client.HTTPException)):
        plain_get()


def test_an_oversized_header_is_refused(served: Served) -> None:
    resp = served.get("/healthz", {"X-Padding": "x" * 8000})
    assert resp.status in (400, 431)


def test_too_many_headers_are_refused(served: Served) -> None:
    resp = served.get("/healthz", {f"X-H{i}": "1" for i in range(100)})
    assert resp.status in (400, 431)


def test_no_secret_reaches_the_logs_or_the_status_page(tmp_path: Path) -> None:
    make_certificate(tmp_path)
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  alice: {HASH}\n")
    vllm = ThreadedVllm(fixture_page("vllm-0.32-cpu-preempted.txt"))
    port = unused_port()
    url = f"http://scraper:{VLLM_SECRET}@127.0.0.1:{unused_port()}"  # refused: errors logged
    proc = start(
        "--web.listen-address", f"127.0.0.1:{port}", "--web.config.file", str(web),
        "--vllm.url", url, "--no-nvml.enabled", "--log.format", "json",
        "--poll.interval", "500ms", "--vllm.timeout", "200ms",
    )  # fmt: skip
    try:
        wait_until(lambda: listening(port), "the port open", proc)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/", headers=basic("alice", PASSWORD))
        page = conn.getresponse().read().decode()
        conn.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
        vllm.close()
    assert any(e["event"] == "source_down" for e in events(out))
    for secret in (PASSWORD, HASH, VLLM_SECRET):
        assert secret not in out + err
        assert secret not in page


BAD_WEB_CONFIGS = {
    "bad_hash": (
        "basic_auth_users:\n  alice: hunter2\n",
        ["basic_auth_users.alice", "not a bcrypt hash"],
    ),
    "missing_cert": (
        "tls_server_config:\n  cert_file: /nonexistent/server.crt\n  key_file: /nonexistent/k\n",
        ["tls_server_config.cert_file = '/nonexistent/server.crt'", "no such file"],
    ),
    "unknown_key": ("basic_auth_user:\n  alice: x\n", ["basic_auth_user: unknown key"]),
    "unverified_client_cert": (
        "tls_server_config:\n  cert_file: a\n  key_file: b\n"
        "  client_auth_type: RequireAnyClientCert\n",
        ["client_auth_type = 'RequireAnyClientCert'", "not supported"],
    ),
    "not_a_mapping": ("- tls_server_config\n", ["the top level must be a mapping"]),
}


@pytest.mark.parametrize("case", BAD_WEB_CONFIGS)
def test_invalid_web_config_exits_2_naming_file_and_key(tmp_path: Path, case: str) -> None:
    content, expected = BAD_WEB_CONFIGS[case]
    web = tmp_path / "web.yml"
    web.write_text(content)
    proc = check_config("--web.config.file", str(web))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert str(web) in proc.stderr
    for fragment in expected:
        assert fragment in proc.stderr
    assert "hunter2" not in proc.stderr  # a password put where a hash belongs is not echoed


def test_missing_web_config_file_exits_2_naming_the_flag(tmp_path: Path) -> None:
    missing = tmp_path / "web.yml"
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "serve", "--web.config.file", str(missing)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert f"--web.config.file: web.config_file = '{missing}': no such file" in proc.stderr


async def app_client(web_yaml: str) -> TestClient:  # type: ignore[type-arg]
    config = Config(
        vllm_url=f"http://127.0.0.1:{unused_port()}",
        nvml_enabled=False,
        web_config=parse_web_config("/etc/web.yml", web_yaml),
    )
    client = TestClient(TestServer(create_app(config, poll=False), host="127.0.0.1"))
    await client.start_server()
    return client


async def test_rate_limit_answers_429_past_the_burst() -> None:
    client = await app_client("rate_limit:\n  interval: 1m\n  burst: 2\n")
    try:
        statuses = [(await client.get("/healthz")).status for _ in range(4)]
    finally:
        await client.close()
    assert statuses == [200, 200, 429, 429]


async def test_configured_response_headers_are_sent() -> None:
    client = await app_client(
        "http_server_config:\n  headers:\n    Strict-Transport-Security: max-age=31536000\n"
    )
    try:
        resp = await client.get("/metrics")
    finally:
        await client.close()
    assert resp.headers["Strict-Transport-Security"] == "max-age=31536000"


async def test_a_2y_hash_from_htpasswd_is_accepted() -> None:
    htpasswd_style = "$2y$" + HASH[4:]
    client = await app_client(f"basic_auth_users:\n  alice: '{htpasswd_style}'\n")
    try:
        resp = await client.get("/metrics", headers=basic("alice", PASSWORD))
    finally:
        await client.close()
    assert resp.status == 200


async def test_a_password_with_a_colon_is_read_whole() -> None:
    hashed = bcrypt.hashpw(b"a:b:c", bcrypt.gensalt(4)).decode()
    client = await app_client(f"basic_auth_users:\n  alice: '{hashed}'\n")
    try:
        resp = await client.get("/metrics", headers=basic("alice", "a:b:c"))
    finally:
        await client.close()
    assert resp.status == 200


def handshake(server: ssl.SSLContext, trusted: Path) -> dict[str, object]:
    """The certificate a client trusting ``trusted`` gets from ``server``, in memory."""
    client = ssl.create_default_context(cafile=str(trusted))
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    c = client.wrap_bio(c_in, c_out, server_hostname="127.0.0.1")
    s = server.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):  # TLS 1.3 needs two round trips; more means it is stuck
        for side in (c, s):
            with contextlib.suppress(ssl.SSLWantReadError):
                side.do_handshake()
        s_in.write(c_out.read())
        c_in.write(s_out.read())
    peer = c.getpeercert()
    assert peer, "the handshake did not complete"
    return dict(peer)


@pytest.mark.parametrize("inline", [False, True], ids=["files", "inline_pem"])
def test_tls_loads_without_a_writable_temporary_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inline: bool
) -> None:
    # The pod's root filesystem is read-only and has no /tmp: loading the certificate,
    # given as files or inline, must not need a temporary file.
    cert, key = make_certificate(tmp_path)
    if inline:
        tls = {"cert": cert.read_text(), "key": key.read_text()}
    else:
        tls = {"cert_file": str(cert), "key_file": str(key)}
    config = parse_web_config(str(tmp_path / "web.yml"), yaml.safe_dump({"tls_server_config": tls}))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-directory"))
    peer = handshake(ssl_context(config), trusted=cert)
    assert peer["subject"] == ((("commonName", "127.0.0.1"),),)
