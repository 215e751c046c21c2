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

import json
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from fastapi import APIRouter, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, Field, ValidationError

from clawr1.pool.consumer_tables import CONSUMER_WRITABLE_TABLES, OWNER_COLUMNS
from clawr1.pool.sql import MAX_QUERY_CHARS, OUTPUT_FORMATS, AnalystSql, SqlBusy, SqlError, WriteRefused
from clawr1.pool.store import PoolError, PoolStore

MAX_INSERT_ROWS = 100_000
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


def pool_router(store: PoolStore, analyst: AnalystSql | None = None) -> APIRouter:
    """Routes over ``store``; analyst SQL runs on ``analyst``'s own read-only sessions (by default on the
    store's DSN and database with the default limits), so a long query never holds up ``store``'s users."""
    analyst_sql = analyst or AnalystSql(store.dsn, store.database)
    router = APIRouter(tags=["pool"])

    @router.post("/v1/sql", response_class=Response, responses={
        400: {"description": "bad SQL (ClickHouse's error text), unknown format, limits exceeded"},
        403: {"description": "refused: not a read of the pool (writes, settings, files, network, system)"},
        429: {"description": "every analyst session is busy"},
    })
    async def sql(request: SqlRequest) -> Response:
        """The result streams; an error past the first chunk ends the body with the error's text."""
        try:
            result = await run_in_threadpool(analyst_sql.stream, request.query, request.format,
                                             request.parameters, request.max_rows)
        except WriteRefused as exc:
            raise HTTPException(403, str(exc)) from exc
        except SqlBusy as exc:
            raise HTTPException(429, str(exc)) from exc
        except SqlError as exc:
            raise HTTPException(400, str(exc)) from exc
        return StreamingResponse(iter(result), media_type=OUTPUT_FORMATS[request.format])

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
    """The rows of an Arrow stream body; refused (400) when it is none, too long, or lacks the owner."""
    try:
        table = pa.ipc.open_stream(body).read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise HTTPException(400, f"the body is not an Arrow IPC stream: {exc}") from exc
    if table.num_rows > MAX_INSERT_ROWS:
        raise HTTPException(400, f"at most {MAX_INSERT_ROWS} rows per insert, got {table.num_rows}")
    if owner not in table.column_names:
        raise HTTPException(400, f"the rows need the column {owner!r}")
    return table
