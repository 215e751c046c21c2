"""Ready polls read the pool's delivery log (every step version in the order it landed, ready ones with
their payload): on both transports, each step comes once per group, in its newest version; a page of stale
or filtered entries never hides the eligible steps behind it; an entry whose payload expired is read from
``step_versions``; an entry that became visible late is still read; a member resumes from its cursor."""

from __future__ import annotations

import time
import uuid

import pytest

from clawr1.consumer_sdk import PoolConsumer, delivery
from clawr1.consumer_sdk.delivery import LATE_CHECK_S
from clawr1.pool.consumer_tables import CURSORS_TABLE
from clawr1.pool.migrations import DELIVERY_LOG, POOL_MIGRATIONS, apply_migrations, split_statements
from clawr1.pool.store import PoolStore
from tests.support.pool import Pool, step
from tests.support.waiting import outlast

T0 = 1_760_000_000_000


def logged(pool: Pool) -> list[tuple[str, int, int]]:
    """The log's entries in log order: step, version, whether it carries its payload."""
    rows = pool.store.query(f"SELECT step_id, version, has_payload FROM {DELIVERY_LOG} "
                            "ORDER BY logged_at, step_id, version")
    return [(r["step_id"], int(r["version"]), int(r["has_payload"])) for r in rows]


def test_every_version_is_logged_and_a_step_comes_once_in_its_newest(pool: Pool, source: str) -> None:
    pool.write(step("a", reward=0.1), step("b", ready=False))
    pool.write(step("a", version=2, reward=0.7), step("b", version=2))
    # Versions that are not ready are logged without payload: they only tell that a step moved on. One
    # feed writes an insert's entries, ready or not, with one stamp, after the last insert's.
    assert logged(pool) == [("a", 1, 1), ("b", 1, 0), ("a", 2, 1), ("b", 2, 1)]
    stamps = pool.store.query(f"SELECT version, uniqExact(logged_at) AS stamps FROM {DELIVERY_LOG} "
                              "GROUP BY version ORDER BY version")
    assert [(int(r["version"]), int(r["stamps"])) for r in stamps] == [(1, 1), (2, 1)]
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
    with PoolConsumer(source, "once") as again:  # nor to the group's next consumer
        assert not again.poll()


def test_pages_of_filtered_and_stale_entries_do_not_hide_what_follows(pool: Pool, source: str) -> None:
    """Polls of 2 steps over a log that starts with 5 entries that do not qualify (val channel, a
    stale version): the poll pages on past them instead of coming back empty."""
    pool.write(*(step(f"v{i}", channel="val") for i in range(4)), step("old"), ingested_at_ms=T0)
    pool.write(step("old", version=2, ready=False), ingested_at_ms=T0 + 1)
    pool.write(*(step(f"t{i}") for i in range(3)), ingested_at_ms=T0 + 2)
    with PoolConsumer(source, "pages") as consumer:
        assert list(consumer.poll(max_steps=2).step_ids) == ["t0", "t1"]
        assert list(consumer.poll(max_steps=2).step_ids) == ["t2"]
        assert not consumer.poll(max_steps=2)


def _copy_of(pool: Pool, original: str, step_id: str) -> None:
    """An entry stamped as ``original`` was (so before the position of a member that read it), visible only
    now: as one of two inserts running at once that became visible in the other order."""
    pool.store.command(f"INSERT INTO {DELIVERY_LOG} SELECT * REPLACE ('{step_id}' AS step_id, "
                       f"'traj-{step_id}' AS trajectory_id) FROM (SELECT * FROM {DELIVERY_LOG} "
                       f"WHERE step_id = '{original}')")


def test_an_entry_that_became_visible_late_is_still_read(pool: Pool, source: str) -> None:
    """Two inserts running at once may become visible in the other order: an entry stamped before the
    member's position, visible after its read, is read by a later one (a check, at most ``LATE_CHECK_S``
    after the last), and only once."""
    pool.write(step("a"), step("b"))
    with PoolConsumer(source, "late") as consumer:
        assert list(consumer.poll(max_steps=10).step_ids) == ["a", "b"]
        consumer.commit()
        _copy_of(pool, "a", "0-late")
        assert list(consumer.poll(max_steps=10, timeout=LATE_CHECK_S * 3).step_ids) == ["0-late"]
        checked_at = time.monotonic()
        consumer.commit()
        outlast(LATE_CHECK_S, since=checked_at)
        assert not consumer.poll(max_steps=10)  # a check read, which leaves out what was handed out


@pytest.mark.parametrize("restart", [False, True], ids=["paused", "restarted"])
def test_a_late_entry_is_read_however_long_the_member_was_away(
    pool: Pool, source: str, monkeypatch: pytest.MonkeyPatch, restart: bool
) -> None:
    """An entry stamped before the member's position that became visible while the trainer trained (or
    restarted) for longer than the allowance itself is still read: the member goes back to where it last
    checked (kept in its cursor across a restart), not only to the allowance before the pool's clock; and
    it gets only that entry (the rest was committed)."""
    # The copy must become visible within the allowance of its stamp (a's), as an insert running beside
    # another would; writing, reading and committing took more than 0.3 s on a loaded machine, so 1.5 s.
    monkeypatch.setattr(delivery, "LATE_ARRIVAL_MS", 1500)
    pool.write(step("a"), step("b"))
    consumer = PoolConsumer(source, "away")
    try:
        assert list(consumer.poll(max_steps=10).step_ids) == ["a", "b"]
        consumer.commit()
        away_since = time.monotonic()
        if restart:
            consumer.close()
        _copy_of(pool, "a", "0-late")
        outlast(delivery.LATE_ARRIVAL_MS / 1000, since=away_since)  # away for longer than the allowance
        if restart:
            consumer = PoolConsumer(source, "away")
        assert list(consumer.poll(max_steps=10, timeout=LATE_CHECK_S * 3).step_ids) == ["0-late"]
    finally:
        consumer.close()


def test_a_member_resumes_from_its_cursor_and_other_filters_keep_their_own(pool: Pool, source: str) -> None:
    pool.write(*(step(f"s{i}") for i in range(4)), step("v0", channel="val"))
    with PoolConsumer(source, "resume") as consumer:
        assert list(consumer.poll(max_steps=3).step_ids) == ["s0", "s1", "s2"]
        consumer.commit(sync=True)
    cursors = pool.store.query(f"SELECT step_id, step_version FROM {CURSORS_TABLE} "
                               "WHERE group_name = 'resume'")
    # Just before s3 (version 1): read ahead, not handed out; everything before it is done.
    assert [(r["step_id"], r["step_version"]) for r in cursors] == [("s3", 0)]
    with PoolConsumer(source, "resume") as consumer:
        assert list(consumer.poll(max_steps=10).step_ids) == ["s3"]
    # The val entry was passed over by the train filters' cursor; a val consumer of the group still gets it.
    with PoolConsumer(source, "resume", channel="val") as consumer:
        assert list(consumer.poll(max_steps=10).step_ids) == ["v0"]


def test_the_migration_backfills_older_pools_once_and_expired_payload_is_read_from_the_steps(
    pool: Pool, source: str
) -> None:
    """Steps written before the log existed are copied in at their own ingest times, without payload when
    that is older than the log keeps it; running the backfill again adds nothing; a poll reads such
    steps' payload from step_versions."""
    pool.write(step("early", prompt_token_ids=[1, 2], response_token_ids=[3], response_logprobs=[-0.5]),
               step("never", ready=False), ingested_at_ms=T0)
    pool.store.command(f"TRUNCATE TABLE {DELIVERY_LOG}")  # as in a pool made before the log
    migration = dict(POOL_MIGRATIONS)["0012_delivery_log"]
    backfill = [s for s in split_statements(migration) if s.startswith("INSERT")]
    for _ in range(2):
        for statement in backfill:
            pool.store.command(statement)
        assert logged(pool) == [("early", 1, 0), ("never", 1, 0)]
    for with_text in (False, True):
        with PoolConsumer(source, f"backfilled-{with_text}", with_text=with_text) as consumer:
            (early,) = consumer.poll(max_steps=10)
        assert early.step_id == "early"
        assert early.prompt_token_ids.tolist() == [1, 2] and early.response_token_ids.tolist() == [3]
        assert early.response_logprobs is not None and early.response_logprobs.tolist() == [-0.5]
        assert ("prompt_messages" in early.metadata) is with_text


def test_the_one_feed_logs_what_the_two_feeds_before_it_logged(pool_dsn: str) -> None:
    """Migration 0013 made the log's two feeds (ready versions, the others) one: a pool made before it logs,
    once upgraded, the same entries for the same inserts (their stamps aside)."""
    records = [step("r", reward=0.5, quality_labels=["good"], prompt_token_ids=[1, 2], response_token_ids=[3],
                    response_logprobs=[-0.1], metadata_json='{"k": 1}'),
               step("n", ready=False, reward=0.25, quality_labels=["bad"], prompt_token_ids=[4],
                    response_token_ids=[5, 6], response_logprobs=[-0.2, -0.3], policy_version=3)]
    before = [(i, sql) for i, sql in POOL_MIGRATIONS if i < "0013"]
    assert len(before) == len(POOL_MIGRATIONS) - 3  # 0013, 0014 and 0015 are the newest pool migrations
    database = f"feeds_{uuid.uuid4().hex[:12]}"
    store = PoolStore(pool_dsn, database=database)
    try:
        old = Pool(store=store, dsn="")
        apply_migrations(store, before)
        entries = f"SELECT * EXCEPT logged_at FROM {DELIVERY_LOG} ORDER BY step_id, version"
        old.write(*records, ingested_at_ms=T0)
        by_two = store.query(entries)
        store.command(f"TRUNCATE TABLE {DELIVERY_LOG}")
        assert apply_migrations(store)[0] == "0013_delivery_log_one_feed"
        old.write(*records, ingested_at_ms=T0)
        assert store.query(entries) == by_two
        assert [(r["step_id"], r["has_payload"], r["reward"]) for r in by_two] == [("n", 0, None),
                                                                                   ("r", 1, 0.5)]
    finally:
        store.command(f"DROP DATABASE IF EXISTS {database}")
        store.close()
