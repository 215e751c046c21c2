"""HTTP face of the pool, mounted into the gateway app by the process that owns the pool.

- ``POST /v1/sql``: one read-only query, answered in the requested ClickHouse format.
- ``POST /v1/pool/insert/{table}``: rows into one of the consumer SDK's tables
  (``clawr1.pool.consumer_tables.CONSUMER_WRITABLE_TABLES``), as JSON or as an Arrow IPC stream
  (``Content-Type: application/vnd.apache.arrow.stream``, what the SDK sends); ClickHouse parses and
  type-checks them.

chDB allows one process per data path, so the SDK, dashboard and SQL CLI of other processes read and
write the embedded pool through these two routes.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from fastapi import APIRouter, HTTPException, Request
from fastapi.concurrency import iterate_in_threadpool, run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, Field, ValidationError

from clawr1.pool.admission import ANALYSTS, TRAINERS, Admission, Caller, SqlBusy, SqlError, overran
from clawr1.pool.analyst_processes import AnalystProcessError
from clawr1.pool.consumer_tables import CONSUMER_WRITABLE_TABLES, OWNER_COLUMNS
from clawr1.pool.sql import MAX_QUERY_CHARS, OUTPUT_FORMATS, AnalystSql, SqlStream, WriteRefused
from clawr1.pool.store import PoolError, PoolStore
from clawr1.pool.watchdog import WATCHDOG_GRACE_S

MAX_INSERT_ROWS = 100_000
CLIENT_GONE = "the client went away"
ARROW_STREAM = "application/vnd.apache.arrow.stream"
# A misspelled column must fail loudly, not vanish.
_STRICT_JSON_INPUT = {"input_format_skip_unknown_fields": 0}


class SqlRequest(BaseModel):
    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS, description="one read-only statement, "
                       "without FORMAT or SETTINGS")
    format: str = Field("JSONEachRow", description=f"one of: {', '.join(OUTPUT_FORMATS)}")
    max_rows: int | None = Field(None, ge=1, description="lower the server's result row limit")
    parameters: dict[str, Any] = Field(default_factory=dict,
                                       description="values of the query's {name:Type} parameters")


class InsertRequest(BaseModel):
    rows: list[dict[str, Any]] = Field(max_length=MAX_INSERT_ROWS)
    dedup_token: str | None = Field(None, max_length=200,
                                    description="a repeated token makes the pool drop the repeated insert")


class InsertReply(BaseModel):
    table: str
    rows: int


def caller_of(http: Request) -> Caller:
    """A ``consume`` key is a trainer, any other key an analyst, each holding its share of its pool; without
    keys every request is the one caller."""
    key = getattr(http.state, "api_key", None)
    if key is None:
        return Caller()
    return Caller(key.name, TRAINERS if "consume" in key.kinds else ANALYSTS, limited=True)


async def _client_gone(http: Request) -> None:
    """Returns once the client has disconnected (its body was read already)."""
    while (await http.receive())["type"] != "http.disconnect":
        pass


async def _first_chunk(http: Request, analyst: AnalystSql, admission: Admission,
                       request: SqlRequest) -> SqlStream:
    """The started query, or its error. The caller is answered by the time limit at the latest, and a query
    whose caller leaves or that overruns is killed (it then frees its session once the engine stops)."""
    started = asyncio.ensure_future(run_in_threadpool(analyst.stream, request.query, request.format,
                                                      request.parameters, request.max_rows, admission))
    gone = asyncio.ensure_future(_client_gone(http))
    limit = float(analyst.limits.max_execution_time) + WATCHDOG_GRACE_S
    try:
        done, _ = await asyncio.wait({started, gone}, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if started in done:
        return started.result()
    reason = CLIENT_GONE if gone in done else overran(float(analyst.limits.max_execution_time))
    await run_in_threadpool(admission.cancel, reason)
    started.add_done_callback(_close_late)
    raise SqlError(reason)


def _close_late(started: asyncio.Future[SqlStream]) -> None:
    """A result that arrives for a caller no longer waiting is closed at once (its session freed)."""
    if not started.cancelled() and started.exception() is None:
        started.result().close()


async def _chunks(result: SqlStream, admission: Admission) -> AsyncIterator[bytes]:
    """The result's chunks; a client that leaves mid-stream gets its query killed."""
    finished = False
    try:
        async for chunk in iterate_in_threadpool(iter(result)):
            yield chunk
        finished = True
    finally:
        if not finished:
            await run_in_threadpool(admission.cancel, CLIENT_GONE)


def pool_router(store: PoolStore, analyst: AnalystSql | None = None) -> APIRouter:
    """Routes over ``store``; analyst SQL runs on ``analyst``'s own read-only sessions (by default on the
    store's DSN and database with the default limits), so a long query never holds up ``store``'s users."""
    analyst_sql = analyst or AnalystSql(store.dsn, store.database)
    router = APIRouter(tags=["pool"])

    @router.post("/v1/sql", response_class=Response, responses={
        400: {"description": "bad SQL (ClickHouse's error text), unknown format, limits exceeded"},
        403: {"description": "refused: not a read of the pool (writes, settings, files, network, system)"},
        429: {"description": "the caller's pool (trainers or analysts), or its key's share of it, is busy"},
        503: {"description": "an analyst process could not start, or ended before its answer"},
    })
    async def sql(request: SqlRequest, http: Request) -> Response:
        """The result streams; an error past the first chunk ends the body with the error's text. A
        query past the time limit, or whose client leaves, is killed."""
        try:
            admission = analyst_sql.admit(caller_of(http))
            result = await _first_chunk(http, analyst_sql, admission, request)
        except WriteRefused as exc:
            raise HTTPException(403, str(exc)) from exc
        except SqlBusy as exc:
            raise HTTPException(429, str(exc)) from exc
        except AnalystProcessError as exc:
            raise HTTPException(503, str(exc)) from exc
        except SqlError as exc:
            raise HTTPException(400, str(exc)) from exc
        return StreamingResponse(_chunks(result, admission), media_type=OUTPUT_FORMATS[request.format])

    @router.post("/v1/pool/insert/{table}", response_model=InsertReply, responses={
        400: {"description": "rows that do not fit the table (ClickHouse's error text), or no Arrow stream"},
        403: {"description": "the table is not writable through the API, or a row is another key's group"},
    }, openapi_extra={"requestBody": {"required": True, "content": {
        "application/json": {"schema": InsertRequest.model_json_schema()},
        ARROW_STREAM: {"schema": {"type": "string", "format": "binary",
                                  "description": f"at most {MAX_INSERT_ROWS} rows, no dedup token"}},
    }}})
    async def insert(table: str, http: Request) -> InsertReply:
        """The rows as JSON (``InsertRequest``) or as one Arrow IPC stream, whose columns name the table's."""
        if table not in CONSUMER_WRITABLE_TABLES:
            raise HTTPException(403, f"table {table!r} is not writable; writable: "
                                     f"{', '.join(sorted(CONSUMER_WRITABLE_TABLES))}")
        body = await http.body()
        column = OWNER_COLUMNS[table]
        if http.headers.get("content-type", "").split(";")[0].strip() == ARROW_STREAM:
            arrow = _arrow_rows(body, column)
            owners: list[Any] = pc.unique(arrow.column(column)).to_pylist()
            rows, data, fmt, columns = arrow.num_rows, body, "ArrowStream", arrow.column_names
            dedup_token, settings = None, None
        else:
            try:
                request = InsertRequest.model_validate_json(body)
            except ValidationError as exc:
                raise RequestValidationError(exc.errors(include_url=False)) from exc
            owners = [row.get(column) for row in request.rows]
            rows, fmt, columns = len(request.rows), "JSONEachRow", None
            data = "\n".join(json.dumps(row, separators=(",", ":")) for row in request.rows).encode()
            dedup_token, settings = request.dedup_token, _STRICT_JSON_INPUT
        # Set by the gateway when API keys are configured: a consume key writes only its own groups.
        key = getattr(http.state, "api_key", None)
        if key is not None and (foreign := {str(owner) for owner in owners
                                            if not isinstance(owner, str) or not key.owns_group(owner)}):
            raise HTTPException(403, f"the API key of {key.name!r} may write only {column} {key.name!r} or "
                                     f"{key.name + ':...'!r}, not {', '.join(sorted(foreign)[:5])}")
        if not rows:
            return InsertReply(table=table, rows=0)
        try:
            await run_in_threadpool(store.insert_raw, table, data, fmt, columns, dedup_token, settings)
        except PoolError as exc:
            raise HTTPException(400, str(exc)) from exc
        return InsertReply(table=table, rows=rows)

    return router


def _arrow_rows(body: bytes, owner: str) -> pa.Table:
    """The rows of an Arrow stream body; refused (400) when it is none, too long, names a column twice
    (which one would the owner check read?) or lacks the owner."""
    try:
        table = pa.ipc.open_stream(body).read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise HTTPException(400, f"the body is not an Arrow IPC stream: {exc}") from exc
    if table.num_rows > MAX_INSERT_ROWS:
        raise HTTPException(400, f"at most {MAX_INSERT_ROWS} rows per insert, got {table.num_rows}")
    if repeated := sorted(name for name, times in Counter(table.column_names).items() if times > 1):
        named = ", ".join(map(repr, repeated))
        raise HTTPException(400, f"the stream names the column {named} more than once")
    if owner not in table.column_names:
        raise HTTPException(400, f"the rows need the column {owner!r}")
    return table
