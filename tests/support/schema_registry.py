"""A Confluent Schema Registry for unit tests: the REST calls the codec's client makes, over real HTTP.

A real registry cannot run here; this answers ``POST /subjects/<subject>/versions`` and
``GET /schemas/ids/<id>`` as the registry does (its JSON bodies and error codes, basic auth when given
credentials), on a loopback port in a thread, so the codec is tested through confluent-kafka's own client.
"""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit


class RegistryStub:
    """``with RegistryStub() as registry:`` serves on ``registry.url``; ``requests`` lists (method, path)."""

    def __init__(self, credentials: tuple[str, str] | None = None, first_id: int = 1) -> None:
        self.credentials = credentials
        self.by_id: dict[int, str] = {}
        self.subjects: dict[str, list[int]] = {}
        self.requests: list[tuple[str, str]] = []
        self._first_id = first_id
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def url_with_credentials(self) -> str:
        assert self.credentials is not None
        user, password = self.credentials
        return f"http://{user}:{password}@127.0.0.1:{self._server.server_address[1]}"

    def add(self, schema: dict[str, Any]) -> int:
        """Register ``schema`` as another producer would; its id."""
        with self._lock:
            text = json.dumps(schema)
            known = {t: i for i, t in self.by_id.items()}
            schema_id = known.get(text, max(self.by_id, default=self._first_id - 1) + 1)
            self.by_id[schema_id] = text
            return schema_id

    def __enter__(self) -> RegistryStub:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def _answer(self, method: str, path: str, authorization: str | None, body: bytes) -> tuple[int, Any]:
        self.requests.append((method, path))
        if self.credentials is not None:
            expected = "Basic " + base64.b64encode(":".join(self.credentials).encode()).decode()
            if authorization != expected:
                return 401, {"error_code": 401, "message": "Unauthorized"}
        parts = path.strip("/").split("/")
        if method == "POST" and len(parts) == 3 and parts[0] == "subjects" and parts[2] == "versions":
            schema_id = self.add(json.loads(json.loads(body)["schema"]))
            self.subjects.setdefault(parts[1], []).append(schema_id)
            return 200, {"id": schema_id}
        if method == "GET" and len(parts) == 3 and parts[:2] == ["schemas", "ids"]:
            text = self.by_id.get(int(parts[2]))
            if text is None:
                return 404, {"error_code": 40403, "message": f"Schema {parts[2]} not found"}
            return 200, {"schema": text}
        return 404, {"error_code": 404, "message": "HTTP 404 Not Found"}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                status, reply = stub._answer(self.command, urlsplit(self.path).path,
                                             self.headers.get("authorization"), body)
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("content-type", "application/vnd.schemaregistry.v1+json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _serve

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
                pass

        return Handler
