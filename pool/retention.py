"""How long the pool keeps what: table TTLs from settings, set by the process that owns the pool at start.

Step data (``step_versions``, ``feedback_log``, ``prefix_node_versions``, the id lookup and the consumer
groups' commits) is kept forever unless ``CLAWR1_POOL_STEP_TTL_DAYS`` is set: it is the training data, and
deleting it is the operator's choice (or ``clawr1 prune``). The transient tables are bounded by default:
the delivery log (``CLAWR1_POOL_DELIVERY_LOG_TTL_DAYS``) and the dead letters
(``CLAWR1_POOL_DEAD_LETTER_TTL_DAYS``). ``0`` keeps a table forever (its TTL is removed).

Every TTL counts from the pool's own clock (``ingested_at``, ``logged_at``, ``committed_at``), never from
a client's timestamp, so a step imported with an old ``created_at_ms`` is not deleted on arrival. The
versions of a step expire one by one, oldest first (a newer version lands later), so ``FINAL`` keeps
showing the newest until it, too, expires. The id lookup keeps a day longer than the steps it points at
(it knows only the day a row was indexed), so a step never outlives its lookup.

TTLs are applied only where the table's own DDL differs from the settings: ``MODIFY TTL`` rewrites the
table's parts once (``materialize_ttl_after_modify``: without it, parts that never merge again would never
expire), which a start must not repeat, and must not wait for either (``mutations_sync = 0``: chDB waits
by default, 9 s per million small steps measured, far longer for a real pool).
Rows go at merges (``merge_with_ttl_timeout``, 4 hours by default), not at the instant they expire.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from clawr1.core import registry
from clawr1.core.settings import Settings, config_from, setting_field
from clawr1.pool.cluster import LOCAL_SUFFIX, cluster_statements
from clawr1.pool.consumer_tables import COMMITS_TABLE
from clawr1.pool.migrations import DELIVERY_LOG, STEP_LOOKUP

LOOKUP_MARGIN_DAYS = 1
"""The id lookup's extra day: it stamps rows with a date (``indexed_on``), not a time."""


@dataclass(frozen=True)
class Retention:
    """Days each kind of pool data is kept; 0 = forever."""

    step_days: int = setting_field(registry.POOL_STEP_TTL_DAYS)
    delivery_log_days: int = setting_field(registry.POOL_DELIVERY_LOG_TTL_DAYS)
    dead_letter_days: int = setting_field(registry.POOL_DEAD_LETTER_TTL_DAYS)

    @classmethod
    def from_settings(cls, settings: Settings) -> Retention:
        return config_from(cls, settings)

    def table_ttls(self) -> dict[str, str | None]:
        """Each table's TTL expression as ClickHouse prints it in the table's DDL; None = no TTL."""
        def ttl(time: str, days: int) -> str | None:
            return f"{time} + toIntervalDay({days})" if days > 0 else None

        step_lookup_days = self.step_days + LOOKUP_MARGIN_DAYS if self.step_days > 0 else 0
        return {
            "step_versions": ttl("toDateTime(ingested_at)", self.step_days),
            "feedback_log": ttl("toDateTime(ingested_at)", self.step_days),
            "prefix_node_versions": ttl("toDateTime(ingested_at)", self.step_days),
            COMMITS_TABLE: ttl("toDateTime(committed_at)", self.step_days),
            STEP_LOOKUP: ttl("indexed_on", step_lookup_days),
            DELIVERY_LOG: ttl("toDateTime(logged_at)", self.delivery_log_days),
            "dead_letter_log": ttl("toDateTime(ingested_at)", self.dead_letter_days),
        }


_IN_THE_BACKGROUND = {"mutations_sync": 0, "alter_sync": 0}
"""The TTL's rewrite of the existing parts runs after the ``ALTER`` returns."""

_TABLE_TTL = re.compile(r" TTL (.+?)(?: SETTINGS |$)")


def current_ttl(engine_full: str) -> str | None:
    """The table TTL in ``system.tables.engine_full`` (column TTLs are not part of it); None when none."""
    match = _TABLE_TTL.search(engine_full)
    return match.group(1).strip() if match else None


def ttl_statements(current: Mapping[str, str | None], wanted: Mapping[str, str | None]) -> list[str]:
    """The ``ALTER TABLE`` statements that make each table's TTL ``wanted`` (nothing where it is already)."""
    statements = []
    for table, ttl in wanted.items():
        if current.get(table) == ttl:
            continue
        statements.append(f"ALTER TABLE {table} {f'MODIFY TTL {ttl}' if ttl else 'REMOVE TTL'}")
    return statements


class RetentionStore(Protocol):
    database: str
    cluster: str

    def command(self, sql: str, parameters: Mapping[str, Any] | None = None,
                settings: Mapping[str, Any] | None = None) -> Any: ...

    def query(self, sql: str, parameters: Mapping[str, Any] | None = None,
              settings: Mapping[str, Any] | None = None) -> list[dict[str, Any]]: ...

    def migrate(self) -> list[str]: ...


def migrate_with_retention(store: RetentionStore, settings: Settings) -> None:
    """What the process that owns the pool does first: migrate, then set the TTLs of the settings."""
    store.migrate()
    apply_retention(store, Retention.from_settings(settings))


def apply_retention(store: RetentionStore, retention: Retention) -> list[str]:
    """Set the tables' TTLs to ``retention`` (after ``migrate``); returns the statements run (their
    single-server form). On a cluster the TTLs are the replicated local tables'."""
    wanted = retention.table_ttls()
    suffix = LOCAL_SUFFIX if store.cluster else ""
    rows = store.query("SELECT name, engine_full FROM system.tables WHERE database = {db:String} "
                       "AND name IN {names:Array(String)}",
                       parameters={"db": store.database, "names": [t + suffix for t in wanted]})
    current = {row["name"].removesuffix(suffix): current_ttl(row["engine_full"]) for row in rows}
    statements = ttl_statements(current, wanted)
    for statement in statements:
        cluster = store.cluster
        for each in cluster_statements(statement, cluster, store.database) if cluster else [statement]:
            store.command(each, settings=_IN_THE_BACKGROUND)
    return statements
