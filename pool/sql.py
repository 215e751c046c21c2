"""Read-only SQL over the pool for analysts, shared by the HTTP API and the ``clawr1 sql`` CLI.

Three layers, each enough against what the one before could miss:

1. ``clawr1.pool.sql_guard``: ClickHouse's own parser reads the text (one statement, no regex) and an
   allow-list of statements, functions, table functions and tables decides whether it may run.
2. Its own session: every query runs on a client opened with ``readonly = 1`` set last, after the
   limits, so nothing in a query can change a setting, write, or loosen a limit. Sessions are apart from
   the store that the sink, the SDK routes and the dashboard use, so a slow query holds none of them up.
3. On a ClickHouse server, the analyst DSN (``CLAWR1_SQL_DSN``) names a user whose profile and grants
   (``pool/server/``) only allow reading the pool database.

Results stream from the engine in chunks instead of being held whole (formats with a global header or
footer, such as Arrow, Parquet and JSON, are assembled by the engine within ``max_result_bytes``).

Who may run a query, and for how long: ``clawr1.pool.admission`` (the pools of sessions, each key's
share, the deadline; ``clawr1.pool.watchdog`` keeps the deadlines). On the embedded pool, keyed analysts'
queries run in processes of their own over snapshots (``clawr1.pool.analyst_processes``), niced and killed
at their limit as a whole, since the engine cannot stop inside one function call; everyone else's run
here, analysts' at the lowest OS priority (``os_thread_priority``).
"""

from __future__ import annotations

import io
import json
import math
import re
import threading
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import IO, Any, Protocol, cast

from cachetools import LRUCache
from clickhouse_connect.driver.binding import external_bind_re
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import ClickHouseError

from clawr1.core import registry
from clawr1.core.settings import Settings, config_from, setting_field
from clawr1.pool.admission import ANALYSTS, TRAINERS, Admission, Caller, Ledger, SqlError, WriteRefused
from clawr1.pool.analyst_processes import AnalystKilled, AnalystProcesses
from clawr1.pool.sql_guard import (
    CATALOGUE_QUERY,
    COMBINATORS_QUERY,
    Catalogue,
    Checked,
    GuardRefusal,
    check_canonical,
    check_tree,
)
from clawr1.pool.store import PoolError, is_embedded, open_client, pool_error

OUTPUT_FORMATS: dict[str, str] = {
    "JSONEachRow": "application/x-ndjson",
    "JSON": "application/json",
    "JSONCompact": "application/json",
    "TabSeparated": "text/tab-separated-values; charset=utf-8",
    "TabSeparatedWithNames": "text/tab-separated-values; charset=utf-8",
    "CSV": "text/csv; charset=utf-8",
    "CSVWithNames": "text/csv; charset=utf-8",
    "Arrow": "application/vnd.apache.arrow.file",
    "ArrowStream": "application/vnd.apache.arrow.stream",
    "Parquet": "application/vnd.apache.parquet",
    "PrettyCompact": "text/plain; charset=utf-8",
    "PrettyCompactMonoBlock": "text/plain; charset=utf-8",
    "Markdown": "text/markdown; charset=utf-8",
    "Vertical": "text/plain; charset=utf-8",
}
"""Formats a caller may ask for, with the media type the API answers with."""

READONLY_ERROR_CODE = 164
SYNTAX_ERROR_CODE = 62
NO_JSON_ERROR_CODE = 36
"""parseQueryToJSON's answer for statements it cannot express (DESCRIBE, EXISTS, SHOW CREATE, INSERT...)."""
CANCELLED_ERROR_CODE = 394
TIMEOUT_ERROR_CODE = 159
MAX_QUERY_CHARS = 256 * 1024
# Accepted texts remembered: a trainer's SDK repeats a handful of query texts (values are bound
# parameters), and the guard's two engine round trips cost more than a small poll itself.
GUARD_CACHE_ENTRIES = 1024
CHUNK_BYTES = 256 * 1024
_PARAMETER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PARSE_SCOPE = re.compile(r":? In scope SELECT (?:parseQueryToJSON|formatQuerySingleLine)\(.*", re.DOTALL)


@dataclass(frozen=True)
class SqlLimits:
    """What one analyst query may cost; each is a session setting, fixed before ``readonly = 1``."""

    max_execution_time: float = setting_field(registry.SQL_MAX_EXECUTION_TIME)
    max_memory_usage: int = setting_field(registry.SQL_MAX_MEMORY_USAGE)
    max_result_rows: int = setting_field(registry.SQL_MAX_RESULT_ROWS)
    max_result_bytes: int = setting_field(registry.SQL_MAX_RESULT_BYTES)
    max_rows_to_read: int = setting_field(registry.SQL_MAX_ROWS_TO_READ)
    max_concurrent: int = setting_field(registry.SQL_MAX_CONCURRENT)
    trainer_concurrent: int = setting_field(registry.SQL_TRAINER_CONCURRENT)
    key_share: float = setting_field(registry.SQL_KEY_SHARE)
    analyst_block_rows: int = setting_field(registry.SQL_ANALYST_BLOCK_ROWS)
    os_thread_priority: int = setting_field(registry.SQL_OS_THREAD_PRIORITY)

    @classmethod
    def from_settings(cls, settings: Settings) -> SqlLimits:
        return config_from(cls, settings)

    def slots(self, pool: str) -> int:
        return max(1, self.trainer_concurrent if pool == TRAINERS else self.max_concurrent)

    def key_slots(self, pool: str) -> int:
        """The most sessions of ``pool`` one key may hold at once (at least one)."""
        return max(1, min(self.slots(pool), math.ceil(self.key_share * self.slots(pool))))

    def session_settings(self, pool: str = ANALYSTS) -> dict[str, Any]:
        """A session's settings, ``readonly`` last: once it is set nothing else can change. Analysts'
        sessions read in smaller blocks, so the time limit (checked between blocks) holds closer, and
        their threads run at ``os_thread_priority`` (the engine applies it where it may change a
        thread's priority: CAP_SYS_NICE), below ingest's.

        JSON integers stay numbers whatever the server version's default, so clients parse one shape.
        """
        rows = self.analyst_block_rows
        analysts = {"max_block_size": int(rows)} if rows else {}
        analysts["os_thread_priority"] = int(self.os_thread_priority)
        return {
            **(analysts if pool == ANALYSTS else {}),
            "max_execution_time": float(self.max_execution_time),
            "max_memory_usage": int(self.max_memory_usage),
            "max_result_rows": int(self.max_result_rows),
            "max_result_bytes": int(self.max_result_bytes),
            "result_overflow_mode": "throw",
            "max_rows_to_read": int(self.max_rows_to_read),
            "read_overflow_mode": "throw",
            "output_format_json_quote_64bit_integers": 0,
            "readonly": 1,
        }


class ByteSource(Protocol):
    """Where a result's bytes come from: the engine's response, or an analyst process's answer."""

    def read(self, size: int = -1, /) -> bytes: ...
    def close(self) -> None: ...


class SqlStream:
    """One running query's result: iterate for chunks; ``close()`` ends it early and frees its session."""

    def __init__(self, first: bytes, source: ByteSource, done: Any,
                 admission: Admission | None = None) -> None:
        self._first = first
        self._source = source
        self._done = done
        self._admission = admission
        self._closed = False

    def __iter__(self) -> Iterator[bytes]:
        """The chunks; a failure past the first chunk ends the body with the error text on a line of its
        own, as a ClickHouse server does over HTTP (the status is already sent)."""
        try:
            yield from self.chunks()
        except SqlError as exc:
            yield f"\n{exc}\n".encode()

    def chunks(self) -> Iterator[bytes]:
        """The chunks; a failure past the first chunk raises (as ``SqlError``) instead of ending the bytes."""
        broken = True
        try:
            if self._first:
                yield self._first
            try:
                while chunk := _read(self._source):
                    yield chunk
            except Exception as exc:
                raise self._error(exc) from exc
            broken = False
        finally:
            self._finish(broken)

    def read_all(self) -> bytes:
        """The whole result; a failure past the first chunk raises instead of ending the bytes."""
        return b"".join(self.chunks())

    def close(self) -> None:
        self._finish(broken=True)

    def _error(self, exc: BaseException) -> SqlError:
        return as_sql_error(exc, self._admission.reason if self._admission is not None else None)

    def _finish(self, broken: bool) -> None:
        if not self._closed:
            self._closed = True
            self._source.close()
            self._done(broken)


class AnalystSql:
    """Guarded read-only queries on sessions of their own, in two pools (``trainers``, ``analysts``) of a
    few sessions each, a key holding at most its share of its pool."""

    def __init__(self, dsn: str, database: str | None = None, limits: SqlLimits | None = None,
                 control_dsn: str | None = None, processes: AnalystProcesses | None = None) -> None:
        """``database`` is the pool's; ``None`` means the DSN's own (its current database).
        ``control_dsn`` kills overrunning queries (``KILL QUERY``; default ``dsn``): on a server, a user
        allowed to, where ``dsn`` is the analysts' read-only one. ``processes``: where keyed analysts'
        queries run instead of this process (the embedded pool; see ``clawr1.pool.analyst_processes``)."""
        self.dsn = dsn
        self.processes = processes
        self.database = database
        self.limits = limits or SqlLimits()
        self._control_dsn = control_dsn or dsn
        self._control: Client | None = None
        self._control_lock = threading.Lock()
        self.ledger = Ledger(self.limits, self.kill)
        self._idle: dict[str, list[tuple[Client, str]]] = {TRAINERS: [], ANALYSTS: []}
        self._lock = threading.Lock()
        self._catalogue: Catalogue | None = None
        self._accepted: LRUCache[str, Checked] = LRUCache(GUARD_CACHE_ENTRIES)

    def admit(self, caller: Caller | None = None) -> Admission:
        """A place in the caller's pool, or ``SqlBusy`` naming what is full."""
        return self.ledger.admit(caller or Caller())

    def stream(self, sql: str, fmt: str = "JSONEachRow", parameters: Mapping[str, Any] | None = None,
               max_rows: int | None = None, admission: Admission | None = None) -> SqlStream:
        """Guard ``sql`` and start it; errors up to its first chunk raise here, as ``SqlError``s.
        ``admission``: the query's place, from ``admit`` (taken here for a key-less caller without one);
        it is released when the returned stream ends, or here on an error."""
        admission = admission or self.admit()
        try:
            text = _statement(sql, fmt)
        except SqlError:
            admission.release()
            raise
        pool = admission.caller.pool
        if self.processes is not None and pool == ANALYSTS and admission.caller.limited:
            return self._stream_apart(self.processes, text, fmt, parameters or {}, max_rows, admission)
        limits = self.limits
        if max_rows is not None and max_rows < limits.max_result_rows:
            limits = replace(limits, max_result_rows=max_rows)
        session: tuple[Client, str] | None = None
        try:
            session = self._session(limits, pool)
            client, tag = session
            checked = self._guard(client, text)
            values = _parameters(checked, parameters or {})
            running = admission.started(tag, float(limits.max_execution_time))
            source: IO[bytes]
            if checked.streams:
                # clickhouse-connect types raw_stream for its sync and async clients together; the sync
                # Client's is the HTTP response, a binary file object (its StreamContext is async only).
                source = cast(IO[bytes], client.raw_stream(checked.text, parameters=values or None, fmt=fmt,
                                                           settings=running))
            else:
                source = io.BytesIO(client.raw_query(checked.text, parameters=values or None, fmt=fmt,
                                                     settings=running))
            first = _read(source)
        except BaseException as exc:
            self._release(session, limits, pool, broken=True)
            admission.release()
            if isinstance(exc, Exception):
                raise as_sql_error(exc, admission.reason) from exc
            raise

        def done(broken: bool) -> None:
            self._release(session, limits, pool, broken)
            admission.release()

        return SqlStream(first, source, done, admission)

    def _stream_apart(self, processes: AnalystProcesses, text: str, fmt: str, parameters: Mapping[str, Any],
                      max_rows: int | None, admission: Admission) -> SqlStream:
        """The query in an analyst process of its own; killing that process stops it at its limit."""
        tag = f"clawr1-sql-{uuid.uuid4().hex}"
        try:
            first, source = processes.stream(text, fmt, parameters, max_rows, admission,
                                             float(self.limits.max_execution_time), tag)
        except BaseException as exc:
            admission.release()
            if isinstance(exc, Exception):
                raise as_sql_error(exc, admission.reason) from exc
            raise
        return SqlStream(first, source, lambda _broken: admission.release(), admission)

    def run(self, sql: str, fmt: str = "JSONEachRow", parameters: Mapping[str, Any] | None = None,
            max_rows: int | None = None) -> bytes:
        """The whole result of one guarded query (for the CLI and tests; the API streams)."""
        return self.stream(sql, fmt, parameters, max_rows).read_all()

    def check(self, sql: str) -> Checked:
        """The guard alone: what would run for ``sql``, or ``WriteRefused``/``SqlError``."""
        text = sql.strip().rstrip(";").rstrip()
        session = self._session(self.limits, ANALYSTS)
        try:
            return self._guard(session[0], text)
        except Exception as exc:
            raise as_sql_error(exc) from exc
        finally:
            self._release(session, self.limits, ANALYSTS, broken=False)

    def kill(self, query_id: str, tag: str) -> bool:
        """``KILL QUERY`` the query ``query_id`` (a server's) or the one running on the session ``tag``
        (chDB's), without waiting: the engine stops it at its next block; one in an analyst process ends
        with that process."""
        if self.processes is not None and self.processes.kill(tag):
            return True
        with self._control_lock:
            try:
                if self._control is None:
                    self._control = open_client(self._control_dsn, what="the SQL control session")
                self._control.command("KILL QUERY WHERE query_id = {q:String} OR Settings['log_comment'] = "
                                      "{t:String} ASYNC", parameters={"q": query_id, "t": tag})
            except (ClickHouseError, PoolError):
                # Its own limit still stops it between blocks; the caller was answered already.
                pass
        return False

    def close(self) -> None:
        if self.processes is not None:
            self.processes.close()
        with self._lock:
            idle = [client for sessions in self._idle.values() for client, _ in sessions]
            self._idle = {TRAINERS: [], ANALYSTS: []}
        for client in idle:
            client.close()
        with self._control_lock:
            if self._control is not None:
                self._control.close()
                self._control = None

    def _guard(self, client: Client, text: str) -> Checked:
        """The guard's verdict on ``text``; an accepted text is remembered (the verdict depends only on
        the text, the pool database and the engine's function catalogue, all fixed for this object)."""
        with self._lock:
            if (known := self._accepted.get(text)) is not None:
                return known
        checked = self._parse_and_check(client, text)
        with self._lock:
            self._accepted[text] = checked
        return checked

    def _parse_and_check(self, client: Client, text: str) -> Checked:
        catalogue = self._catalogue or self._load_catalogue(client)
        if self.database is None:
            self.database = str(client.query("SELECT currentDatabase()").result_rows[0][0])
        try:
            tree = json.loads(client.raw_query("SELECT parseQueryToJSON({q:String})", parameters={"q": text},
                                               fmt="RawBLOB"))
        except ClickHouseError as exc:
            if pool_error(exc).code != NO_JSON_ERROR_CODE:
                raise
            canonical = client.raw_query("SELECT formatQuerySingleLine({q:String})", parameters={"q": text},
                                         fmt="RawBLOB").decode()
            return check_canonical(canonical, str(self.database))
        except RecursionError as exc:
            raise SqlError("the query nests too deeply") from exc
        return check_tree(tree, text, str(self.database), catalogue)

    def _load_catalogue(self, client: Client) -> Catalogue:
        functions = [json.loads(line) for line in client.raw_query(CATALOGUE_QUERY).splitlines()]
        combinators = [json.loads(line)["name"] for line in client.raw_query(COMBINATORS_QUERY).splitlines()]
        self._catalogue = Catalogue.build(functions, combinators)
        return self._catalogue

    def _session(self, limits: SqlLimits, pool: str) -> tuple[Client, str]:
        """A session of ``pool`` and its tag (chDB finds its running query by the tag)."""
        if limits == self.limits:
            with self._lock:
                if self._idle[pool]:
                    return self._idle[pool].pop()
        tag = f"clawr1-sql-{uuid.uuid4().hex}"
        return open_session(self.dsn, self.database, limits, pool, tag), tag

    def _release(self, session: tuple[Client, str] | None, limits: SqlLimits, pool: str,
                 broken: bool) -> None:
        if session is not None:
            if broken or limits != self.limits:
                session[0].close()
            else:
                with self._lock:
                    self._idle[pool].append(session)


def open_session(dsn: str, database: str | None, limits: SqlLimits, pool: str = ANALYSTS,
                 tag: str = "") -> Client:
    """A client whose every query runs with ``limits`` and ``readonly = 1``, set before anything runs.

    On chDB the settings are ``SET`` on the client's own handle, ``readonly`` last (and ``tag`` as the
    session's ``log_comment``, by which its running query is found); on a server they travel with every
    request (a server profile that already pins ``readonly`` skips that one).
    """
    settings = limits.session_settings(pool)
    if tag and is_embedded(dsn):
        settings = {"log_comment": tag, **settings}
    return open_client(dsn, database, settings, what="an analyst session on the pool")


def _statement(sql: str, fmt: str) -> str:
    """The query's text, without a trailing ``;``; ``SqlError`` for an unknown format or a bad length."""
    if fmt not in OUTPUT_FORMATS:
        raise SqlError(f"unknown format {fmt!r}; one of {', '.join(OUTPUT_FORMATS)}")
    text = sql.strip().rstrip(";").rstrip()
    if not text:
        raise SqlError("empty query")
    if len(text) > MAX_QUERY_CHARS:
        raise SqlError(f"query longer than {MAX_QUERY_CHARS} characters")
    return text


def _parameters(checked: Checked, given: Mapping[str, Any]) -> dict[str, Any]:
    """The values for the statement's ``{name:Type}`` parameters: every one given, none extra.

    Binding is always server-side (a value never becomes SQL text), so a ``%`` in the query stays a ``%``.
    """
    bad = sorted(name for name in given if not _PARAMETER_NAME.fullmatch(name))
    if bad:
        raise SqlError(f"parameter names must be identifiers: {bad}")
    unused = sorted(set(given) - checked.parameters)
    if unused:
        raise SqlError(f"parameters not used by the query: {unused}")
    missing = sorted(checked.parameters - set(given))
    if missing:
        raise SqlError(f"no value given for the query's parameters {missing}")
    if given and not external_bind_re.search(checked.text):
        raise SqlError("write query parameters as {name:Type}")
    return dict(given)


def _read(source: ByteSource) -> bytes:
    return source.read(CHUNK_BYTES) or b""


def as_sql_error(exc: BaseException, cancelled: str | None = None) -> SqlError:
    """Our error for whatever stopped a query: refusals are 403s, everything else is a bad request.
    ``cancelled``: why the query was killed, when it was (the engine only says that it was)."""
    if cancelled is not None and isinstance(exc, AnalystKilled):
        return SqlError(cancelled)
    if isinstance(exc, SqlError):
        return exc
    if isinstance(exc, GuardRefusal):
        return WriteRefused(str(exc))
    error = pool_error(exc) if isinstance(exc, ClickHouseError) else exc
    message = _PARSE_SCOPE.sub("", str(error)).strip()
    code = getattr(error, "code", None)
    if cancelled is not None and code in (CANCELLED_ERROR_CODE, TIMEOUT_ERROR_CODE):
        return SqlError(cancelled)
    if code == READONLY_ERROR_CODE:
        return WriteRefused(message)
    if code == SYNTAX_ERROR_CODE and "Multi-statements are not allowed" in message:
        return WriteRefused(f"only one statement per request: {message}")
    if isinstance(error, PoolError | TypeError | ValueError):
        return SqlError(message)
    raise exc
