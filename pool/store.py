"""The one adapter between Claw-R1 and ClickHouse: embedded chDB or a server, same calls.

``PoolStore(dsn)`` wraps a clickhouse-connect client. ``chdb:///abs/path`` opens the embedded engine
(one engine path per process, the directory locked against other processes); ``http(s)://user:pass@host:port/db``
talks to a ClickHouse server, and with ``cluster`` (``CLAWR1_CLICKHOUSE_CLUSTER``) migrates the pool
onto that server's cluster (``clawr1.pool.cluster``). Calls are serialized by a lock because a
clickhouse-connect client (and the chDB handle under it) is not safe to share between threads mid-call;
give each thread that must not wait on the others (the sink, the HTTP API) its own store on the same DSN.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import clickhouse_connect
import pyarrow as pa
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import ClickHouseError, DataError

from clawr1.pool.migrations import apply_migrations

# Where ClickHouse's own text starts in a driver message. Only for display: the HTTP driver prefixes
# "Received ClickHouse exception, code: N, server response: " and appends the URL; chDB's text starts
# here already. The code itself is read from the exception, never from this text.
_TEXT_START = re.compile(r"Code: \d+\..*", re.DOTALL)
# Every insert: synchronous through a Distributed table (no effect on any other table).
_INSERT_SETTINGS = {"distributed_foreground_insert": 1}


class PoolError(RuntimeError):
    """A ClickHouse error, reduced to ClickHouse's own text (``Code: N. DB::Exception: ...``), with its
    numeric ``code`` and symbolic ``name`` (e.g. 60, ``UNKNOWN_TABLE``) when ClickHouse gave them."""

    def __init__(self, message: str, code: int | None = None, name: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.name = name


class PoolDataError(PoolError):
    """Rows that cannot be written as the table's types (raised before anything reaches ClickHouse)."""


def pool_error(exc: ClickHouseError) -> PoolError:
    """ClickHouse's own error text, code and name, without the driver's wrapping.

    clickhouse-connect (1.12) sets ``code``/``name`` on its ``Error`` subclasses for both transports:
    the HTTP client from the ``X-ClickHouse-Exception-Code`` header, the chDB backend from the engine's
    message (checked: ``SELECT * FROM nope`` on chDB raises DatabaseError with code 60, name
    UNKNOWN_TABLE). Transport failures (and a bare ``ClickHouseError``) carry no code: None here.
    """
    text = str(exc)
    match = _TEXT_START.search(text)
    message = match.group(0).strip() if match else text.strip()
    return PoolError(message, getattr(exc, "code", None), getattr(exc, "name", None))


def is_embedded(dsn: str) -> bool:
    return dsn.startswith("chdb:")


def embedded_path(dsn: str) -> Path:
    """The engine's data path of a ``chdb://`` DSN."""
    return Path(dsn.removeprefix("chdb:").removeprefix("//")).resolve()


def open_client(dsn: str, database: str | None = None, settings: Mapping[str, Any] | None = None,
                what: str = "") -> Client:
    """The one way to a ClickHouse client: ``chdb://`` opens the embedded engine, an ``http(s)://`` DSN a
    server. ``database`` overrides the DSN's default database; ``settings`` go with every query (on chDB,
    ``SET`` on the client's own handle, in order); ``what`` names the client in an error (default: the
    pool at ``dsn``)."""
    kwargs: dict[str, Any] = {"dsn": dsn}
    if database:
        kwargs["database"] = database
    if settings:
        kwargs["settings"] = dict(settings)
    if not is_embedded(dsn):
        # No server session: a server refuses concurrent queries on one session, and nothing here
        # relies on session state (every setting travels with its query).
        kwargs["autogenerate_session_id"] = False
    try:
        return clickhouse_connect.get_client(**kwargs)
    except ClickHouseError as exc:
        hint = (" (chDB opens one data path per process and locks it against other processes: "
                "reach a pool owned by another process through its HTTP API)") if is_embedded(dsn) else ""
        error = pool_error(exc)
        raise PoolError(f"cannot open {what or f'the pool at {dsn}'}: {error}{hint}", error.code,
                        error.name) from exc


class PoolStore:
    """Thread-safe, typed access to the pool: migrate, query, insert, close."""

    def __init__(self, dsn: str, database: str | None = None, cluster: str = "") -> None:
        if cluster and is_embedded(dsn):
            raise PoolError(f"a ClickHouse cluster ({cluster!r}) needs a server DSN, not the embedded pool "
                            f"{dsn}: set CLAWR1_CLICKHOUSE_DSN to one of its servers")
        self.dsn = dsn
        self.cluster = cluster
        self._lock = threading.Lock()
        if database:
            # A database must exist before a client can select it (on every node of a cluster).
            on_cluster = f" ON CLUSTER {quote_identifier(cluster)}" if cluster else ""
            with _closing(open_client(dsn)) as bootstrap:
                bootstrap.command(f"CREATE DATABASE IF NOT EXISTS {quote_identifier(database)}{on_cluster}")
        self._client: Client | None = open_client(dsn, database)
        self.database: str = database or str(self._call(lambda c: c.query("SELECT currentDatabase()"))
                                             .result_rows[0][0])

    @property
    def embedded(self) -> bool:
        return is_embedded(self.dsn)

    def _call(self, fn: Any) -> Any:
        with self._lock:
            if self._client is None:
                raise PoolError("the pool store is closed")
            try:
                return fn(self._client)
            except ClickHouseError as exc:
                raise pool_error(exc) from exc

    def migrate(self) -> list[str]:
        """Apply pending migrations; returns the ids applied now (empty when up to date)."""
        return apply_migrations(self, cluster=self.cluster)

    def command(self, sql: str, parameters: Mapping[str, Any] | None = None,
                settings: Mapping[str, Any] | None = None) -> Any:
        return self._call(lambda c: c.command(sql, parameters=parameters, settings=dict(settings or {})))

    def query(self, sql: str, parameters: Mapping[str, Any] | None = None,
              settings: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """Rows as dicts keyed by column name."""
        result = self._call(lambda c: c.query(sql, parameters=parameters, settings=dict(settings or {})))
        return list(result.named_results())

    def query_columns(self, sql: str, parameters: Mapping[str, Any] | None = None,
                      settings: Mapping[str, Any] | None = None) -> dict[str, list[Any]]:
        """Columns as lists keyed by column name (cheaper than dicts for wide batches)."""
        result = self._call(lambda c: c.query(sql, parameters=parameters, settings=dict(settings or {})))
        return {name: list(col) for name, col in zip(result.column_names, result.result_columns, strict=True)}

    def query_arrow(self, sql: str, parameters: Mapping[str, Any] | None = None,
                    settings: Mapping[str, Any] | None = None) -> Any:
        """A ``pyarrow.Table``: token arrays arrive as Arrow lists, ready for numpy without per-row Python."""
        return self._call(lambda c: c.query_arrow(sql, parameters=parameters, settings=dict(settings or {})))

    def raw_query(self, sql: str, fmt: str, parameters: Mapping[str, Any] | None = None,
                  settings: Mapping[str, Any] | None = None) -> bytes:
        """The result bytes in a ClickHouse output format (JSONEachRow, CSV, TabSeparated, Arrow...)."""
        return bytes(self._call(lambda c: c.raw_query(sql, parameters=parameters,
                                                      settings=dict(settings or {}), fmt=fmt)))

    def insert(self, table: str, rows: Sequence[Sequence[Any]], column_names: Sequence[str],
               dedup_token: str | None = None, settings: Mapping[str, Any] | None = None) -> int:
        """Insert row tuples; a repeated ``dedup_token`` makes ClickHouse drop the repeated block.

        Into a Distributed table (a cluster's pool) the insert returns once every shard holds its rows,
        not once the receiving server queued them: the sink commits Kafka offsets after it returns.
        """
        if not rows:
            return 0
        names = list(column_names)
        self._insert(table, dedup_token, settings,
                     lambda c, merged: c.insert(table, rows, column_names=names, settings=merged))
        return len(rows)

    def insert_arrow(self, table: str, data: pa.Table, dedup_token: str | None = None) -> int:
        """Insert an Arrow table whose column names are the table's; otherwise as ``insert``."""
        if not data.num_rows:
            return 0
        self._insert(table, dedup_token, None, lambda c, merged: c.insert_arrow(table, data, settings=merged))
        return int(data.num_rows)

    def _insert(self, table: str, dedup_token: str | None, settings: Mapping[str, Any] | None,
                send: Callable[[Client, dict[str, Any]], Any]) -> None:
        """One insert with the store's settings and token; rows ClickHouse cannot type -> PoolDataError."""
        merged = {**_INSERT_SETTINGS, **(settings or {})}
        if dedup_token:
            merged["insert_deduplication_token"] = dedup_token
        try:
            self._call(lambda c: send(c, merged))
        except (TypeError, ValueError, OverflowError, pa.ArrowException) as exc:
            raise PoolDataError(f"rows do not fit table {table!r}: {exc}") from exc
        except PoolError as exc:
            if isinstance(exc.__cause__, DataError):
                raise PoolDataError(f"rows do not fit table {table!r}: {exc}") from exc
            raise

    def insert_raw(self, table: str, data: bytes, fmt: str = "JSONEachRow",
                   column_names: Sequence[str] | None = None, dedup_token: str | None = None,
                   settings: Mapping[str, Any] | None = None) -> None:
        """Insert pre-formatted bytes: ClickHouse parses and type-checks them itself."""
        settings = {**_INSERT_SETTINGS, **(settings or {})}
        if dedup_token:
            settings["insert_deduplication_token"] = dedup_token
        self._call(lambda c: c.raw_insert(table, column_names=list(column_names) if column_names else None,
                                          insert_block=data, settings=settings, fmt=fmt))

    def table_exists(self, name: str) -> bool:
        rows = self.query("SELECT count() AS n FROM system.tables WHERE database = currentDatabase() "
                          "AND name = {name:String}", parameters={"name": name})
        return bool(rows[0]["n"])

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def __enter__(self) -> PoolStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


_IDENTIFIER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def quote_identifier(name: str) -> str:
    """Back-quote a database/table name; only plain identifiers are accepted."""
    if not _IDENTIFIER_RE.match(name):
        raise ValueError(f"not a plain identifier: {name!r}")
    return f"`{name}`"


@contextmanager
def _closing(client: Client) -> Iterator[Client]:
    try:
        yield client
    finally:
        client.close()
