"""Id lookups through the step_lookup table: the newest version of exactly the steps holding the id,
read by primary key (a handful of granules of step_versions), through a query the analyst guard passes."""

from __future__ import annotations

from clawr1.pool.migrations import ID_COLUMNS, POOL_MIGRATIONS, STEP_LOOKUP, id_lookup_sql, split_statements
from clawr1.pool.sql import AnalystSql
from clawr1.pool.store import PoolStore
from tests.support.pool import granules

STEPS = 200_000
PROMPT_STEPS = range(123456, 123460)  # the four steps sharing prompt-30864
GENERATE = f"""
INSERT INTO step_versions (step_id, version, trajectory_id, step_index, prompt_id, response_id, source_kind,
    created_at_ms, updated_at_ms, prompt_token_ids, response_token_ids, token_provenance, reward_status,
    ready, status, trajectory_reward_status)
SELECT concat('step-', toString(number)), 1, concat('traj-', toString(intDiv(number, 8))), number % 8,
       concat('prompt-', toString(intDiv(number, 4))), concat('response-', toString(number)),
       'whitebox_agent', now64(3), now64(3), [1, 2, 3], [4, 5], 'engine', 'final', 1, 'ok', 'pending'
FROM numbers({STEPS})
"""


def test_lookups_by_each_id_find_the_newest_version_by_primary_key(pool_store: PoolStore) -> None:
    store = pool_store
    store.command(GENERATE)
    store.command("INSERT INTO step_versions (step_id, version, trajectory_id, step_index, prompt_id, "
                  "response_id, source_kind, created_at_ms, updated_at_ms, token_provenance, reward, "
                  "reward_status, ready, status, trajectory_reward_status) VALUES ('step-123457', 2, "
                  "'traj-15432', 1, 'prompt-30864', 'response-123457', 'whitebox_agent', now64(3), now64(3), "
                  "'engine', 0.5, 'final', 1, 'ok', 'final')")
    # Three ids per step version, collapsed per (hash, trajectory) by merges.
    store.command(f"OPTIMIZE TABLE {STEP_LOOKUP} FINAL")
    assert store.query(f"SELECT count() AS n FROM {STEP_LOOKUP}")[0]["n"] == STEPS * 2 + STEPS // 4
    expected = {
        "step_id": ("step-123457", [("step-123457", 2)]),
        "response_id": ("response-123457", [("step-123457", 2)]),
        "prompt_id": ("prompt-30864", [(f"step-{n}", 2 if n == 123457 else 1) for n in PROMPT_STEPS]),
    }
    assert set(expected) == set(ID_COLUMNS)
    for column, (value, steps) in expected.items():
        sql = id_lookup_sql(column)
        rows = store.query(sql + " ORDER BY step_id", parameters={"id": value})
        assert [(r["step_id"], r["version"]) for r in rows] == steps, column
        plan = granules(store, sql.replace("{id:String}", f"'{value}'"))
        kept, before = plan["PrimaryKey"]
        assert kept <= 4 < before, (column, plan)
    assert store.query(id_lookup_sql("step_id"), parameters={"id": "no-such-step"}) == []


def test_the_lookup_query_passes_the_analyst_guard(pool_store: PoolStore) -> None:
    analyst = AnalystSql(pool_store.dsn, pool_store.database)
    try:
        for column in ID_COLUMNS:
            analyst.check(id_lookup_sql(column))
    finally:
        analyst.close()


def test_the_migration_backfills_older_pools_once(pool_store: PoolStore) -> None:
    """Ids written before the lookup table existed are copied in; running the backfill again adds nothing."""
    store = pool_store
    store.command(GENERATE.replace(f"numbers({STEPS})", "numbers(100)"))
    store.command(f"TRUNCATE TABLE {STEP_LOOKUP}")  # as in a pool made before the lookup table
    migration = dict(POOL_MIGRATIONS)["0010_step_lookup"]
    backfill = [s for s in split_statements(migration) if s.startswith("INSERT")]
    for _ in range(2):
        for statement in backfill:
            store.command(statement)
        assert store.query(f"SELECT count() AS n FROM {STEP_LOOKUP}")[0]["n"] == 100 * 2 + 100 // 4
    rows = store.query(id_lookup_sql("response_id"), parameters={"id": "response-42"})
    assert [r["step_id"] for r in rows] == ["step-42"]
