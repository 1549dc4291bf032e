"""The vLLM server over HTTP: ``/metrics``, ``/v1/models`` and ``/version``, each bounded.

Every request has a total timeout (connecting, headers and body together) and every body a
size cap (``max_bytes`` for the page, ``MAX_JSON_BYTES`` for the two small JSON answers), so a
server that never answers, trickles a byte a second or sends 100 MB costs one poll, not the
sidecar. Bodies are asked for and read uncompressed (a gzip bomb cannot expand past the cap
inside the HTTP client) and redirects are not followed. Failures come back as
``SourceError`` with a stable ``kind`` for logs and metrics; messages never carry the
password of a ``user:password@`` URL.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from exporter.labels import cut_label
from exporter.log import get_logger
from exporter.sources.base import Outcome, Plugin, Readings, Slot, SourceContext, Stage
from exporter.sources.dialects import as_vllm
from exporter.sources.records import ModelCard, VllmApi
from exporter.sources.vllm_page import VllmPage, parse_page

# /v1/models and /version answer a few hundred bytes; a megabyte is generous.
MAX_JSON_BYTES = 1 << 20
MAX_MODEL_NAMES = 16
CARD_REFRESH_SECONDS = 60.0


def redact(url: str) -> str:
    """The URL with any password replaced, fit for logs and the status page."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


class SourceError(Exception):
    """A source could not be read. ``kind`` is stable (for logs); ``str`` is one line."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        super().__init__(message)


def client_session() -> aiohttp.ClientSession:
    """The HTTP session the sidecar reads vLLM with: a few kept-alive connections and no
    cookie jar (vLLM sets no cookies, and aiohttp's jar looks at every request and every
    response for them)."""
    connector = aiohttp.TCPConnector(limit=4, force_close=False)
    return aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar())


class VllmClient:
    """Reads one vLLM server. The session is injected so tests and the app share one."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        *,
        timeout_seconds: float,
        max_bytes: int,
    ) -> None:
        self._session = session
        self._base = base_url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._max_bytes = max_bytes

    async def _get(self, path: str, accept: str, max_bytes: int) -> bytes:
        url = f"{self._base}{path}"
        # Messages show redact(url), which parses the URL: built only when one is raised.
        try:
            async with self._session.get(
                url,
                timeout=self._timeout,
                headers={"Accept": accept, "Accept-Encoding": "identity"},
                auto_decompress=False,
                allow_redirects=False,
            ) as resp:
                if resp.status != 200:
                    raise SourceError("http_status", f"GET {redact(url)}: HTTP {resp.status}")
                encoding = resp.headers.get("Content-Encoding", "identity").strip().lower()
                if encoding not in ("", "identity"):
                    raise SourceError(
                        "encoding",
                        f"GET {redact(url)}: Content-Encoding {encoding[:40]!r} not asked for",
                    )
                declared = resp.content_length
                if declared is not None:
                    if declared > max_bytes:
                        raise SourceError(
                            "too_large",
                            f"GET {redact(url)}: {declared} bytes over the {max_bytes}-byte cap",
                        )
                    # The declared length bounds what is read: one read, no chunk loop.
                    return await resp.read()
                chunks: list[bytes] = []
                size = 0
                async for chunk in resp.content.iter_chunked(1 << 16):
                    size += len(chunk)
                    if size > max_bytes:
                        raise SourceError(
                            "too_large", f"GET {redact(url)}: body over the {max_bytes}-byte cap"
                        )
                    chunks.append(chunk)
                return b"".join(chunks)
        except SourceError:
            raise
        except TimeoutError:
            shown = redact(url)
            raise SourceError(
                "timeout", f"GET {shown}: no complete answer within {self._timeout.total:g}s"
            ) from None
        except aiohttp.ClientConnectorError as e:
            shown = redact(url)
            raise SourceError("refused", f"GET {shown}: cannot connect ({e.os_error})") from None
        except (
            aiohttp.ClientPayloadError,
            aiohttp.ServerDisconnectedError,
            ConnectionResetError,
        ) as e:
            shown = redact(url)
            raise SourceError("reset", f"GET {shown}: connection broke mid-answer ({e})") from None
        except aiohttp.ClientError as e:
            # aiohttp's messages can quote the URL it was given, password and all.
            shown = redact(url)
            text = _one_line(str(e).replace(url, shown))
            raise SourceError("error", f"GET {shown}: {type(e).__name__}: {text}") from None

    async def metrics(self) -> VllmPage:
        # Ask for the classic text format: Prometheus's own Accept header would get
        # OpenMetrics, whose counter and _created layout differs.
        body = await self._get("/metrics", "text/plain; version=0.0.4", self._max_bytes)
        return read_page(body)

    async def models(self) -> ModelCard:
        doc = await self._json("/v1/models")
        entries = doc.get("data") if isinstance(doc, dict) else None
        if not isinstance(entries, list) or not entries:
            raise SourceError("bad_json", "/v1/models: no data[] in the answer")
        listed = entries[:MAX_MODEL_NAMES]
        names = tuple(_short(e["id"]) for e in listed if isinstance(e, dict) and e.get("id"))
        first = entries[0] if isinstance(entries[0], dict) else {}
        length = first.get("max_model_len")
        root = first.get("root")
        valid = isinstance(length, int) and not isinstance(length, bool) and length > 0
        return ModelCard(
            names=names,
            max_model_len=length if valid else None,
            root=_short(root) if root else None,
        )

    async def version(self) -> str | None:
        doc = await self._json("/version")
        value = doc.get("version") if isinstance(doc, dict) else None
        return _short(value) if value else None

    async def _json(self, path: str) -> Any:
        body = await self._get(path, "application/json", min(self._max_bytes, MAX_JSON_BYTES))
        try:
            return json.loads(body)
        # RecursionError: ``[[[[…`` nested deeper than the interpreter's stack.
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise SourceError("bad_json", f"{path}: not JSON") from None


def read_page(body: bytes) -> VllmPage:
    """The body of ``/metrics`` as a page, or SourceError saying why it cannot be used."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SourceError("decode", f"/metrics is not UTF-8 (byte {e.start})") from None
    page = parse_page(text)
    parsed: str | None = None  # the rewritten text, for a dialect's page
    if not page.engines:
        # Ray Serve LLM's or NVIDIA NIM's page: vLLM's series under other names.
        other = as_vllm(text)
        if other is not None:
            page = replace(parse_page(other[1]), dialect=other[0])
            parsed = other[1]
    if not page.engines:
        raise SourceError("no_vllm_metrics", "/metrics answered but holds no vllm: series")
    problem = incomplete(page, text, parsed=parsed)
    if problem:
        raise SourceError("incomplete", f"/metrics: {problem}")
    lacking = missing(page)
    return replace(page, missing=lacking) if lacking else page


def _short(value: object) -> str:
    return cut_label(str(value))


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300]


# A sample of the running gauge (not its HELP or TYPE line), for telling an absent series
# from an unreadable one.
_RUNNING_SAMPLE = re.compile(r"^vllm:num_requests_running[{\s]", re.MULTILINE)


def incomplete(page: VllmPage, text: str, *, parsed: str | None = None) -> str | None:
    """Why a page cannot be trusted whole, or None.

    The exposition format ends every line with a newline, so a missing one means the body
    was cut; every release exposes, per engine, KV usage; a running-requests gauge that is
    on the page must be readable for every engine (NaN, -3, -Inf there are a broken page);
    and a ``cache_config_info`` that is there must hold sizes the sidecar can divide by.
    A series that is absent altogether (an older or trimmed exporter: ``cache_config_info``,
    ``num_requests_running``) is not a reason to distrust the rest: ``missing`` names it and
    the page is used for what it has. ``parsed`` is the text the page was parsed from when
    it is not ``text`` (a dialect's page rewritten into vLLM's names).
    """
    if not text.endswith("\n"):
        return "the page ends mid-line (truncated)"
    running_on_page: bool | None = None  # searched for only when an engine lacks it
    for e in page.engines:
        if e.kv_usage is None:
            return f"engine {e.engine} lacks the KV usage gauge"
        if e.running is None:
            if running_on_page is None:
                running_on_page = _RUNNING_SAMPLE.search(parsed or text) is not None
            if running_on_page:
                return f"engine {e.engine} lacks a usable num_requests_running"
        cc = e.cache_config
        if not cc or "block_size" not in cc:
            continue
        if cc.block_size is None or cc.block_size < 1:
            return f"engine {e.engine}: cache_config_info block_size={cc['block_size'][:40]!r}"
        blocks = cc.get("num_gpu_blocks", "None")
        if blocks != "None" and (cc.num_gpu_blocks is None or cc.num_gpu_blocks < 1):
            return f"engine {e.engine}: cache_config_info num_gpu_blocks={blocks[:40]!r}"
    return None


def missing(page: VllmPage) -> tuple[str, ...]:
    """What the sidecar reads that this page lacks: ``cache_config_info`` (or its
    ``block_size`` label) on any engine means no observed capacity for that engine;
    ``num_requests_running`` (releases and exporters without it) means no running count."""
    lacking: list[str] = []
    if any(not e.cache_config or "block_size" not in e.cache_config for e in page.engines):
        lacking.append("cache_config_info")
    if any(e.running is None for e in page.engines):
        lacking.append("num_requests_running")
    return tuple(lacking)


async def gather_vllm(
    client: VllmApi, *, want_card: bool
) -> tuple[VllmPage, ModelCard | None, str | None]:
    """``/metrics`` (required) and, when asked, ``/v1/models`` and ``/version`` (optional)."""
    if not want_card:
        return await client.metrics(), None, None
    page_r, card_r, version_r = await asyncio.gather(
        client.metrics(), client.models(), client.version(), return_exceptions=True
    )
    if isinstance(page_r, BaseException):
        raise page_r
    card = card_r if isinstance(card_r, ModelCard) else None
    version = version_r if isinstance(version_r, str) else None
    for r in (card_r, version_r):
        if isinstance(r, BaseException) and not isinstance(r, SourceError):
            raise r
    return page_r, card, version


# What this source reads, for the poller and the snapshot.
PAGE: Slot[VllmPage] = Slot("page")  # this poll's page; None when vLLM did not answer
CARD: Slot[ModelCard] = Slot("card")  # /v1/models, refreshed every minute and on a restart
VERSION: Slot[str] = Slot("version")  # /version


class VllmSource:
    """``/metrics`` every poll; ``/v1/models`` and ``/version`` every minute and on restart."""

    name = "vllm"
    stage = Stage.FIRST
    reports_health = True

    def __init__(self, client: VllmApi) -> None:
        self._client = client
        self._card_due = 0.0
        self._page_problems = False
        self._dialect = "vllm"
        self._log = get_logger()

    def due(self, now: float) -> bool:
        return True  # /metrics, every poll

    async def poll(self, now: float, readings: Readings) -> Outcome:
        want_card = now >= self._card_due
        readings.put(PAGE, self.name, None)
        try:
            page, card, version = await gather_vllm(self._client, want_card=want_card)
        except SourceError as e:
            return e.kind, str(e)
        if want_card:
            readings.put(CARD, self.name, card or readings.get(CARD))
            readings.put(VERSION, self.name, version or readings.get(VERSION))
            self._card_due = now + CARD_REFRESH_SECONDS if card else now
        # Once when a page starts to carry problems (duplicates, bad values), once when it is
        # clean again: the page is still used, so this is a warning, not a source down.
        if page.problems and not self._page_problems:
            self._log.warning(
                "vllm_page_problems", first=page.problems[0], count=len(page.problems)
            )
        elif not page.problems and self._page_problems:
            self._log.info("vllm_page_clean")
        self._page_problems = bool(page.problems)
        if page.dialect != self._dialect:
            # Once: the series were read under another server's names (sources/dialects.py).
            self._log.info("vllm_page_dialect", dialect=page.dialect)
            self._dialect = page.dialect
        readings.put(PAGE, self.name, page)
        return None

    async def on_restart(self, now: float, readings: Readings) -> None:
        """The model and its limits may be new: read the card again now, not in a minute."""
        card, version = await asyncio.gather(
            self._client.models(), self._client.version(), return_exceptions=True
        )
        if isinstance(card, ModelCard):
            readings.put(CARD, self.name, card)
            self._card_due = now + CARD_REFRESH_SECONDS
        else:
            self._card_due = now  # the next poll asks again
        if isinstance(version, str):
            readings.put(VERSION, self.name, version)
        for result in (card, version):
            # A SourceError leaves the old card in place; anything else is a bug to show.
            if isinstance(result, BaseException) and not isinstance(result, SourceError):
                raise result


def _make(context: SourceContext) -> VllmSource:
    return VllmSource(context.client)  # the session is the server's, made in create_app


PLUGIN = Plugin("vllm", _make)
