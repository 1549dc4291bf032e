"""A stand-in Hugging Face Hub on 127.0.0.1, serving recorded repositories from
tests/fixtures/hub/ (``<org>__<name>/api.json`` and the files beside it).

It answers the three requests ``huggingface_hub`` makes to plan a model, with the Hub's own
status codes and headers (``X-Error-Code`` is how the client tells a gated repo from a
missing one): ``GET /api/models/ORG/NAME`` (model_info), ``HEAD`` and ``GET
/ORG/NAME/resolve/REV/FILE``. A repo whose ``api.json`` says ``"gated"`` serves its files
only to ``Authorization: Bearer TOKEN``. Every request is recorded, so a test can say what
was (not) asked for.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

from tests.conftest import FIXTURES

HUB_FIXTURES = FIXTURES / "hub"
TOKEN = "hf_standin_token"


@dataclass
class StandinHub:
    url: str
    requests: list[tuple[str, str, str]] = field(default_factory=list)  # method, path, auth


def _repo_dir(repo_id: str) -> Path | None:
    folder = HUB_FIXTURES / repo_id.replace("/", "__")
    return folder if (folder / "api.json").is_file() else None


def _handler(hub: StandinHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            return  # quiet: the test reads hub.requests instead

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def do_GET(self) -> None:
            self._answer(body=True)

        def _send(self, status: int, headers: dict[str, str], payload: bytes, body: bool) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if body:
                self.wfile.write(payload)

        def _error(self, status: int, code: str, message: str, body: bool) -> None:
            headers = {"X-Error-Code": code, "X-Error-Message": message}
            payload = json.dumps({"error": message}).encode()
            self._send(status, {**headers, "Content-Type": "application/json"}, payload, body)

        def _answer(self, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            auth = self.headers.get("Authorization", "")
            hub.requests.append((self.command, path, auth))
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"] and len(parts) == 4:
                repo = _repo_dir(f"{parts[2]}/{parts[3]}")
                if repo is None:
                    # The Hub answers 401 for a repo it does not show an anonymous caller.
                    self._error(401, "RepoNotFound", "Repository not found", body)
                    return
                payload = (repo / "api.json").read_bytes()
                self._send(200, {"Content-Type": "application/json"}, payload, body)
                return
            if len(parts) >= 5 and parts[2] == "resolve":
                repo_id, filename = f"{parts[0]}/{parts[1]}", "/".join(parts[4:])
                repo = _repo_dir(repo_id)
                if repo is None:
                    self._error(401, "RepoNotFound", "Repository not found", body)
                    return
                info = json.loads((repo / "api.json").read_text())
                if info.get("gated") and auth != f"Bearer {TOKEN}":
                    self._error(
                        401,
                        "GatedRepo",
                        f"Access to model {repo_id} is restricted. You must have access to it "
                        "and be authenticated to access it. Please log in.",
                        body,
                    )
                    return
                file = repo / filename
                if filename == "api.json" or not file.is_file():
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.send_header("X-Error-Message", "Entry not found")
                    self.send_header("X-Repo-Commit", info["sha"])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                payload = file.read_bytes()
                # A small file's ETag is its git blob id, as the Hub sends it.
                blob = hashlib.sha1(b"blob %d\0" % len(payload) + payload).hexdigest()
                headers = {
                    "Content-Type": "application/json",
                    "ETag": f'"{blob}"',
                    "X-Repo-Commit": info["sha"],
                }
                self._send(200, headers, payload, body)
                return
            self._error(404, "NotFound", "Not found", body)

    return Handler


@contextmanager
def standin_hub() -> Iterator[StandinHub]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    hub = StandinHub(url=f"http://127.0.0.1:{server.server_address[1]}")
    server.RequestHandlerClass = _handler(hub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
