"""The HTTP face: ``/metrics``, ``/healthz``, ``/readyz`` and a status page at ``/``.

It only serves what the poll loop computed: ``/metrics`` returns the bytes of the latest
snapshot, rendered and gzipped (when asked) once per snapshot by the first scrape that
wants them, so concurrent scrapes cost a lookup and always agree with each other.

With a web config file (``--web.config.file``) it asks for basic auth on every path but
the two probes, ``/healthz`` and ``/readyz``: they answer a fixed word and nothing about the
server, and a kubelet's HTTP probe cannot carry a password (exporter-toolkit protects those
too; its exporters have no such probes). Requests are small and few by design: bodies are
capped at 1 KiB, a request line and each header at 4 KiB, 64 headers, and an idle
connection is closed after two minutes.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import gzip
import hashlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import bcrypt
from aiohttp import web
from aiohttp.typedefs import Middleware

from exporter.config import Config
from exporter.poller import Poller, PollerDeps
from exporter.sources.vllm import VllmClient, client_session
from exporter.status import status_page
from exporter.webconfig import RateLimit, WebConfig, allowed_san

# aiohttp's request handler limits, passed where the runner is made (serve, tests).
HANDLER_LIMITS: dict[str, Any] = {
    "max_line_size": 4096,
    "max_field_size": 4096,
    "max_headers": 64,
    "keepalive_timeout": 120.0,
}
MAX_BODY_BYTES = 1024  # every endpoint is a GET
UNAUTH_PATHS = frozenset({"/healthz", "/readyz"})
REALM = 'Basic realm="kv-headroom", charset="UTF-8"'
# Every answer: nothing here is meant to be sniffed, framed or cached by a browser.
BASE_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "deny",
    "Cache-Control": "no-store",
}
# The status page has inline styles and nothing else: no scripts, frames or fetches.
# img-src data: for the history chart, an SVG the page carries in itself (no script runs in
# an image); nothing is ever fetched from elsewhere.
STATUS_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'none'"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

POLLER = web.AppKey("poller", Poller)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _Gzip:
    """The gzip of the latest rendering, made at most once per snapshot."""

    def __init__(self) -> None:
        self._source: bytes | None = None
        self._body = b""

    def of(self, body: bytes) -> bytes:
        if body is not self._source:
            self._body = gzip.compress(body, compresslevel=5)
            self._source = body
        return self._body


GZIP = web.AppKey("gzip", _Gzip)


async def metrics(request: web.Request) -> web.Response:
    poller = request.app[POLLER]
    body = poller.rendered
    if "gzip" in request.headers.get("Accept-Encoding", ""):
        return web.Response(
            body=request.app[GZIP].of(body),
            headers={"Content-Type": CONTENT_TYPE, "Content-Encoding": "gzip"},
        )
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def healthz(request: web.Request) -> web.Response:
    """Alive while the poll loop keeps polling (a stuck loop fails the liveness probe)."""
    if request.app[POLLER].alive():
        return web.Response(text="ok\n")
    return web.Response(status=503, text="poll loop stalled\n")


async def readyz(request: web.Request) -> web.Response:
    """Ready once vLLM has answered once: before that there is nothing true to serve."""
    if request.app[POLLER].snapshot.vllm_ready:
        return web.Response(text="ready\n")
    return web.Response(status=503, text="waiting for vLLM to answer /metrics\n")


async def index(request: web.Request) -> web.Response:
    poller = request.app[POLLER]
    html = status_page(poller.snapshot, poller.config, poller.trail)
    resp = web.Response(text=html, content_type="text/html", charset="utf-8")
    resp.headers["Content-Security-Policy"] = STATUS_CSP
    return resp


class _Passwords:
    """bcrypt checks, off the event loop, remembered once right.

    bcrypt costs ~70 ms at cost 10, on purpose: a scrape every 15 s would spend that each
    time and hold up the poll loop. A right (user, password) is remembered by a salted
    digest for ``REMEMBER_SECONDS``, as exporter-toolkit caches it; an unknown user is
    checked against a dummy hash so that timing does not tell which users exist. At most
    two checks run at once: a flood of wrong passwords queues, it does not take every core.
    """

    REMEMBER_SECONDS = 300.0
    REMEMBER_MAX = 64

    def __init__(self, users: dict[str, bytes]) -> None:
        self._users = users
        self._dummy = bcrypt.hashpw(b"not a password", bcrypt.gensalt(10))
        self._salt = bcrypt.gensalt()  # per process, only to key the memo
        self._ok: OrderedDict[bytes, float] = OrderedDict()
        self._slots = asyncio.Semaphore(2)

    async def check(self, user: str, password: str) -> bool:
        hashed = self._users.get(user)
        memo = hashlib.sha256(
            self._salt + user.encode() + b"\0" + password.encode() + b"\0" + (hashed or b"")
        ).digest()
        remembered = self._ok.get(memo)
        if remembered is not None and time.monotonic() - remembered < self.REMEMBER_SECONDS:
            return hashed is not None
        async with self._slots:
            ok = await asyncio.to_thread(_checkpw, password.encode(), hashed or self._dummy)
        if ok and hashed is not None:
            self._ok[memo] = time.monotonic()
            while len(self._ok) > self.REMEMBER_MAX:
                self._ok.popitem(last=False)
            return True
        return False


def _checkpw(password: bytes, hashed: bytes) -> bool:
    try:
        return bcrypt.checkpw(password, hashed)
    except ValueError:  # a hash bcrypt cannot read: the file was checked, but never trust
        return False


def _credentials(header: str) -> tuple[str, str] | None:
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, colon, password = decoded.partition(":")
    return (user, password) if colon else None


class _Bucket:
    """exporter-toolkit's rate_limit: a token bucket over every request."""

    def __init__(self, limit: RateLimit) -> None:
        self._rate = 1.0 / limit.interval_seconds
        self._burst = float(limit.burst)
        self._tokens = self._burst
        self._at = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


def _guard(web_config: WebConfig | None) -> Middleware:
    """The middleware: rate limit, client certificate SANs, basic auth, response headers."""
    users = dict(web_config.users) if web_config is not None else {}
    passwords = _Passwords(users) if users else None
    bucket = _Bucket(web_config.rate_limit) if web_config and web_config.rate_limit else None
    sans = web_config.tls.client_allowed_sans if web_config and web_config.tls else ()
    extra = dict(web_config.headers) if web_config is not None else {}

    def finish(resp: web.StreamResponse) -> web.StreamResponse:
        for name, value in (*BASE_HEADERS.items(), *extra.items()):
            resp.headers.setdefault(name, value)
        return resp

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if bucket is not None and not bucket.take():
            return finish(web.Response(status=429, text="too many requests\n"))
        transport = request.transport
        if sans and not allowed_san(
            transport.get_extra_info("peercert") if transport is not None else None, sans
        ):
            return finish(web.Response(status=403, text="client certificate not allowed\n"))
        if passwords is not None and request.path not in UNAUTH_PATHS:
            given = _credentials(request.headers.get("Authorization", ""))
            if given is None or not await passwords.check(*given):
                denied = web.Response(status=401, text="unauthorized\n")
                denied.headers["WWW-Authenticate"] = REALM
                return finish(denied)
        try:
            return finish(await handler(request))
        except web.HTTPException as e:  # 404, 405: the same headers on errors too
            return finish(e)

    return guard


def create_app(
    config: Config, deps: PollerDeps | None = None, *, poll: bool = True
) -> web.Application:
    """The application, with the poll loop tied to its lifetime.

    ``poll=False`` makes the poller without starting its loop: the caller polls
    (``app[POLLER].poll_once()``), as the fault tests and the soak benchmark do.
    """
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_guard(config.web_config)])
    app[GZIP] = _Gzip()

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        async with client_session() as session:
            client = VllmClient(
                session,
                config.vllm_url,
                timeout_seconds=config.vllm_timeout_seconds,
                max_bytes=config.vllm_max_page_bytes,
            )
            poller = Poller(config, client, deps)
            app[POLLER] = poller
            stop = asyncio.Event()
            task = asyncio.create_task(poller.run(stop), name="poll-loop") if poll else None
            try:
                yield
            finally:
                stop.set()
                if task is not None:
                    # A poll in flight is abandoned, not awaited: vLLM may be the reason
                    # for the shutdown, and a stuck read must not delay it.
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                await poller.close()

    app.cleanup_ctx.append(lifecycle)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/", index)
    return app
