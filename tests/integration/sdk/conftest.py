"""SDK fixtures over the real pool (tests/support/pool.py): a migrated database per module, emptied
for each test, and the pool's HTTP API served by hypercorn on a free port.

chDB opens one engine path per process: the session uses one path (or CLAWR1_TEST_POOL_DSN, an
``http://`` DSN of a ClickHouse server) and one migrated database per module; each test starts from
empty tables.
Written blocks never repeat (every row has its own source offset), so the pool's insert
deduplication cannot drop a test's rows.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi import FastAPI

from clawr1.pool.api import pool_router
from clawr1.pool.consumer_tables import CONSUMER_WRITABLE_TABLES
from clawr1.pool.migrations import DELIVERY_LOG
from clawr1.pool.store import PoolStore, quote_identifier
from clawr1.sinks.rows import STEPS_ROUTE
from tests.support.asgi import serve_asgi
from tests.support.pool import Pool, database_dsn, fresh_pool_store


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
