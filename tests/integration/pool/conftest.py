"""Pool fixtures: one chDB engine path for the whole test session, a fresh database per test.

chDB opens one engine path per process at a time (another path fails while any client is open), so
every test in the pytest process shares the session's path and isolates itself in its own database.
Set CLAWR1_TEST_POOL_DSN (an ``http://`` DSN) to run the same tests against a ClickHouse server.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from pool.store import PoolStore, quote_identifier


@pytest.fixture(scope="session")
def pool_dsn(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The session's pool DSN: CLAWR1_TEST_POOL_DSN, else an embedded chDB path under pytest's tmp dir."""
    external = os.environ.get("CLAWR1_TEST_POOL_DSN")
    if external:
        return external
    return f"chdb://{tmp_path_factory.mktemp('pool-session').resolve()}"


@pytest.fixture
def pool_store(pool_dsn: str) -> Iterator[PoolStore]:
    """A migrated PoolStore on its own database of the session pool, dropped after the test."""
    database = f"t_{uuid.uuid4().hex[:12]}"
    store = PoolStore(pool_dsn, database=database)
    try:
        store.migrate()
        yield store
    finally:
        store.command(f"DROP DATABASE IF EXISTS {quote_identifier(database)}")
        store.close()
