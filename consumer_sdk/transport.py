"""Thin adapters that carry the consumer's SQL to the pool: directly, or through the Claw-R1 API.

Both speak the same calls, so the consumer's logic never knows which one it has:
``query(sql, parameters) -> pyarrow.Table``, ``insert(table, rows, column_names)`` and
``insert_arrow(table, data)`` (the same insert from a ``pyarrow.Table``; both transports may be called
from a second thread while the first queries: the direct one inserts on its own connection).
Errors of clickhouse-connect, the pool store and httpx are translated here into the SDK's own.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import httpx
import pyarrow as pa

from clawr1.consumer_sdk.errors import MissingDependency, PoolRequestError, PoolUnavailable
from clawr1.consumer_sdk.source import Source

API_KEY_ENV = "CLAWR1_API_KEY"
ARROW_STREAM = "application/vnd.apache.arrow.stream"


class Transport(Protocol):
    def query(self, sql: str, parameters: Mapping[str, Any]) -> pa.Table: ...

    def insert(self, table: str, rows: Sequence[Sequence[Any]], column_names: Sequence[str]) -> None: ...

    def close(self) -> None: ...


class DirectTransport:
    """clickhouse-connect through the pool's own store: chDB in this process, or a ClickHouse server.

    Imported on use: the core install (the SDK over HTTP) has neither chDB nor clickhouse-connect."""

    def __init__(self, dsn: str) -> None:
        try:
            from clickhouse_connect.driver.exceptions import ClickHouseError, OperationalError

            from clawr1.pool.store import PoolError, PoolStore
        except ImportError as exc:
            raise MissingDependency(
                f"a ClickHouse DSN source needs the pool extra (chDB, clickhouse-connect): "
                f"pip install 'claw-r1[pool]', or read over the API with an http(s):// source ({exc})"
            ) from exc
        self._errors: tuple[type[Exception], ...] = (PoolError, ClickHouseError)
        self._unavailable = OperationalError
        self._writer: PoolStore | None = None  # its own connection: inserts run beside queries
        self._writer_lock = threading.Lock()
        try:
            self._store = PoolStore(dsn)
        except (*self._errors, OSError, RuntimeError) as exc:
            raise PoolUnavailable(f"cannot open the pool at {_redact(dsn)}: {exc}") from exc

    def _translate(self, exc: Exception) -> Exception:
        if isinstance(exc, self._unavailable) or isinstance(exc.__cause__, self._unavailable):
            return PoolUnavailable(f"the pool did not answer: {exc}")
        return PoolRequestError(f"the pool refused the request: {exc}", code=getattr(exc, "code", None))

    def query(self, sql: str, parameters: Mapping[str, Any]) -> pa.Table:
        try:
            return self._store.query_arrow(sql, parameters=parameters)
        except self._errors as exc:
            raise self._translate(exc) from exc

    def insert(self, table: str, rows: Sequence[Sequence[Any]], column_names: Sequence[str]) -> None:
        try:
            self._store.insert(table, rows, column_names)
        except self._errors as exc:
            raise self._translate(exc) from exc

    def insert_arrow(self, table: str, data: pa.Table) -> None:
        """``data`` as one ArrowStream insert, on the transport's writing connection (a second client on
        the same DSN, opened on first use), so it can run while another thread queries."""
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, data.schema) as writer:
            writer.write_table(data)
        try:
            with self._writer_lock:
                if self._writer is None:
                    from clawr1.pool.store import PoolStore

                    self._writer = PoolStore(self._store.dsn)
                self._writer.insert_raw(table, sink.getvalue().to_pybytes(), "ArrowStream", data.column_names)
        except self._errors as exc:
            raise self._translate(exc) from exc

    def close(self) -> None:
        with self._writer_lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
        self._store.close()


def _redact(url: str) -> str:
    """The URL without its password, for error messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


_INSERT_CHUNK_ROWS = 5000


_ARROW_INSERT_CHUNK_ROWS = 20_000
"""Rows per Arrow insert: about 2 MB of commit rows, well below the API's request size limit."""


class ApiTransport:
    """The Claw-R1 API's pool routes: ``POST /v1/sql`` (answered as an Arrow stream) and
    ``POST /v1/pool/insert/{table}`` (only the SDK's own tables; rows as JSON, or as an Arrow stream).
    The key is ``api_key``, else ``CLAWR1_API_KEY``."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 30.0) -> None:
        # The environment keeps the key out of argv, where ``ps`` shows it to every local user.
        api_key = api_key or os.environ.get(API_KEY_ENV) or None
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._base_url = base_url
        self._http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout)

    def _post(self, path: str, body: dict[str, Any] | bytes) -> httpx.Response:
        try:
            if isinstance(body, bytes):
                response = self._http.post(path, content=body, headers={"Content-Type": ARROW_STREAM})
            else:
                response = self._http.post(path, json=body)
        except httpx.TransportError as exc:
            where = _redact(self._base_url)
            raise PoolUnavailable(f"the pool API at {where} did not answer: {exc!r}") from exc
        if response.is_success:
            return response
        raise PoolRequestError(
            f"the pool API refused {path} with HTTP {response.status_code}: {reason_of(response)}",
            status=response.status_code,
        )

    def query(self, sql: str, parameters: Mapping[str, Any]) -> pa.Table:
        body = {"query": sql, "format": "ArrowStream", "parameters": dict(parameters)}
        content = self._post("/v1/sql", body).content
        try:
            return pa.ipc.open_stream(content).read_all()
        except pa.ArrowInvalid as exc:
            raise PoolRequestError(f"the pool API answered /v1/sql with no Arrow stream: {exc}") from exc

    def insert(self, table: str, rows: Sequence[Sequence[Any]], column_names: Sequence[str]) -> None:
        # Chunks keep each body far below the API's request size limit. If a later chunk fails, the
        # caller repeats the whole insert: commit rows are keyed, so the repeated ones collapse.
        for start in range(0, len(rows), _INSERT_CHUNK_ROWS):
            chunk = rows[start:start + _INSERT_CHUNK_ROWS]
            records = [dict(zip(column_names, row, strict=True)) for row in chunk]
            self._post(f"/v1/pool/insert/{table}", {"rows": records})

    def insert_arrow(self, table: str, data: pa.Table) -> None:
        """``data`` as Arrow stream bodies; if a later chunk fails the caller repeats the whole insert, as
        with ``insert``."""
        for start in range(0, data.num_rows, _ARROW_INSERT_CHUNK_ROWS):
            chunk = data.slice(start, _ARROW_INSERT_CHUNK_ROWS)
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, chunk.schema) as writer:
                writer.write_table(chunk)
            self._post(f"/v1/pool/insert/{table}", sink.getvalue().to_pybytes())

    def close(self) -> None:
        self._http.close()


def reason_of(response: httpx.Response) -> str:
    """The error text of the gateway's error body (``message``) or FastAPI's (``detail``)."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    if isinstance(body, dict):
        for key in ("message", "detail"):
            if key in body:
                return str(body[key])[:500]
    return str(body)[:500]


def open_transport(source: Source, api_key: str | None = None, request_timeout: float = 30.0) -> Transport:
    if source.kind == "direct":
        return DirectTransport(source.url)
    return ApiTransport(source.url, api_key=api_key, timeout=request_timeout)
