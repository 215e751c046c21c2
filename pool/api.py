"""HTTP face of the pool, mounted into the gateway app by the process that owns the pool.

- ``POST /v1/sql``: one read-only query, answered in the requested ClickHouse format.
- ``POST /v1/pool/insert/{table}``: JSON rows into one of the consumer SDK's tables
  (``pool.consumer_tables.CONSUMER_WRITABLE_TABLES``); ClickHouse parses and type-checks them.

chDB allows one process per data path, so the SDK, dashboard and SQL CLI of other processes read and
write the embedded pool through these two routes.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from pydantic import BaseModel, Field

from pool.consumer_tables import CONSUMER_WRITABLE_TABLES, OWNER_COLUMNS
from pool.sql import OUTPUT_FORMATS, SqlError, SqlLimits, WriteRefused, run_read_only
from pool.store import PoolError, PoolStore

MAX_INSERT_ROWS = 100_000
# A misspelled column must fail loudly, not vanish.
_STRICT_JSON_INPUT = {"input_format_skip_unknown_fields": 0}


class SqlRequest(BaseModel):
    query: str = Field(min_length=1, description="one read-only statement, without FORMAT")
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


def pool_router(store: PoolStore, limits: SqlLimits | None = None) -> APIRouter:
    """Routes over ``store``; give it a store of its own so long queries never hold up the sink."""
    base_limits = limits or SqlLimits()
    router = APIRouter(tags=["pool"])

    @router.post("/v1/sql", response_class=Response, responses={
        400: {"description": "bad SQL (ClickHouse's error text), unknown format, limits exceeded"},
        403: {"description": "not a read-only statement"},
    })
    async def sql(request: SqlRequest) -> Response:
        limits_now = base_limits
        if request.max_rows is not None and request.max_rows < base_limits.max_result_rows:
            limits_now = SqlLimits(base_limits.max_execution_time, request.max_rows,
                                   base_limits.max_result_bytes)
        try:
            body = await run_in_threadpool(run_read_only, store, request.query, request.format, limits_now,
                                           request.parameters)
        except WriteRefused as exc:
            raise HTTPException(403, str(exc)) from exc
        except SqlError as exc:
            raise HTTPException(400, str(exc)) from exc
        return Response(body, media_type=OUTPUT_FORMATS[request.format])

    @router.post("/v1/pool/insert/{table}", response_model=InsertReply, responses={
        400: {"description": "rows that do not fit the table (ClickHouse's error text)"},
        403: {"description": "the table is not writable through the API, or a row is another key's group"},
    })
    async def insert(table: str, request: InsertRequest, http: Request) -> InsertReply:
        if table not in CONSUMER_WRITABLE_TABLES:
            raise HTTPException(403, f"table {table!r} is not writable; writable: "
                                     f"{', '.join(sorted(CONSUMER_WRITABLE_TABLES))}")
        # Set by the gateway when API keys are configured: a consume key writes only its own groups.
        key = getattr(http.state, "api_key", None)
        column = OWNER_COLUMNS[table]
        if key is not None and (foreign := {str(row.get(column)) for row in request.rows
                                            if not isinstance(row.get(column), str)
                                            or not key.owns_group(row[column])}):
            raise HTTPException(403, f"the API key of {key.name!r} may write only {column} {key.name!r} or "
                                     f"{key.name + ':...'!r}, not {', '.join(sorted(foreign)[:5])}")
        if not request.rows:
            return InsertReply(table=table, rows=0)
        data = "\n".join(json.dumps(row, separators=(",", ":")) for row in request.rows).encode()
        try:
            await run_in_threadpool(store.insert_raw, table, data, "JSONEachRow", None, request.dedup_token,
                                    _STRICT_JSON_INPUT)
        except PoolError as exc:
            raise HTTPException(400, str(exc)) from exc
        return InsertReply(table=table, rows=len(request.rows))

    return router
