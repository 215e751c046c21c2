"""Commits off the trainer's hot path: ``commit()`` records in memory, a background thread writes.

A consumer's commit rows (one per step, ``consumer_commits``) and its member's cursor (one row,
``consumer_cursors``) are written together every ``CLAWR1_SDK_COMMIT_BATCHES`` recorded commits, once the
oldest unwritten record is ``CLAWR1_SDK_COMMIT_SECONDS`` old, and whenever a caller flushes
(``commit(sync=True)``, ``flush()``, ``seek()``, ``close()``). Commit rows go first, so a cursor row is
only ever in the pool once every commit it covers is. A failed write keeps its rows for the next one
(retried after a pause) and a flush raises it. A crash loses only what was not written yet: the group
gets those steps again, at-least-once, as a Kafka consumer with periodic offset commits.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import pyarrow as pa

from clawr1.consumer_sdk.queries import Position
from clawr1.consumer_sdk.transport import Transport
from clawr1.core.backoff import Backoff
from clawr1.pool.consumer_tables import COMMITS_TABLE, CURSORS_TABLE

__all__ = ["Committer", "CursorRow"]

# After a refused write, the next waits from 0.1 s doubling per refusal in a row, at most 1 s (or the
# age limit of a commit, when shorter), with full jitter.
_RETRY_FIRST_S = 0.1
_RETRY_PAUSE_S = 1.0


@dataclass(frozen=True)
class CursorRow:
    """Where a member of a group may resume in the delivery log, in an epoch of the group."""

    epoch: str
    member: int
    members: int
    filters_key: str
    position: Position
    checked_ms: int
    """The member's checked time (``clawr1.consumer_sdk.delivery``): a member resuming here goes back to it
    for entries that became visible late."""


def _insert(link: Transport, table: str, data: pa.Table) -> None:
    """One insert: as Arrow where the transport takes it."""
    insert_arrow = getattr(link, "insert_arrow", None)
    if insert_arrow is not None:
        insert_arrow(table, data)
    else:
        link.insert(table, [list(row.values()) for row in data.to_pylist()], data.column_names)


class Committer:
    """Writes one consumer's commits and cursor on a thread of its own (started on the first record).

    The thread is a daemon: an interpreter that exits without ``close()`` drops what was not written,
    which the group then gets again (the contract of a crash)."""

    def __init__(self, link: Transport, group: str, consumer_id: str, every: int, every_s: float) -> None:
        self._link = link
        self._group = group
        self._consumer_id = consumer_id
        self._every = every
        self._every_s = every_s
        self._cond = threading.Condition()
        self._pending: dict[str, tuple[str, int]] = {}  # step_id -> (epoch, version), not written yet
        self._in_transit: dict[str, tuple[str, int]] = {}
        self._records = 0  # commit() calls since the last write
        self._since: float | None = None  # when the oldest unwritten record was made
        self._cursor: CursorRow | None = None
        self._written_cursor: CursorRow | None = None
        self._landed: list[tuple[int, frozenset[str]]] = []  # (generation, steps) of recent writes
        self.generation = 0
        """Writes that landed so far."""
        self._requested = self._served = 0
        self._error: BaseException | None = None
        self._retry_at = 0.0
        pause = min(_RETRY_PAUSE_S, every_s)
        self._backoff = Backoff(min(_RETRY_FIRST_S, pause), pause)
        self._refusals = 0  # writes refused in a row
        self._closing = False
        self._thread: threading.Thread | None = None

    # -- the consumer's side ---------------------------------------------------------------------

    def record(self, rows: Mapping[str, tuple[str, int]], cursor: CursorRow | None) -> None:
        """Note one commit: its steps (``step_id -> (epoch, version)``) and the cursor after it."""
        with self._cond:
            self._pending.update(rows)
            if cursor is not None:
                self._cursor = cursor
            self._records += 1
            if self._since is None and self._has_work():
                self._since = time.monotonic()
            self._start()
            self._cond.notify_all()

    def unlanded(self) -> set[str]:
        """Steps recorded as committed and not in the pool yet: a poll must leave them out itself."""
        with self._cond:
            return {*self._pending, *self._in_transit}

    def holding(self, step_ids: Iterable[str], generation: int) -> set[str]:
        """Those of ``step_ids`` recorded as committed and not in the pool yet, or landed in a write after
        ``generation``: a read that began at ``generation`` cannot have seen them committed."""
        ids = set(step_ids)
        with self._cond:
            held = ids & self._pending.keys() | ids & self._in_transit.keys()
            for landed, steps in self._landed:
                if landed > generation:
                    held |= ids & steps
            return held

    def forget_landed(self, generation: int) -> None:
        """Stop remembering the writes that landed by ``generation``: every read still in use began later."""
        with self._cond:
            self._landed = [(g, steps) for g, steps in self._landed if g > generation]

    def flush(self) -> None:
        """Write everything recorded now and wait; raises the write's error if something is left unwritten."""
        with self._cond:
            if not self._has_work() and not self._in_transit:
                return
            self._requested += 1
            target = self._requested
            self._start()
            self._cond.notify_all()
            while self._served < target:
                self._cond.wait()
            if self._error is not None and (self._has_work() or self._in_transit):
                raise self._error

    def take_back(self) -> dict[str, tuple[str, int]]:
        """Give up what is recorded and not written (after a flush that raised): the steps, for the
        consumer to hold in flight again; the cursor recorded with them is dropped."""
        with self._cond:
            rows, self._pending = self._pending, {}
            self._cursor, self._records, self._since = self._written_cursor, 0, None
            return rows

    def close(self) -> None:
        """Flush, then stop the thread; what could not be written is dropped (the group gets those steps
        again) and the write's error raised."""
        try:
            self.flush()
        except BaseException:
            self.take_back()
            raise
        finally:
            with self._cond:
                self._closing = True
                self._cond.notify_all()
            if self._thread is not None:
                self._thread.join()

    # -- the writing thread ----------------------------------------------------------------------

    def _has_work(self) -> bool:
        return bool(self._pending) or (self._cursor is not None and self._cursor != self._written_cursor)

    def _wait_s(self) -> float | None:
        """How long the thread may sleep before a write is due (by count once a refused write's pause is
        over, or by age); None: until woken."""
        due = [self._retry_at] if self._records >= self._every else []
        if self._since is not None:
            due.append(self._since + self._every_s)
        if not due:
            return None
        return max(0.0, max(min(due), self._retry_at) - time.monotonic())

    def _due(self) -> bool:
        if not self._has_work():
            return self._requested > self._served  # a flush with nothing left: answer it
        if self._requested > self._served or self._closing:
            return True
        if time.monotonic() < self._retry_at:
            return False
        return self._records >= self._every or (self._since is not None
                                                and time.monotonic() - self._since >= self._every_s)

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="clawr1-commit", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._due():
                    if self._closing and not self._has_work():
                        return
                    self._cond.wait(self._wait_s())
                rows, self._pending = self._pending, {}
                self._in_transit = rows
                cursor = self._cursor if self._cursor != self._written_cursor else None
                requested, records, self._records, self._since = self._requested, self._records, 0, None
            error: BaseException | None = None
            try:
                self._write(rows, cursor)
            except Exception as exc:  # kept for the next write and raised by the next flush
                error = exc
            with self._cond:
                self._in_transit = {}
                if error is None:
                    self._refusals = 0
                    self.generation += 1
                    self._landed.append((self.generation, frozenset(rows)))
                    if cursor is not None:
                        self._written_cursor = cursor
                else:
                    self._pending = {**rows, **self._pending}
                    self._records += records
                    self._refusals += 1
                    self._retry_at = time.monotonic() + self._backoff.delay(self._refusals)
                    if self._has_work():
                        self._since = self._since or time.monotonic()
                self._error = error
                self._served = max(self._served, requested)
                self._cond.notify_all()

    def _write(self, rows: Mapping[str, tuple[str, int]], cursor: CursorRow | None) -> None:
        if rows:
            n = len(rows)
            _insert(self._link, COMMITS_TABLE, pa.table({
                "group_name": pa.array([self._group] * n, pa.string()),
                "epoch": pa.array([epoch for epoch, _ in rows.values()], pa.string()),
                "step_id": pa.array(list(rows), pa.string()),
                "step_version": pa.array([version for _, version in rows.values()], pa.int64()),
                "consumer_id": pa.array([self._consumer_id] * n, pa.string()),
            }))
        if cursor is not None:
            at_ms, step_id, version = cursor.position
            _insert(self._link, CURSORS_TABLE, pa.table({
                "group_name": pa.array([self._group], pa.string()),
                "epoch": pa.array([cursor.epoch], pa.string()),
                "member": pa.array([cursor.member], pa.uint32()),
                "members": pa.array([cursor.members], pa.uint32()),
                "filters_key": pa.array([cursor.filters_key], pa.string()),
                "logged_at_ms": pa.array([at_ms], pa.int64()),
                "step_id": pa.array([step_id], pa.string()),
                "step_version": pa.array([version], pa.int64()),
                "checked_ms": pa.array([cursor.checked_ms], pa.int64()),
                "set_at_ns": pa.array([time.time_ns()], pa.int64()),
                "consumer_id": pa.array([self._consumer_id], pa.string()),
            }))
