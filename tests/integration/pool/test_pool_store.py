"""PoolStore and the schema: idempotent migrations, newest-version-wins views, deduplicated inserts."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

from clawr1.pool.migrations import POOL_MIGRATIONS, STEP_FIELDS, all_migrations
from clawr1.pool.store import PoolDataError, PoolError, PoolStore
from clawr1.schemas.codec import codec_for
from clawr1.sinks.batch import TableRows
from clawr1.sinks.config import SinkConfig
from clawr1.sinks.pool_sink import PoolSink
from clawr1.sinks.rows import STEP_COLUMNS, Origin, step_row
from tests.support.records import step

ORIGIN = Origin("clawr1.steps", 0, 0, None, None)


def insert_steps(store: PoolStore, records: list[dict[str, object]], token: str | None = None) -> None:
    rows = [step_row(r, ORIGIN, 1_760_000_000_000) for r in records]
    store.insert("step_versions", rows, STEP_COLUMNS, dedup_token=token)


def test_migrations_are_recorded_once_and_rerun_as_no_ops(pool_store: PoolStore) -> None:
    recorded = {r["id"] for r in pool_store.query("SELECT id FROM schema_migrations")}
    assert recorded == {migration_id for migration_id, _ in all_migrations()}
    assert pool_store.migrate() == []
    assert pool_store.query("SELECT count() AS n FROM schema_migrations")[0]["n"] == len(all_migrations())
    for name in ("steps", "step_versions", "feedback", "prefix_nodes", "prefix_savings",
                 "prefix_savings_total", "dead_letters", "trajectories", "prompt_groups", "consumer_commits"):
        assert pool_store.table_exists(name), name
    assert POOL_MIGRATIONS[0][0] == "0001_step_versions"


def test_steps_view_columns_are_the_step_schema_plus_ingestion_time(pool_store: PoolStore) -> None:
    described = pool_store.query("DESCRIBE TABLE steps")
    assert [c["name"] for c in described] == [*STEP_FIELDS, "ingested_at"]
    types = {c["name"]: c["type"] for c in described}
    assert types["prompt_token_ids"] == "Array(UInt32)"
    assert types["policy_version"] == "Nullable(Int64)"
    assert types["reward"] == "Nullable(Float64)"
    assert types["ready"] == "UInt8"
    assert types["created_at_ms"] == types["ingested_at"] == "DateTime64(3, 'UTC')"


def test_newest_version_wins_even_under_a_filter_the_newest_fails(pool_store: PoolStore) -> None:
    insert_steps(pool_store, [step("a", 1), step("b", 1)])
    insert_steps(pool_store, [step("a", 2, reward=0.5, reward_status="final", ready=True)])
    insert_steps(pool_store, [step("b", 1)])  # a replay of the same version
    rows = pool_store.query("SELECT step_id, version, reward, reward_status FROM steps ORDER BY step_id")
    assert rows == [{"step_id": "a", "version": 2, "reward": 0.5, "reward_status": "final"},
                    {"step_id": "b", "version": 1, "reward": None, "reward_status": "pending"}]
    # Filtering on a column the newest version changed must not resurrect the old version.
    pending = pool_store.query("SELECT step_id FROM steps WHERE reward_status = 'pending'")
    assert pending == [{"step_id": "b"}]


def test_prompt_groups_view_lists_only_real_groups(pool_store: PoolStore) -> None:
    insert_steps(pool_store, [step("g1", trajectory_id="t1", prompt_group_id="grp", prompt_group_size=2),
                              step("g2", trajectory_id="t2", prompt_group_id="grp", prompt_group_size=2),
                              step("solo", trajectory_id="t3")])
    groups = pool_store.query("SELECT prompt_group_id, num_steps, num_trajectories FROM prompt_groups")
    assert groups == [{"prompt_group_id": "grp", "num_steps": 2, "num_trajectories": 2}]


def test_a_repeated_dedup_token_drops_the_repeated_insert(pool_store: PoolStore) -> None:
    for _ in range(3):
        insert_steps(pool_store, [step("a", 1), step("b", 1)], token="steps.t:0:0-1")
    insert_steps(pool_store, [step("c", 1)], token="steps.t:0:2-2")
    assert pool_store.query("SELECT count() AS n FROM step_versions")[0]["n"] == 3


def test_query_shapes_and_clickhouse_errors(pool_store: PoolStore) -> None:
    insert_steps(pool_store, [step("a", 1, prompt_token_ids=[7, 8, 9])])
    assert pool_store.query_columns("SELECT step_id, prompt_token_ids FROM steps") == {
        "step_id": ["a"], "prompt_token_ids": [[7, 8, 9]]}
    table = pool_store.query_arrow("SELECT prompt_token_ids FROM steps")
    assert isinstance(table, pa.Table) and table.column(0).to_pylist() == [[7, 8, 9]]
    assert pool_store.query("SELECT {x:UInt32} + 1 AS y", parameters={"x": 41}) == [{"y": 42}]
    assert pool_store.raw_query("SELECT step_id FROM steps", "CSV") == b'"a"\n'
    with pytest.raises(PoolError, match="Code: 60") as caught:
        pool_store.query("SELECT * FROM no_such_table")
    assert caught.value.code == 60
    with pytest.raises(PoolDataError, match="step_versions"):
        pool_store.insert("step_versions", [("x",) * len(STEP_COLUMNS)], STEP_COLUMNS)


def test_store_is_safe_to_share_between_threads(pool_store: PoolStore) -> None:
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(20):
                insert_steps(pool_store, [step(f"s{n}-{i}", 1)])
                pool_store.query("SELECT count() FROM steps")
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert pool_store.query("SELECT count() AS n FROM steps")[0]["n"] == 80


def test_closed_store_refuses_calls(pool_dsn: str) -> None:
    store = PoolStore(pool_dsn)
    store.close()
    with pytest.raises(PoolError, match="closed"):
        store.query("SELECT 1")


def test_sink_isolates_rows_the_table_cannot_type_into_dead_letters(pool_store: PoolStore) -> None:
    """A row that passed the record checks but fails ClickHouse typing must not block its batch."""
    sink = PoolSink("127.0.0.1:1", pool_store, SinkConfig(), codec_for())
    good = [step(f"g{i}", 1) for i in range(5)]
    rows = TableRows(STEP_COLUMNS)
    for i, record in enumerate(good):
        rows.rows.append(step_row(record, ORIGIN, 1))
        rows.origins.append(Origin("clawr1.steps", 0, i, None, b"good"))
    bad = list(step_row(step("bad", 1), ORIGIN, 1))
    bad[STEP_COLUMNS.index("version")] = "not a number"
    rows.rows.insert(2, tuple(bad))
    rows.origins.insert(2, Origin("clawr1.steps", 0, 99, b"k", b"bad bytes"))

    assert sink._insert_rows("step_versions", rows, "token-1", threading.Event())
    stored = sorted(r["step_id"] for r in pool_store.query("SELECT step_id FROM steps"))
    assert stored == [f"g{i}" for i in range(5)]
    dead = pool_store.query("SELECT dlq_id, stage, reason, original_value FROM dead_letters")
    assert len(dead) == 1 and dead[0]["dlq_id"] == "clawr1.steps:0:99" and dead[0]["stage"] == "sink"
    assert "rejected by table 'step_versions'" in dead[0]["reason"]
    assert dead[0]["original_value"] == "bad bytes"
