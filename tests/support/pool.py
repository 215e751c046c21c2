"""The pool as the tests use it: a migrated database of its own (dropped after), steps written the way
the sink writes them, the DSNs a trainer would give the SDK for it, the sink run until it committed
its topics, and which granules a query's indexes kept."""

from __future__ import annotations

import itertools
import re
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from clawr1.core.settings import Settings
from clawr1.pool.store import PoolStore, quote_identifier
from clawr1.sinks.config import SinkConfig
from clawr1.sinks.rows import STEPS_ROUTE, Origin
from clawr1.sinks.runner import run_sink
from tests.support.kafka import wait_committed
from tests.support.records import step as step_record


@contextmanager
def fresh_pool_store(pool_dsn: str, prefix: str = "t") -> Iterator[PoolStore]:
    """A migrated PoolStore on a fresh database (``<prefix>_<random>``) of the pool at ``pool_dsn``,
    dropped and closed on exit; ``store.database`` names it."""
    database = f"{prefix}_{uuid.uuid4().hex[:12]}"
    store = PoolStore(pool_dsn, database=database)
    try:
        store.migrate()
        yield store
    finally:
        store.command(f"DROP DATABASE IF EXISTS {quote_identifier(database)}")
        store.close()


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


def granules(store: PoolStore, sql: str) -> dict[str, tuple[int, int]]:
    """Per index (PrimaryKey or skip index name): granules kept / granules before it."""
    plan = "\n".join(r["explain"] for r in store.query(f"EXPLAIN indexes = 1 {sql}"))
    found: dict[str, tuple[int, int]] = {}
    for block in re.split(r"\n\s*(?=PrimaryKey\b|Skip\b|PrimaryKeyExpand\b)", plan):
        kind = block.strip().split()[0] if block.strip() else ""
        name = re.search(r"Name: (\w+)", block)
        counts = re.search(r"Granules: (\d+)/(\d+)", block)
        if kind in ("PrimaryKey", "Skip") and counts:
            found[name.group(1) if (kind == "Skip" and name) else kind] = (int(counts[1]), int(counts[2]))
    return found


def sink_config(unique: str, **overrides: object) -> SinkConfig:
    """A sink of its own: topics and group named after ``unique``, small fast batches."""
    return SinkConfig(steps_topic=f"steps.{unique}", prefix_nodes_topic=f"prefix.{unique}",
                      dlq_topic=f"dlq.{unique}", feedback_topic=f"feedback.{unique}",
                      group_id=f"sink.{unique}", batch_rows=200, batch_seconds=0.3,
                      **overrides)  # type: ignore[arg-type]


def topics_of(config: SinkConfig) -> list[str]:
    return [config.steps_topic, config.prefix_nodes_topic, config.dlq_topic, config.feedback_topic]


def sink_until_committed(settings: Settings, pool_store: PoolStore, config: SinkConfig) -> None:
    """Run the sink in a thread until it committed everything on its topics, then stop it."""
    stop = threading.Event()
    ready = threading.Event()
    worker = threading.Thread(target=run_sink, args=(settings, pool_store, stop, ready.set, config))
    worker.start()
    try:
        assert ready.wait(30), "the sink never became ready"
        wait_committed(settings.kafka_bootstrap, config.group_id, topics_of(config))
    finally:
        stop.set()
        worker.join(30)
    assert not worker.is_alive()
