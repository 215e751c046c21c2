"""Shared fixtures: one real Kafka broker per test session, unique topic names per test.

Set CLAWR1_TEST_KAFKA_BOOTSTRAP to use an already running broker instead of starting one.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clawr1.broker.launcher import KafkaBroker
from clawr1.pool.store import PoolStore
from tests.support.pool import fresh_pool_store
from tests.support.ports import free_port

INTEGRATION = Path(__file__).resolve().parent / "integration"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/integration/ is an integration test: the folder is the marker."""
    for item in items:
        if item.path.is_relative_to(INTEGRATION):
            item.add_marker(pytest.mark.integration)


WITHOUT_A_BROKER = (
    "tests/integration/sdk/",
    "tests/integration/dashboard/test_dashboard_channel.py",
    "tests/integration/dashboard/test_dashboard_page.py",
    "tests/integration/dashboard/test_dashboard_steps.py",
    "tests/integration/dashboard/test_dashboard_summary.py",
    "tests/integration/dashboard/test_dashboard_trajectory.py",
    "tests/integration/pool/test_pool_analyst_processes.py",
    "tests/integration/pool/test_pool_api.py",
    "tests/integration/pool/test_pool_id_lookup.py",
    "tests/integration/pool/test_pool_indexes.py",
    "tests/integration/pool/test_pool_retention.py",
    "tests/integration/pool/test_pool_sink_columns.py",
    "tests/integration/pool/test_pool_sql_guard.py",
    "tests/integration/pool/test_pool_store.py",
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist (``make test`` runs ``-n 2``) the integration tests are one unit of work, so one
    process runs them in order, on one broker and the shared stacks, exactly as a plain run does; the unit
    tests, one unit each, go to the other process (most of the integration tests' time is waiting on
    brokers and processes, so the second core has room). The integration tests in ``WITHOUT_A_BROKER``
    need neither a broker nor a process of their own (the pool in chDB, an API in a thread): they are a
    unit of their own, run in the other process before the unit tests (one listed here that came to need
    a broker would start its own in that process: slower, still right). xdist's own ``xdist_group`` marker
    cannot do this on pytest 9 (it rewrites a node id pytest no longer reads)."""
    from xdist.scheduler import LoadScopeScheduling

    class IntegrationInOrder(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(WITHOUT_A_BROKER):
                return "integration-without-a-broker"
            return "integration" if nodeid.startswith("tests/integration/") else nodeid

    return IntegrationInOrder(config, log)


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    external = os.environ.get("CLAWR1_TEST_KAFKA_BOOTSTRAP")
    if external:
        yield external
        return
    port = free_port()
    broker = KafkaBroker(
        data_dir=Path(tmp_path_factory.mktemp("kafka")), port=port, controller_port=free_port(), heap="768m"
    )
    broker.start()
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


@pytest.fixture
def unique() -> str:
    """A short unique suffix for topic, group and id names, so tests never see each other's data."""
    return uuid.uuid4().hex[:10]


@pytest.fixture(scope="session")
def pool_dsn(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One pool DSN per test session: chDB opens one engine path per process, so every test shares it
    and isolates itself in its own database. CLAWR1_TEST_POOL_DSN points the tests at a ClickHouse server."""
    external = os.environ.get("CLAWR1_TEST_POOL_DSN")
    if external:
        return external
    return f"chdb://{tmp_path_factory.mktemp('pool-session').resolve()}"


@pytest.fixture
def pool_store(pool_dsn: str) -> Iterator[PoolStore]:
    """A migrated PoolStore on a fresh database of the session pool, dropped after the test."""
    with fresh_pool_store(pool_dsn) as store:
        yield store
