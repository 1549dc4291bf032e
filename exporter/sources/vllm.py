"""The vLLM server over HTTP: ``/metrics``, ``/v1/models`` and ``/version``, each bounded.

Every request has a total timeout and every body a size cap, so a server that never
answers, trickles a byte a second or sends 100 MB costs one poll, not the sidecar. Failures
come back as ``SourceError`` with a stable ``kind`` for logs and metrics.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import aiohttp

from exporter.sources.vllm_page import VllmPage, parse_page


class SourceError(Exception):
    """A source could not be read. ``kind`` is stable (for logs); ``str`` is one line."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        super().__init__(message)


@dataclass(frozen=True)
class ModelCard:
    """What ``/v1/models`` says: the served names and the context limit."""

    names: tuple[str, ...]
    max_model_len: int | None
    root: str | None  # the model path or hub id vLLM loaded


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

    async def _get(self, path: str, accept: str) -> bytes:
        url = f"{self._base}{path}"
        try:
            async with self._session.get(
                url, timeout=self._timeout, headers={"Accept": accept}
            ) as resp:
                if resp.status != 200:
                    raise SourceError("http_status", f"GET {url}: HTTP {resp.status}")
                declared = resp.content_length
                if declared is not None and declared > self._max_bytes:
                    raise SourceError("too_large", f"GET {url}: {declared} bytes > cap")
                chunks: list[bytes] = []
                size = 0
                async for chunk in resp.content.iter_chunked(1 << 16):
                    size += len(chunk)
                    if size > self._max_bytes:
                        raise SourceError(
                            "too_large", f"GET {url}: body over the {self._max_bytes}-byte cap"
                        )
                    chunks.append(chunk)
                body = b"".join(chunks)
                return body
        except SourceError:
            raise
        except TimeoutError:
            raise SourceError(
                "timeout", f"GET {url}: no complete answer within {self._timeout.total:g}s"
            ) from None
        except aiohttp.ClientConnectorError as e:
            raise SourceError("refused", f"GET {url}: cannot connect ({e.os_error})") from None
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError) as e:
            raise SourceError("reset", f"GET {url}: connection broke mid-answer ({e})") from None
        except aiohttp.ClientError as e:
            raise SourceError("error", f"GET {url}: {type(e).__name__}: {e}") from None

    async def metrics(self) -> VllmPage:
        # Ask for the classic text format: Prometheus's own Accept header would get
        # OpenMetrics, whose counter and _created layout differs.
        body = await self._get("/metrics", "text/plain; version=0.0.4")
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as e:
            raise SourceError("decode", f"/metrics is not UTF-8 (byte {e.start})") from None
        page = parse_page(text)
        if not page.engines:
            raise SourceError("no_vllm_metrics", "/metrics answered but holds no vllm: series")
        problem = incomplete(page, text)
        if problem:
            raise SourceError("incomplete", f"/metrics: {problem}")
        return page

    async def models(self) -> ModelCard:
        doc = await self._json("/v1/models")
        entries = doc.get("data") if isinstance(doc, dict) else None
        if not isinstance(entries, list) or not entries:
            raise SourceError("bad_json", "/v1/models: no data[] in the answer")
        names = tuple(str(e.get("id")) for e in entries if isinstance(e, dict) and e.get("id"))
        first = entries[0] if isinstance(entries[0], dict) else {}
        length = first.get("max_model_len")
        root = first.get("root")
        return ModelCard(
            names=names,
            max_model_len=length if isinstance(length, int) and length > 0 else None,
            root=str(root) if root else None,
        )

    async def version(self) -> str | None:
        doc = await self._json("/version")
        value = doc.get("version") if isinstance(doc, dict) else None
        return str(value) if value else None

    async def _json(self, path: str) -> Any:
        body = await self._get(path, "application/json")
        try:
            return json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise SourceError("bad_json", f"{path}: not JSON") from None


def incomplete(page: VllmPage, text: str) -> str | None:
    """Why a page cannot be trusted whole, or None.

    The exposition format ends every line with a newline, so a missing one means the body
    was cut; and every release since 0.5 exposes, per engine, running requests, KV usage
    and ``cache_config_info`` with its ``block_size`` label.
    """
    if not text.endswith("\n"):
        return "the page ends mid-line (truncated)"
    for e in page.engines:
        if e.running is None or e.kv_usage is None:
            return f"engine {e.engine} lacks num_requests_running or the KV usage gauge"
        if not e.cache_config or "block_size" not in e.cache_config:
            return f"engine {e.engine}: cache_config_info is missing or has no labels"
    return None


async def gather_vllm(
    client: VllmClient, *, want_card: bool
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
