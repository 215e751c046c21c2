"""Read-ahead and background commits keep the delivery contract, on both transports: steps read ahead
are not in flight (a crash or close forgets them, nothing is lost), a seek by another member drops them,
they are read again once older than READ_AHEAD_MAX_AGE_S, and a commit is in the pool before the next
poll returns (a failed one raises there and leaves its steps in flight)."""

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
from tests.integration.sdk.conftest import Pool, step


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
        first = consumer.poll(max_steps=3)  # the first read is one batch: steps' sizes are not known yet
        sent = queries_of(consumer)
        got = list(first.step_ids)
        while batch := consumer.poll(max_steps=3):
            got.extend(batch.step_ids)
            consumer.commit(batch)
        assert got == ids(12)
        pages = [sql for sql in sent if "step_versions" in sql]
        assert len(pages) == 2  # 9 steps in one read of up to 12 entries, then the empty end
    with PoolConsumer(source, "ahead") as again:
        assert list(again.poll(max_steps=20).step_ids) == ids(3)  # the first batch was never committed


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


def test_a_seek_by_another_member_drops_what_was_read_ahead(pool: Pool, source: str) -> None:
    pool.write(*(step(s) for s in ids(8)))
    with PoolConsumer(source, "moved", read_ahead=4) as consumer, PoolConsumer(source, "moved") as peer:
        consumer.poll(max_steps=2)
        consumer.poll(max_steps=2)  # the next steps are read ahead now
        peer.seek("latest")
        assert not consumer.poll(max_steps=2)


def test_read_ahead_older_than_its_limit_is_read_again(pool: Pool, source: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(consumer_module, "READ_AHEAD_MAX_AGE_S", 0.2)
    pool.write(*(step(s, reward=0.1) for s in ids(8)))
    with PoolConsumer(source, "aged", read_ahead=4) as consumer:
        consumer.poll(max_steps=2)
        consumer.poll(max_steps=2)  # s04.. read ahead with reward 0.1
        pool.write(step("s04", version=2, reward=0.9), step("s05", version=2, ready=False))
        time.sleep(0.3)
        # Read again: s05 is no longer ready, s04 comes in its new version, which became ready last.
        assert list(consumer.poll(max_steps=2).step_ids) == ["s06", "s07"]
        batch = consumer.poll(max_steps=2)
        assert list(batch.step_ids) == ["s04"]
        assert batch[0].version == 2 and batch[0].reward == 0.9


class FailingCommits:
    """A transport whose next commit insert fails, then works again."""

    def __init__(self, link: Transport) -> None:
        self.link = link
        self.fail = True

    def query(self, sql: str, parameters: Mapping[str, Any]) -> pa.Table:
        return self.link.query(sql, parameters)

    def insert(self, table: str, rows: Sequence[Sequence[Any]], column_names: Sequence[str]) -> None:
        if self.fail:
            self.fail = False
            raise PoolUnavailable("the pool went away")
        self.link.insert(table, rows, column_names)

    def close(self) -> None:
        self.link.close()


def test_a_background_commit_is_in_the_pool_before_the_next_poll_returns(pool: Pool, source: str) -> None:
    pool.write(*(step(s) for s in ids(4)))
    with PoolConsumer(source, "durable") as consumer:
        assert consumer.commit(consumer.poll(max_steps=2), wait=False) == 2
        assert consumer.uncommitted == 0
        assert list(consumer.poll(max_steps=2).step_ids) == ids(4)[2:]  # waited for the commit
        with PoolConsumer(source, "durable") as other:
            assert list(other.poll(max_steps=10).step_ids) == ids(4)[2:]


def test_a_failed_commit_raises_and_its_steps_stay_in_flight(pool: Pool, source: str) -> None:
    pool.write(*(step(s) for s in ids(4)))
    failing = FailingCommits(open_transport(parse_source(source)))
    with PoolConsumer(source, "refused", transport=failing) as consumer:
        consumer.poll(max_steps=2)
        with pytest.raises(PoolUnavailable):
            consumer.commit()  # waits for the pool by default, so the error comes here
        assert consumer.uncommitted == 2
        assert consumer.commit() == 2


def test_a_failed_background_commit_is_raised_by_the_next_poll_and_its_steps_stay_in_flight(
    pool: Pool, source: str
) -> None:
    pool.write(*(step(s) for s in ids(4)))
    failing = FailingCommits(open_transport(parse_source(source)))
    with PoolConsumer(source, "retry", transport=failing) as consumer:
        consumer.poll(max_steps=2)
        assert consumer.commit(wait=False) == 2
        with pytest.raises(PoolUnavailable):
            consumer.poll(max_steps=2)
        assert consumer.uncommitted == 2
        assert consumer.commit(wait=False) == 2
        consumer.flush()
    with PoolConsumer(source, "retry") as again:
        assert list(again.poll(max_steps=10).step_ids) == ids(4)[2:]
