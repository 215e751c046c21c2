"""Read-ahead and background commits keep the delivery contract, on both transports: steps read ahead
are not in flight (a crash or close forgets them, nothing is lost), batches served from them read nothing
and a seek by another member is seen by the next read, they are read again once older than
READ_AHEAD_MAX_AGE_S; commits are written every few commits or seconds, at once with ``sync=True``, and a
write the pool refused is written again."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pytest

import clawr1.consumer_sdk.consumer as consumer_module
from clawr1.consumer_sdk import PoolConsumer, PoolUnavailable
from clawr1.consumer_sdk.source import parse_source
from clawr1.consumer_sdk.transport import Transport, open_transport
from clawr1.pool.consumer_tables import COMMITS_TABLE
from tests.support.pool import Pool, step
from tests.support.waiting import holds_for, outlast, wait_until


def ids(n: int, prefix: str = "s") -> list[str]:
    return [f"{prefix}{i:02d}" for i in range(n)]


def queries_of(consumer: PoolConsumer) -> list[str]:
    """Every SQL text the consumer sends from now on (its transport's query is wrapped)."""
    link = consumer._link()
    sent: list[str] = []
    original = link.query

    def query(sql: str, parameters: Mapping[str, Any]) -> pa.Table:
        sent.append(sql)
        return original(sql, parameters)

    link.query = query  # type: ignore[method-assign]
    return sent


def test_batches_come_from_one_read_in_order_once(pool: Pool, source: str) -> None:
    pool.write(*(step(s) for s in ids(12)))
    with PoolConsumer(source, "ahead", read_ahead=4) as consumer:
        sent = queries_of(consumer)
        got: list[str] = []
        while batch := consumer.poll(max_steps=3):
            got.extend(batch.step_ids)
            consumer.commit(batch)
        assert got == ids(12)
        pages = [sql for sql in sent if "WITH page AS" in sql]
        assert len(pages) == 2  # all 12 in one read of 4 batches (sized on the log's next entries), the end
    with PoolConsumer(source, "ahead") as again:
        assert not again.poll(max_steps=20)  # close() wrote every commit


def test_read_ahead_is_not_in_flight_so_close_loses_nothing(pool: Pool, source: str) -> None:
    pool.write(*(step(s) for s in ids(8)))
    with PoolConsumer(source, "forget", read_ahead=4) as consumer:
        consumer.poll(max_steps=2)
        consumer.commit()
        assert list(consumer.poll(max_steps=2).step_ids) == ids(8)[2:4]  # the rest is read ahead
        consumer.commit()
        consumer.poll(max_steps=2)  # s04, s05 delivered, s06, s07 read ahead: neither committed
        assert consumer.uncommitted == 2
    with PoolConsumer(source, "forget") as again:
        assert list(again.poll(max_steps=20).step_ids) == ids(8)[4:]


def test_read_ahead_is_served_without_reading_and_a_seek_elsewhere_is_seen_by_the_next_read(
    pool: Pool, source: str
) -> None:
    pool.write(*(step(s) for s in ids(7)))
    with PoolConsumer(source, "moved", read_ahead=4) as consumer, PoolConsumer(source, "moved") as peer:
        # One read of up to 4 batches took all 7 (and, short of its size, started no read after it).
        assert list(consumer.poll(max_steps=2).step_ids) == ["s00", "s01"]
        sent = queries_of(consumer)
        peer.seek("latest")
        # Served from what was read ahead: no query at all, not even the group's position.
        assert list(consumer.poll(max_steps=2).step_ids) == ["s02", "s03"]
        assert list(consumer.poll(max_steps=2).step_ids) == ["s04", "s05"]
        assert list(consumer.poll(max_steps=2).step_ids) == ["s06"]
        assert sent == []
        assert consumer.uncommitted == 7
        # The next read sees the new epoch: what the consumer held there is forgotten.
        assert not consumer.poll(max_steps=2)
        assert consumer.uncommitted == 0


def test_read_ahead_older_than_its_limit_is_read_again(pool: Pool, source: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(consumer_module, "READ_AHEAD_MAX_AGE_S", 0.2)
    pool.write(*(step(s, reward=0.1) for s in ids(8)))
    with PoolConsumer(source, "aged", read_ahead=4) as consumer:
        consumer.poll(max_steps=2)
        consumer.poll(max_steps=2)  # s04.. read ahead with reward 0.1
        read_at = time.monotonic()
        pool.write(step("s04", version=2, reward=0.9), step("s05", version=2, ready=False))
        outlast(consumer_module.READ_AHEAD_MAX_AGE_S, since=read_at)
        # Read again: s05 is no longer ready, s04 comes in its new version, which became ready last.
        assert list(consumer.poll(max_steps=2).step_ids) == ["s06", "s07"]
        batch = consumer.poll(max_steps=2)
        assert list(batch.step_ids) == ["s04"]
        assert batch[0].version == 2 and batch[0].reward == 0.9


class FailingCommits:
    """A transport whose next commit write fails, then works again."""

    def __init__(self, link: Transport) -> None:
        self.link = link
        self.fail = True

    def query(self, sql: str, parameters: Mapping[str, Any]) -> pa.Table:
        return self.link.query(sql, parameters)

    def insert(self, table: str, rows: Sequence[Sequence[Any]], column_names: Sequence[str]) -> None:
        if self.fail and table == COMMITS_TABLE:
            self.fail = False
            raise PoolUnavailable("the pool went away")
        self.link.insert(table, rows, column_names)

    def close(self) -> None:
        self.link.close()


def committed_rows(pool: Pool, group: str) -> int:
    return int(pool.store.query(f"SELECT count() AS n FROM {COMMITS_TABLE} WHERE group_name = {{g:String}}",
                                parameters={"g": group})[0]["n"])


def test_commits_are_written_in_the_background_every_few_commits(
    pool: Pool, source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLAWR1_SDK_COMMIT_BATCHES", "2")
    monkeypatch.setenv("CLAWR1_SDK_COMMIT_SECONDS", "600")
    pool.write(*(step(s) for s in ids(6)))
    with PoolConsumer(source, "periodic") as consumer:
        assert consumer.commit(consumer.poll(max_steps=2)) == 2
        assert consumer.uncommitted == 0
        holds_for(lambda: committed_rows(pool, "periodic") == 0, 0.3,
                  message="a commit written before the second one")  # recorded, not written yet
        assert list(consumer.poll(max_steps=2).step_ids) == ids(6)[2:4]  # never handed out again here
        consumer.commit()  # the second commit: both are written now, in the background
        wait_until(lambda: committed_rows(pool, "periodic") == 4, 10)
        consumer.poll(max_steps=2)
        consumer.commit()
    assert committed_rows(pool, "periodic") == 6  # close() wrote the last one
    with PoolConsumer(source, "periodic") as again:
        assert not again.poll(max_steps=10)


def test_commits_are_written_once_the_oldest_is_old_enough(
    pool: Pool, source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLAWR1_SDK_COMMIT_BATCHES", "1000")
    monkeypatch.setenv("CLAWR1_SDK_COMMIT_SECONDS", "0.2")
    pool.write(*(step(s) for s in ids(2)))
    with PoolConsumer(source, "aging") as consumer:
        consumer.commit(consumer.poll(max_steps=2))
        wait_until(lambda: committed_rows(pool, "aging") == 2, 10)


def test_a_sync_commit_is_in_the_pool_when_it_returns(pool: Pool, source: str) -> None:
    pool.write(*(step(s) for s in ids(4)))
    with PoolConsumer(source, "durable") as consumer:
        assert consumer.commit(consumer.poll(max_steps=2), sync=True) == 2
        assert committed_rows(pool, "durable") == 2
        with PoolConsumer(source, "durable") as other:
            assert list(other.poll(max_steps=10).step_ids) == ids(4)[2:]


def test_a_refused_sync_commit_raises_and_leaves_its_steps_in_flight(pool: Pool, source: str) -> None:
    pool.write(*(step(s) for s in ids(4)))
    failing = FailingCommits(open_transport(parse_source(source)))
    with PoolConsumer(source, "refused", transport=failing) as consumer:
        consumer.poll(max_steps=2)
        with pytest.raises(PoolUnavailable):
            consumer.commit(sync=True)
        assert consumer.uncommitted == 2  # as a waiting commit always left them: commit them again
        assert consumer.commit(sync=True) == 2
        assert committed_rows(pool, "refused") == 2
    with PoolConsumer(source, "refused") as again:
        assert list(again.poll(max_steps=10).step_ids) == ids(4)[2:]


def test_a_refused_background_write_is_written_again(
    pool: Pool, source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLAWR1_SDK_COMMIT_BATCHES", "1")
    pool.write(*(step(s) for s in ids(4)))
    failing = FailingCommits(open_transport(parse_source(source)))
    with PoolConsumer(source, "retry", transport=failing) as consumer:
        consumer.commit(consumer.poll(max_steps=2))
        wait_until(lambda: committed_rows(pool, "retry") == 2, 10)
        assert not failing.fail
    with PoolConsumer(source, "retry") as again:
        assert list(again.poll(max_steps=10).step_ids) == ids(4)[2:]
