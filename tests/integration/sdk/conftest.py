"""SDK fixtures over the real pool: PoolStore + migrations, rows through the sink's own row mapping,
and the pool's HTTP API served by hypercorn on a free port.

chDB opens one engine path per process: the session uses one path (or CLAWR1_TEST_POOL_DSN, an
``http://`` DSN of a ClickHouse server) and one migrated database per module; each test starts from
empty tables.
Written blocks never repeat (every row has its own source offset), so the pool's insert
deduplication cannot drop a test's rows.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from fastapi import FastAPI

from clawr1.pool.api import pool_router
from clawr1.pool.consumer_tables import CONSUMER_WRITABLE_TABLES
from clawr1.pool.migrations import DELIVERY_LOG
from clawr1.pool.store import PoolStore, quote_identifier
from clawr1.sinks.rows import STEPS_ROUTE, Origin
from tests.conftest import fresh_pool_store
from tests.support.asgi import serve_asgi
from tests.support.records import step as step_record

_offsets = itertools.count()


def database_dsn(dsn: str, database: str) -> str:
    """``dsn`` pointed at ``database`` (chDB takes it as a query parameter, a server as the path)."""
    if dsn.startswith("chdb:"):
        return f"{dsn}?database={database}"
    return urlunsplit(urlsplit(dsn)._replace(path=f"/{database}"))


def sdk_direct_source(dsn: str) -> str:
    """How a trainer spells a direct DSN for the SDK: ``http://`` alone would mean the Claw-R1 API."""
    scheme = urlsplit(dsn).scheme
    return dsn if scheme == "chdb" else dsn.replace(f"{scheme}://", f"clickhouse+{scheme}://", 1)


def step(step_id: str, *, trajectory_id: str | None = None, step_index: int = 0, version: int = 1,
         ready: bool = True, **fields: Any) -> dict[str, Any]:
    """A complete step record (schema defaults), ready unless told otherwise."""
    return step_record(step_id, version=version, trajectory_id=trajectory_id or f"traj-{step_id}",
                       step_index=step_index, ready=ready, **fields)


@dataclass
class Pool:
    store: PoolStore
    dsn: str
    """This test's database, as a DSN a PoolStore takes."""

    @property
    def direct_source(self) -> str:
        return sdk_direct_source(self.dsn)

    def write(self, *records: dict[str, Any], ingested_at_ms: int | None = None) -> None:
        """Store step versions the way the sink does: its row mapping, one insert."""
        now_ms = ingested_at_ms if ingested_at_ms is not None else int(time.time() * 1000)
        rows = [STEPS_ROUTE.to_row(r, Origin("clawr1.steps", 0, next(_offsets), None, None), now_ms)
                for r in records]
        self.store.insert(STEPS_ROUTE.table, rows, STEPS_ROUTE.columns)


@pytest.fixture(scope="module")
def module_pool(pool_dsn: str) -> Iterator[Pool]:
    """One migrated pool database per test module (migrations cost more than the tests themselves).

    Closed at the module's end, so no chDB client of this suite stays open while another suite's
    tests open their own engine path.
    """
    with fresh_pool_store(pool_dsn, "sdk") as store:
        yield Pool(store=store, dsn=database_dsn(pool_dsn, store.database))


@pytest.fixture
def pool(module_pool: Pool) -> Pool:
    """The module's pool, emptied of steps (and their delivery log), commits, positions and presets."""
    for table in sorted({STEPS_ROUTE.table, DELIVERY_LOG, *CONSUMER_WRITABLE_TABLES}):
        module_pool.store.command(f"TRUNCATE TABLE {quote_identifier(table)}")
    return module_pool


@pytest.fixture(scope="module")
def api_url(module_pool: Pool) -> Iterator[str]:
    """The pool's HTTP API over the module's database, with a store of its own (as the stack runs it)."""
    store = PoolStore(module_pool.dsn)
    app = FastAPI()
    app.include_router(pool_router(store))
    try:
        with serve_asgi(app) as server:
            yield server.url
    finally:
        store.close()


@pytest.fixture(params=["direct", "api"])
def source(request: pytest.FixtureRequest, pool: Pool) -> str:
    """The SDK source for this test's pool, once per transport."""
    if request.param == "direct":
        return pool.direct_source
    return str(request.getfixturevalue("api_url"))
