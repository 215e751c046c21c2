"""The bookkeeping behind a group's cursor, without a pool: what holds the cursor back, and the background
writer of commits (when it writes, in which order, what a refused write leaves)."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pytest

from clawr1.consumer_sdk import PoolUnavailable
from clawr1.consumer_sdk.commits import Committer, CursorRow
from clawr1.consumer_sdk.delivery import Ledger, _deliverable, floor_start, just_before
from clawr1.consumer_sdk.queries import NEWEST_SQL
from clawr1.pool.consumer_tables import COMMITS_TABLE, CURSORS_TABLE
from tests.support.waiting import holds_for, wait_until


def test_the_lowest_uncommitted_delivery_holds_the_cursor() -> None:
    ledger = Ledger()
    first, second = (10, "a", 1), (12, "c", 1)
    ledger.deliver(["a", "b"], first)
    ledger.deliver(["c"], second)
    assert ledger.hold() == first
    ledger.settle(["a"])
    assert ledger.hold() == first  # b still holds it
    ledger.settle(["b"])
    assert ledger.hold() == second
    ledger.settle(["c"])
    assert ledger.hold() is None and not ledger.frozen


def test_a_delivery_outside_the_log_order_freezes_the_cursor_until_committed() -> None:
    ledger = Ledger()
    ledger.deliver(["g1", "g2"], None)
    assert ledger.frozen
    ledger.settle(["g1", "g2"])
    assert not ledger.frozen


def test_positions_just_before_read_the_entry_again() -> None:
    entry = (1_000, "step", 3)
    assert just_before(entry) < entry
    assert just_before(entry) > (1_000, "stee", 9) and just_before(entry) > (999, "zzz", 9)
    assert floor_start(5_000) < (0 + 5_000 - 1, "a", 0)  # below every entry that can carry the floor


class Recording:
    """A transport that records inserts; refuses the first ``refusals`` of them."""

    def __init__(self, refusals: int = 0) -> None:
        self.inserts: list[tuple[str, list[dict[str, Any]]]] = []
        self.refusals = refusals
        self.lock = threading.Lock()

    def query(self, sql: str, parameters: Mapping[str, Any]) -> pa.Table:
        raise AssertionError("the committer never queries")

    def insert(self, table: str, rows: Sequence[Sequence[Any]], column_names: Sequence[str]) -> None:
        with self.lock:
            if self.refusals:
                self.refusals -= 1
                raise PoolUnavailable("refused")
            self.inserts.append((table, [dict(zip(column_names, row, strict=True)) for row in rows]))

    def close(self) -> None:
        pass


def cursor(at: int) -> CursorRow:
    return CursorRow("epoch", 0, 1, "filters", (at, "s", 1), at - 5_000)


def test_commits_are_written_every_few_records_commit_rows_before_the_cursor() -> None:
    link = Recording()
    committer = Committer(link, "g", "me", every=2, every_s=600)
    committer.record({"a": ("epoch", 1)}, cursor(1))
    holds_for(lambda: link.inserts == [], 0.2, message="a commit written before the second record")
    assert committer.unlanded() == {"a"}
    committer.record({"b": ("epoch", 2)}, cursor(2))
    wait_until(lambda: len(link.inserts) == 2, 10)
    (commits, commit_rows), (cursors, cursor_rows) = link.inserts
    assert (commits, cursors) == (COMMITS_TABLE, CURSORS_TABLE)
    assert sorted(r["step_id"] for r in commit_rows) == ["a", "b"]
    assert cursor_rows[0]["logged_at_ms"] == 2 and cursor_rows[0]["filters_key"] == "filters"
    # A read that began before the write cannot have seen these committed; one that began after can.
    assert committer.unlanded() == set() and committer.holding(["a", "b", "c"], 0) == {"a", "b"}
    assert committer.holding(["a", "b"], committer.generation) == set()
    committer.forget_landed(committer.generation)
    assert committer.holding(["a", "b"], 0) == set()
    committer.close()


def test_one_commit_is_written_once_old_enough() -> None:
    link = Recording()
    committer = Committer(link, "g", "me", every=100, every_s=0.1)
    committer.record({"a": ("epoch", 1)}, cursor(5))
    wait_until(lambda: len(link.inserts) == 2, 10)
    committer.close()
    assert len(link.inserts) == 2  # nothing new to write on close


def test_a_refused_write_is_kept_raised_by_flush_and_written_by_the_next() -> None:
    link = Recording(refusals=1)
    committer = Committer(link, "g", "me", every=100, every_s=600)
    committer.record({"a": ("epoch", 1)}, cursor(1))
    with pytest.raises(PoolUnavailable):
        committer.flush()
    assert committer.unlanded() == {"a"} and link.inserts == []  # no cursor without its commits
    committer.flush()
    assert [table for table, _ in link.inserts] == [COMMITS_TABLE, CURSORS_TABLE]
    committer.close()


def test_close_drops_what_the_pool_keeps_refusing_and_raises() -> None:
    link = Recording(refusals=2)
    committer = Committer(link, "g", "me", every=100, every_s=600)
    committer.record({"a": ("epoch", 1)}, cursor(1))
    with pytest.raises(PoolUnavailable):
        committer.flush()
    with pytest.raises(PoolUnavailable):
        committer.close()
    assert committer.unlanded() == set() and link.inserts == []


class Newest:
    """A transport that answers the exact newest-entry query with fixed rows."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows
        self.asked: list[Mapping[str, Any]] = []

    def query(self, sql: str, parameters: Mapping[str, Any]) -> pa.Table:
        assert sql == NEWEST_SQL
        self.asked.append(parameters)
        return pa.Table.from_pylist(self.rows)

    def insert(self, table: str, rows: Sequence[Sequence[Any]], column_names: Sequence[str]) -> None:
        raise AssertionError("no insert expected")

    def close(self) -> None:
        pass


def test_an_entry_doubted_by_its_hash_is_checked_by_its_step_id() -> None:
    """``_newest`` 0 may be another step's later entry under the same 64-bit hash: the step id decides."""
    page = pa.table({
        "step_id": ["kept", "collided", "stale", "committed"],
        "version": [1, 1, 1, 1],
        "logged_at": pa.array([10, 11, 12, 13], pa.timestamp("ms", "UTC")),
        "_committed": [0, 0, 0, 1],
        "_newest": [1, 0, 0, 1],
    })
    link = Newest([{"step_id": "collided", "newest_version": 1, "at_ms": 11},
                   {"step_id": "stale", "newest_version": 2, "at_ms": 40}])
    delivered = _deliverable(link, page, (5, "", -1))
    assert delivered.column("step_id").to_pylist() == ["kept", "collided"]
    assert link.asked == [{"c_start_ms": 5, "c_steps": ["collided", "stale"]}]
    assert "_newest" not in delivered.column_names and "_committed" not in delivered.column_names
