"""Ready polls read the pool's ready queue (every ready step version, keyed by readiness time) and then
the newest version of those steps: on both transports, each step comes once per group, in its newest
version, and a page of stale or filtered entries never hides the eligible steps behind it."""

from __future__ import annotations

from clawr1.consumer_sdk import PoolConsumer
from clawr1.pool.migrations import POOL_MIGRATIONS, READY_QUEUE, split_statements
from tests.integration.sdk.conftest import Pool, step

T0 = 1_760_000_000_000


def queued(pool: Pool) -> list[tuple[str, int]]:
    rows = pool.store.query(f"SELECT step_id, version FROM {READY_QUEUE} "
                            "ORDER BY ingested_at, step_id, version")
    return [(r["step_id"], int(r["version"])) for r in rows]


def test_every_ready_version_is_queued_and_a_step_comes_once_in_its_newest(pool: Pool, source: str) -> None:
    pool.write(step("a", reward=0.1), step("b", ready=False), ingested_at_ms=T0)
    pool.write(step("a", version=2, reward=0.7), step("b", version=2), ingested_at_ms=T0 + 1)
    assert queued(pool) == [("a", 1), ("a", 2), ("b", 2)]
    with PoolConsumer(source, "newest") as consumer:
        batch = consumer.poll(max_steps=10)
        assert list(batch.step_ids) == ["a", "b"]
        assert [s.version for s in batch] == [2, 2]
        assert [s.reward for s in batch] == [0.7, None]
        assert not consumer.poll(max_steps=10)


def test_a_step_whose_newest_version_is_not_ready_is_not_delivered(pool: Pool, source: str) -> None:
    pool.write(step("gone"), step("kept"), ingested_at_ms=T0)
    pool.write(step("gone", version=2, ready=False), ingested_at_ms=T0 + 1)
    with PoolConsumer(source, "stale") as consumer:
        assert list(consumer.poll(max_steps=10).step_ids) == ["kept"]


def test_a_committed_step_is_not_delivered_again_when_a_newer_ready_version_lands(
    pool: Pool, source: str
) -> None:
    pool.write(step("s"), ingested_at_ms=T0)
    with PoolConsumer(source, "once") as consumer:
        assert list(consumer.poll().step_ids) == ["s"]
        consumer.commit()
        pool.write(step("s", version=2, reward=1.0), ingested_at_ms=T0 + 5)
        assert not consumer.poll()


def test_pages_of_filtered_and_stale_entries_do_not_hide_what_follows(pool: Pool, source: str) -> None:
    """Polls of 2 steps over a queue that starts with 5 entries that do not qualify (val channel, a
    stale version): the poll pages on past them instead of coming back empty."""
    pool.write(*(step(f"v{i}", channel="val") for i in range(4)), step("old"), ingested_at_ms=T0)
    pool.write(step("old", version=2, ready=False), ingested_at_ms=T0 + 1)
    pool.write(*(step(f"t{i}") for i in range(3)), ingested_at_ms=T0 + 2)
    with PoolConsumer(source, "pages") as consumer:
        assert list(consumer.poll(max_steps=2).step_ids) == ["t0", "t1"]
        assert list(consumer.poll(max_steps=2).step_ids) == ["t2"]
        assert not consumer.poll(max_steps=2)


def test_the_migration_backfills_older_pools_once(pool: Pool) -> None:
    """Steps written before the queue existed are copied in; running the backfill again adds nothing."""
    pool.write(step("early"), step("never", ready=False), ingested_at_ms=T0)
    pool.store.command(f"TRUNCATE TABLE {READY_QUEUE}")  # as in a pool made before the queue
    migration = dict(POOL_MIGRATIONS)["0009_ready_queue"]
    backfill = [s for s in split_statements(migration) if s.startswith("INSERT")]
    for _ in range(2):
        for statement in backfill:
            pool.store.command(statement)
        assert queued(pool) == [("early", 1)]
