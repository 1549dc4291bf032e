"""A vLLM on 127.0.0.1 that misbehaves on cue, for the fault tests and the soak benchmark.

It speaks HTTP/1.1 by hand (``asyncio`` streams, keep-alive like uvicorn) so that it can
fail where a framework would not let it: refuse connections, reset one mid-body, accept and
never answer, trickle a byte a second, announce or stream 100 MB. Faults in the page itself
are functions of the page text (``PAGE_FAULTS``), so any page — a fixture, or the
simulator's at the current time — can be broken the same way.

    fake = ScriptedVllm(lambda: simulation.page())
    await fake.start()
    await fake.set_fault("reset")   # the next /metrics breaks mid-body
    await fake.set_fault(None)      # and from now on it answers again
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import re
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass

HUGE_BYTES = 100 * 1024 * 1024
HANG_SECONDS = 60.0  # how long "hang" and "trickle" hold a connection at most
MIB = 1 << 20

_COUNTER_LINE = re.compile(
    r"^(vllm:[a-z_:]+(?:_total|_count|_sum|_bucket)(?:\{[^}]*\})?) \S+$", re.MULTILINE
)
_BLOCK_SIZE = re.compile(r'([{,])block_size="[^"]*"')
_START_LINE = re.compile(r"^process_start_time_seconds (\S+)$", re.MULTILINE)


def _set_value(page: str, name: str, value: str) -> str:
    pattern = re.compile(rf"^({re.escape(name)}(?:\{{[^}}]*\}})?) \S+$", re.MULTILINE)
    return pattern.sub(lambda m: f"{m.group(1)} {value}", page)


def _truncated(page: str) -> bytes:
    cut = page.index("vllm:kv_cache_usage_perc{")
    return page[: cut + 30].encode()


def _cut_line(page: str) -> bytes:
    """One line cut short in the middle of the page: its labels never close."""
    return re.sub(
        r'^(vllm:kv_cache_usage_perc\{engine="0",mod)[^\n]*$', r"\1", page, flags=re.M
    ).encode()


def _invalid_utf8(page: str) -> bytes:
    return page.encode().replace(b'model_name="', b'model_name="\xff\xfe', 1)


def _duplicate(page: str) -> bytes:
    lines = page.splitlines()
    out = []
    for line in lines:
        out.append(line)
        if line.startswith("vllm:num_requests_running"):
            out.append(line)  # the same series twice; the second wins
    return ("\n".join(out) + "\n").encode()


def _html_labels(page: str) -> bytes:
    evil = r"<script>alert(\"kv\")</script> & \\ 'quotes'"
    return page.replace('model_name="tinyllama"', f'model_name="{evil}"').encode()


def _relabel(page: str) -> bytes:
    """cache_config_info as after a reconfiguration: twice the blocks."""

    def double(m: re.Match[str]) -> str:
        return f'num_gpu_blocks="{int(m.group(1)) * 2}"'

    return re.sub(r'num_gpu_blocks="(\d+)"', double, page).encode()


def _restart(page: str) -> bytes:
    """The page of the same server just restarted: counters from zero, a new start time."""
    page = _COUNTER_LINE.sub(lambda m: f"{m.group(1)} 0.0", page)
    return _START_LINE.sub(
        lambda m: f"process_start_time_seconds {float(m.group(1)) + 3600}", page
    ).encode()


PAGE_FAULTS: dict[str, Callable[[str], bytes]] = {
    "truncated": _truncated,
    "cut_line": _cut_line,
    "invalid_utf8": _invalid_utf8,
    "garbage": lambda _p: b"<html><body>502 Bad Gateway</body></html>\n",
    "nan": lambda p: _set_value(p, "vllm:kv_cache_usage_perc", "NaN").encode(),
    "inf": lambda p: _set_value(p, "vllm:kv_cache_usage_perc", "+Inf").encode(),
    "minus_inf": lambda p: _set_value(p, "vllm:num_requests_running", "-Inf").encode(),
    "negative": lambda p: _set_value(p, "vllm:num_requests_running", "-3").encode(),
    "zero_block_size": lambda p: re.sub(
        r'([{,])block_size="[^"]*"', r'\1block_size="0"', p
    ).encode(),
    "duplicate": _duplicate,
    "html_labels": _html_labels,
    "relabel": _relabel,
    "restart": _restart,
}
# Faults of the connection or the HTTP exchange rather than of the page.
WIRE_FAULTS = (
    "refused",
    "reset",
    "hang",
    "trickle",
    "huge",
    "huge_chunked",
    "status_500",
    "gzip",
)
FAULTS = (*WIRE_FAULTS, *PAGE_FAULTS)
# What /v1/models and /version can do wrong on their own (``json_fault``).
JSON_FAULTS = ("hang", "huge", "nested", "not_json", "status_500")


@dataclass
class Card:
    model: str = "tinyllama"
    max_model_len: int | None = 2048
    version: str = "0.32.0"


class ScriptedVllm:
    """``/metrics``, ``/v1/models`` and ``/version`` on 127.0.0.1, with faults on cue."""

    def __init__(self, page: str | Callable[[], str], card: Card | None = None) -> None:
        self.page: Callable[[], str] = page if callable(page) else (lambda: page)
        self.card = card or Card()
        self.fault: str | None = None
        self.json_fault: str | None = None
        self.trickle_seconds = 1.0
        self.requests: dict[str, int] = {}
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._handle, "127.0.0.1", self.port, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def set_fault(self, fault: str | None) -> None:
        """Break /metrics (``None``: answer again). ``refused`` stops listening."""
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; one of {', '.join(FAULTS)}")
        if fault == "refused" and self._server is not None:
            await self._stop_listening()
        elif fault != "refused" and self._server is None:
            await self.start()
        self.fault = fault

    async def close(self) -> None:
        await self._stop_listening()

    async def _stop_listening(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):  # open keep-alive connections go too
            writer.transport.abort()
        self._writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
                parts = request_line.split()
                path = parts[1] if len(parts) >= 2 else "/"
                self.requests[path] = self.requests.get(path, 0) + 1
                if not await self._answer(path, reader, writer):
                    return
        except (ConnectionError, OSError):
            return
        finally:
            self._writers.discard(writer)
            writer.transport.abort()

    async def _answer(
        self, path: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Answer one request; False when the connection is done with."""
        if path == "/metrics":
            return await self._metrics(reader, writer)
        if path in ("/v1/models", "/version"):
            return await self._json(path, reader, writer)
        await _send(writer, 404, b"not found\n")
        return True

    async def _metrics(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        fault = self.fault
        page = self.page()
        if fault in PAGE_FAULTS:
            await _send(writer, 200, PAGE_FAULTS[fault](page))
            return True
        body = page.encode()
        if fault == "status_500":
            await _send(writer, 500, b"engine dead\n")
        elif fault == "gzip":  # compressed although not asked for
            await _send(writer, 200, gzip.compress(body), {"Content-Encoding": "gzip"})
        elif fault == "reset":
            head = _head(200, len(body))
            writer.write(head + body[: len(body) // 2])
            await writer.drain()
            _reset(writer)
            return False
        elif fault == "hang":
            await _wait_for_close(reader, HANG_SECONDS)
            return False
        elif fault == "trickle":
            writer.write(_head(200, len(body)))
            for i in range(int(HANG_SECONDS / self.trickle_seconds)):  # bounded
                writer.write(body[i : i + 1])
                await writer.drain()
                if await _wait_for_close(reader, self.trickle_seconds):
                    break
            return False
        elif fault == "huge":
            await _stream(writer, _head(200, HUGE_BYTES), HUGE_BYTES, chunked=False)
            return False
        elif fault == "huge_chunked":
            await _stream(writer, _head(200, None), HUGE_BYTES, chunked=True)
            return False
        else:
            await _send(writer, 200, body)
        return True

    async def _json(
        self, path: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        fault = self.json_fault
        if fault == "hang":
            await _wait_for_close(reader, HANG_SECONDS)
            return False
        if fault == "huge":
            await _stream(writer, _head(200, None, "application/json"), HUGE_BYTES, chunked=True)
            return False
        if fault == "status_500":
            await _send(writer, 500, b"{}")
            return True
        if fault == "nested":  # deeper than json.loads can recurse
            body = b"[" * 200_000 + b"]" * 200_000
        elif fault == "not_json":
            body = b"<html>oops</html>"
        elif path == "/version":
            body = json.dumps({"version": self.card.version}).encode()
        else:
            c = self.card
            entry = {"id": c.model, "root": c.model, "max_model_len": c.max_model_len}
            body = json.dumps({"object": "list", "data": [entry]}).encode()
        await _send(writer, 200, body, content_type="application/json")
        return True


def _head(
    status: int,
    length: int | None,
    content_type: str = "text/plain; version=0.0.4; charset=utf-8",
    extra: dict[str, str] | None = None,
) -> bytes:
    reason = {200: "OK", 404: "Not Found", 500: "Internal Server Error"}[status]
    lines = [f"HTTP/1.1 {status} {reason}", f"Content-Type: {content_type}"]
    lines.append(
        f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    )
    lines += [f"{k}: {v}" for k, v in (extra or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _send(
    writer: asyncio.StreamWriter,
    status: int,
    body: bytes,
    extra: dict[str, str] | None = None,
    content_type: str = "text/plain; version=0.0.4; charset=utf-8",
) -> None:
    writer.write(_head(status, len(body), content_type, extra) + body)
    await writer.drain()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST rather than a FIN: the client sees the connection reset."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _wait_for_close(reader: asyncio.StreamReader, seconds: float) -> bool:
    """Wait up to ``seconds`` for the client to hang up; True when it did."""
    try:
        data = await asyncio.wait_for(reader.read(1 << 16), timeout=seconds)
    except TimeoutError:
        return False
    except ConnectionError:
        return True
    return data == b""


async def _stream(writer: asyncio.StreamWriter, head: bytes, total: int, *, chunked: bool) -> None:
    """``total`` bytes of comment lines after ``head``, until done or the client leaves."""
    line = b"# " + b"x" * 1021 + b"\n"
    chunk = line * (MIB // len(line))
    writer.write(head)
    sent = 0
    try:
        while sent < total:
            if chunked:
                writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            else:
                writer.write(chunk)
            sent += len(chunk)
            await writer.drain()
        if chunked:
            writer.write(b"0\r\n\r\n")
            await writer.drain()
    except (ConnectionError, OSError):
        return
