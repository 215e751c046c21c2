"""PoolConsumer: trainers pull curated steps from the pool with consumer-group offsets.

Delivery contract, per group (groups are fully independent):

* a ready step matching the group's filters is delivered once; ``commit()`` records what was
  delivered, and a committed step is never delivered to the group again;
* ``commit()`` returns at once: the commits reach the pool in the background, every few commits or
  seconds (``CLAWR1_SDK_COMMIT_BATCHES``, ``CLAWR1_SDK_COMMIT_SECONDS``), and on ``close()``;
  ``commit(sync=True)`` waits for them;
* what was delivered but not committed, or committed and not written yet (the consumer crashed), is
  delivered again to the next consumer of the group: at-least-once, as a Kafka consumer with periodic
  offset commits (a crash replays at most the commits not written yet and the batch in hand);
* a step that becomes eligible later (a newer version turns it ready, or its reward final) is
  delivered when it does, in the version current at that time;
* ``seek()`` moves the whole group: ``earliest`` replays everything, ``latest`` skips what the pool
  holds now, a time skips step versions that landed in the pool before it. A seek starts a new
  epoch of the group, which forgets older commits.

Several consumers share a group's work by static membership: consumer ``member=i`` of
``members=n`` receives only steps with ``cityHash64(step_id) % n == i`` (``prompt_group_id`` in
``whole_groups`` mode, so a group is never split). Each step hashes to exactly one member, so members
never overlap, and their union is everything. All members must use the same ``members``; a member
that is down holds back its share until a consumer with its index returns.

A consumer is not thread-safe; give each thread its own.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from clawr1.consumer_sdk.batch import StepBatch
from clawr1.consumer_sdk.commits import Committer, CursorRow
from clawr1.consumer_sdk.delivery import (
    LATE_CHECK_S,
    Ledger,
    Page,
    PageRequest,
    Where,
    just_before,
    position_at,
    read_page,
    sort_by_position,
    where,
)
from clawr1.consumer_sdk.errors import ConsumerClosed, UsageError
from clawr1.consumer_sdk.export import ExportManifest, export_steps
from clawr1.consumer_sdk.filters import Filters, filter_sql, to_epoch_ms
from clawr1.consumer_sdk.presets import read_preset
from clawr1.consumer_sdk.queries import (
    LATEST_FLOOR_SQL,
    Position,
    Scope,
    rollout_groups_sql,
    select_list,
    steps_sql,
    trajectories_sql,
    whole_groups_sql,
)
from clawr1.consumer_sdk.source import TransportKind, parse_source
from clawr1.consumer_sdk.transport import Transport, open_transport
from clawr1.core.backoff import Backoff
from clawr1.core.registry import SDK_COMMIT_BATCHES, SDK_COMMIT_SECONDS
from clawr1.pool.consumer_tables import POSITIONS_TABLE

__all__ = ["PoolConsumer"]

_POSITION_COLUMNS = ["group_name", "epoch", "floor_ms", "set_at_ns", "consumer_id"]
# Between the fetches of a call that waits for steps: from 0.05 s doubling, at most 1 s (full jitter).
_WAITS = Backoff(0.05, 1.0)
READ_AHEAD_MAX_AGE_S = 5.0
"""How long steps read ahead (``read_ahead``) may wait in the consumer before they are read again."""


def _positive_int(name: str, value: Any, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{name} must be a positive integer, got {value!r}")
    return value


def _token_counts(table: pa.Table) -> pa.ChunkedArray:
    return pc.add(pc.list_value_length(table.column("prompt_token_ids")),
                  pc.list_value_length(table.column("response_token_ids")))


def _within(table: pa.Table, max_steps: int, max_tokens: int | None) -> pa.Table:
    """The longest prefix within ``max_steps`` and ``max_tokens`` (at least one step)."""
    table = table.slice(0, max_steps)
    if max_tokens is None or not table.num_rows:
        return table
    running = np.cumsum(_token_counts(table).to_numpy())
    return table.slice(0, max(1, int(np.searchsorted(running, max_tokens, side="right"))))


def _fills(table: pa.Table, max_steps: int, max_tokens: int | None) -> bool:
    """Whether ``table`` holds a whole batch: ``max_steps`` steps or ``max_tokens`` tokens."""
    if table.num_rows >= max_steps:
        return True
    return max_tokens is not None and int(pc.sum(_token_counts(table)).as_py() or 0) >= max_tokens


class PoolConsumer:
    """Pull batches of curated steps for consumer group ``group`` from ``source``.

    ``source`` is the stack's API URL (``http(s)://``) or a ClickHouse DSN (``chdb:///path``,
    ``clickhouse[+http|+https]://``); ``transport`` forces one reading (see
    ``clawr1.consumer_sdk.source``), or is an open ``Transport`` to read through (closed with the consumer).
    ``preset`` names saved filters; keyword ``filters`` (see :class:`Filters`) refine them.
    ``read_ahead``: how many batches one ready poll may read at once, the rest served to the next polls
    while the next read runs in the background (1: none; see ``_ready_batch``).
    """

    def __init__(
        self,
        source: str,
        group: str,
        *,
        preset: str | None = None,
        member: int = 0,
        members: int = 1,
        whole_groups: bool = False,
        with_text: bool = False,
        transport: TransportKind | Transport | None = None,
        api_key: str | None = None,
        request_timeout: float = 30.0,
        read_ahead: int = 32,
        **filters: Any,
    ) -> None:
        if not isinstance(group, str) or not group or len(group) > 256:
            raise UsageError(f"group must be a non-empty string of at most 256 characters, got {group!r}")
        _positive_int("members", members)
        _positive_int("read_ahead", read_ahead)
        if isinstance(member, bool) or not isinstance(member, int) or not 0 <= member < members:
            raise UsageError(f"member must be an integer in [0, {members}), got {member!r}")
        explicit = Filters.from_kwargs(**filters)
        self.group = group
        self.member = member
        self.members = members
        self.whole_groups = bool(whole_groups)
        self.with_text = bool(with_text)
        self.consumer_id = uuid.uuid4().hex
        self._select = select_list(with_text)
        self._policy_version: int | None = None
        self._epoch: str | None = None
        self._in_flight: dict[str, tuple[str, int]] = {}
        self._ledger = Ledger()
        self.read_ahead = read_ahead
        # Where ready polls stand in the delivery log (see clawr1.consumer_sdk.delivery): the end of the last
        # read in this epoch, whether the log went on past it, the steps read and not handed out yet (not
        # in flight; in log order, with logged_at) with each read they came from (rows, when it began, the
        # committer's landed writes then), the batches handed out (last position, steps), the next read
        # running in the background, and the checked time for entries that became visible late with when
        # the last read that moved it began.
        self._after: Position | None = None
        self._checked_ms: int | None = None
        self._known: Where | None = None  # where the group stood at the last read
        self._checked_at = -math.inf
        self._more = True
        self._ahead: pa.Table | None = None
        self._reads: deque[tuple[int, float, int]] = deque()
        self._handed: list[tuple[Position, tuple[str, ...]]] = []
        self._prefetch: tuple[Future[Page], int, int] | None = None  # the read, resets, its generation
        self._resets = 0
        self._reader: ThreadPoolExecutor | None = None
        self._empty: pa.Table | None = None
        self._tokens_per_step: float | None = None  # of the ready steps read so far: sizes read-ahead pages
        self._transport: Transport | None = (
            open_transport(parse_source(source, transport), api_key=api_key, request_timeout=request_timeout)
            if transport is None or isinstance(transport, str)
            else transport  # an open link (the dashboard's preview reads through its own pool store)
        )
        self._committer = Committer(self._transport, group, self.consumer_id,
                                    SDK_COMMIT_BATCHES.read(os.environ), SDK_COMMIT_SECONDS.read(os.environ))
        try:
            self.filters: Filters = (
                read_preset(self._transport, preset).merged(**filters) if preset is not None else explicit
            )
            if self.whole_groups and self.filters.ready is not True:
                raise UsageError("whole_groups delivers only ready groups: leave ready=True")
            # A cursor is kept per set of filters: an entry one set passed over may qualify for another.
            self._filters_key = hashlib.sha256(self.filters.to_json().encode()).hexdigest()[:16]
        except BaseException:
            self.close()
            raise

    # -- state ---------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._transport is None

    @property
    def uncommitted(self) -> int:
        """Steps delivered by this consumer and not committed yet."""
        return len(self._in_flight)

    def _link(self) -> Transport:
        if self._transport is None:
            raise ConsumerClosed(f"consumer of group {self.group!r} is closed")
        return self._transport

    def report_policy_version(self, version: int) -> None:
        """The policy version the trainer is at now; ``max_staleness`` counts back from it."""
        if isinstance(version, bool) or not isinstance(version, int):
            raise UsageError(f"policy version must be an integer, got {version!r}")
        if version != self._policy_version:
            self._drop_read_ahead()  # read under the old version's max_staleness
        self._policy_version = version

    # -- fetching ------------------------------------------------------------------------------

    def poll(
        self,
        max_steps: int = 256,
        max_tokens: int | None = None,
        timeout: float | None = 0.0,
        max_groups: int | None = None,
    ) -> StepBatch:
        """The next batch: at most ``max_steps`` steps and ``max_tokens`` tokens (at least one step).

        Waits up to ``timeout`` seconds for something to arrive (``None``: until something does) and
        returns an empty batch if nothing did. ``max_groups`` caps prompt groups in ``whole_groups`` mode.
        """
        _positive_int("max_steps", max_steps)
        _positive_int("max_tokens", max_tokens, allow_none=True)
        _positive_int("max_groups", max_groups, allow_none=True)
        if max_groups is not None and not self.whole_groups:
            raise UsageError("max_groups applies only to whole_groups consumers")
        return self._waiting(lambda: self._fetch(max_steps, max_tokens, max_groups), timeout)

    def fetch_batch(
        self,
        batch_size: int,
        n_rollouts: int | None = None,
        channel: str | list[str] | None = None,
        timeout: float | None = None,
    ) -> StepBatch:
        """The seed system's ``DataPool.fetch_batch``: ``batch_size`` whole prompt groups with
        ``n_rollouts`` complete trajectories each (every step of them), groups first come first served.

        Blocks until that many groups are complete (``timeout`` seconds at most; ``None``: forever, as
        upstream) and returns an empty batch if they never were. ``n_rollouts`` None takes each group's
        declared ``prompt_group_size``; ``channel`` overrides the consumer's channel for this call. A
        group that never completes (a crashed rollout) does not hold back the groups behind it.
        Delivery is like :meth:`poll`: the steps are in flight until :meth:`commit`.
        ``batch.to_verl()`` gives the veRL layout. See :func:`clawr1.consumer_sdk.queries.rollout_groups_sql`.
        """
        _positive_int("batch_size", batch_size)
        _positive_int("n_rollouts", n_rollouts, allow_none=True)
        filters = self.filters if channel is None else self.filters.merged(channel=channel)
        return self._waiting(lambda: self._fetch_groups(filters, batch_size, n_rollouts), timeout)

    @staticmethod
    def _waiting(fetch: Callable[[], StepBatch], timeout: float | None) -> StepBatch:
        """``fetch()`` until it returns something or ``timeout`` passes, backing off between tries."""
        if timeout is not None and (not isinstance(timeout, int | float) or timeout < 0):
            raise UsageError(f"timeout must be >= 0 seconds or None, got {timeout!r}")
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        waits = _WAITS.delays()
        while True:
            batch = fetch()
            remaining = deadline - time.monotonic()
            if len(batch) or remaining <= 0:
                return batch
            time.sleep(min(next(waits), remaining))

    def _enter(self, epoch: str) -> None:
        """Be in ``epoch``: one the group moved to elsewhere forgets what this consumer holds."""
        if epoch != self._epoch:
            if self._epoch is not None:
                self._forget_epoch()
            self._epoch = epoch

    def _forget_epoch(self) -> None:
        self._in_flight.clear()
        self._ledger.clear()
        self._handed.clear()
        self._after = None
        self._checked_ms = None
        self._known = None
        self._more = True
        self._drop_read_ahead()

    def _scope(self) -> Scope:
        """Where the group stands now (epoch, floor), for the reads of the ``steps`` view."""
        now = where(self._link(), self.group)
        self._enter(now.epoch)
        taken = (*self._in_flight, *self._committer.unlanded())
        return Scope(self.group, now.epoch, now.floor_ms, taken, self.member, self.members)

    def _fetch(self, max_steps: int, max_tokens: int | None, max_groups: int | None) -> StepBatch:
        clauses, params = filter_sql(self.filters, self._policy_version)
        if self.filters.ready is True and not self.whole_groups:
            return self._ready_batch(clauses, params, max_steps, max_tokens)
        scope = self._scope()
        if self.whole_groups:
            sql, scope_params = whole_groups_sql(
                self._select, clauses, scope, max_steps, max_tokens, max_groups
            )
        else:
            sql, scope_params = steps_sql(self._select, clauses, scope, max_steps, max_tokens)
        return self._deliver(StepBatch(self._link().query(sql, {**params, **scope_params})), scope.epoch)

    def _ready_batch(self, clauses: list[str], params: dict[str, Any], max_steps: int,
                     max_tokens: int | None) -> StepBatch:
        """The next ready batch, from the delivery log after this member's position.

        A read takes up to ``read_ahead`` batches (its cost is a range of the log by primary key plus a
        query's fixed cost, so a fast loop pays the fixed cost once per ``read_ahead`` batches); the next
        read starts in the background as soon as one returns a full page. Batches served from what was
        read ahead read nothing, not even the group's position (nor does that read in the background, unless
        it is a check for late entries): a seek by another member, or a step's newer version, is seen by a
        later read, at most ``READ_AHEAD_MAX_AGE_S`` later. Steps read ahead are not
        in flight: a crash or ``close()`` forgets them and nothing is lost; a seek here or a new policy
        version drops them."""
        self._expire_read_ahead()
        read = False
        while True:
            if self._wants_read(read, max_steps, max_tokens):
                self._accept(self._next_page(clauses, params, max_steps))
                read = True
                continue
            batch = self._take(max_steps, max_tokens)
            if len(batch) or (read and not self._more):
                break
        self._read_next(clauses, params, max_steps)
        return batch

    def _wants_read(self, read: bool, max_steps: int, max_tokens: int | None) -> bool:
        """Read when nothing is ahead (once per poll when the last read reached the log's end), or too
        little for a batch while the log goes on past the last read. What a read that reached the end got
        is handed out without reading again: the next poll reads."""
        if self._ahead is None:
            return self._more or not read
        return self._more and not _fills(self._ahead, max_steps, max_tokens)

    def _page_request(self, clauses: list[str], params: dict[str, Any], max_steps: int,
                      known: Where | None = None) -> PageRequest:
        return PageRequest(self.group, self.member, self.members, self._filters_key, self._epoch, self._after,
                           tuple(self._handed), max_steps, self.read_ahead, self._tokens_per_step,
                           self.with_text, clauses, params, self._committer.generation, self._policy_version,
                           self._checked_ms, time.monotonic() - self._checked_at >= LATE_CHECK_S, known)

    def _next_page(self, clauses: list[str], params: dict[str, Any], max_steps: int) -> Page:
        """The read running in the background when it continues from where this consumer stands, else a
        read now."""
        prefetch, self._prefetch = self._prefetch, None
        if prefetch is not None:
            page = prefetch[0].result()
            if prefetch[1] == self._resets and page.request.after == self._after \
                    and page.request.epoch == self._epoch:
                return page
        return read_page(self._link(), self._page_request(clauses, params, max_steps), time.monotonic())

    def _read_next(self, clauses: list[str], params: dict[str, Any], max_steps: int) -> None:
        """Start the next read in the background, when the log goes on and none runs."""
        if self._prefetch is not None or not self._more or self._after is None or self.read_ahead == 1:
            return
        if self._reader is None:
            self._reader = ThreadPoolExecutor(1, thread_name_prefix="clawr1-read-ahead")
        link, request = self._link(), self._page_request(clauses, params, max_steps, self._known)
        running = self._reader.submit(lambda: read_page(link, request, time.monotonic()))
        self._prefetch = (running, self._resets, request.generation)

    def _accept(self, page: Page) -> None:
        """Take a read's steps into the read-ahead, in log order; the group may have moved meanwhile."""
        self._enter(page.where.epoch)
        self._after, self._more, self._known = page.end, page.full, page.where
        if page.request.check or page.request.checked_ms is None:
            self._checked_at = page.read_at
        self._checked_ms = page.checked_ms
        # A handed batch stays left out of reads as long as a check read may go back over it.
        below = min(page.start, (page.checked_ms, "", -1))
        self._handed = [(last, ids) for last, ids in self._handed if last > below]
        rows = page.rows
        self._empty = rows.slice(0, 0)
        if self._ahead is not None and rows.num_rows:  # an entry that became visible late, read twice
            seen = self._ahead.column("step_id")
            rows = rows.filter(pc.invert(pc.is_in(rows.column("step_id"), value_set=seen)))
        if rows.num_rows:
            self._tokens_per_step = int(pc.sum(_token_counts(rows)).as_py() or 0) / rows.num_rows
            self._reads.append((rows.num_rows, page.read_at, page.request.generation))
            if self._ahead is None:
                self._ahead = rows
            elif position_at(rows, 0) > position_at(self._ahead, self._ahead.num_rows - 1):
                self._ahead = pa.concat_tables([self._ahead, rows])
            else:
                self._ahead = sort_by_position(pa.concat_tables([self._ahead, rows]))
                read_at, generation = min(r[1] for r in self._reads), min(r[2] for r in self._reads)
                self._reads = deque([(self._ahead.num_rows, read_at, generation)])

    def _take(self, max_steps: int, max_tokens: int | None) -> StepBatch:
        """Hand out the next batch of what was read ahead, leaving out steps this consumer holds or
        committed since the read (a newer version of them)."""
        ahead = self._ahead
        if ahead is None:
            assert self._empty is not None  # a read came first
            return StepBatch(self._empty.drop_columns(["logged_at"]))
        generation = min(r[2] for r in self._reads)
        window = max_steps
        while True:
            head = ahead.slice(0, window)
            ids = head.column("step_id").to_pylist()
            held = self._in_flight.keys() & ids | self._committer.holding(ids, generation)
            kept = np.flatnonzero([s not in held for s in ids]) if held else np.arange(head.num_rows)
            candidates = head.take(pa.array(kept)) if held else head
            chosen = _within(candidates, max_steps, max_tokens)
            if chosen.num_rows >= max_steps or chosen.num_rows < candidates.num_rows \
                    or head.num_rows == ahead.num_rows:
                break
            window *= 2  # steps left out shortened the batch: look further
        self._consume(int(kept[chosen.num_rows - 1]) + 1 if chosen.num_rows else head.num_rows)
        if not chosen.num_rows:
            return StepBatch(chosen.drop_columns(["logged_at"]))
        batch = StepBatch(chosen.drop_columns(["logged_at"]))
        self._handed.append((position_at(chosen, chosen.num_rows - 1), batch.step_ids))
        return self._deliver(batch, self._epoch or "", just_before(position_at(chosen, 0)))

    def _consume(self, rows: int) -> None:
        """Drop the first ``rows`` of the read-ahead (handed out, or left out)."""
        ahead = self._ahead
        assert ahead is not None
        self._ahead = ahead.slice(rows) if rows < ahead.num_rows else None
        while rows and self._reads:
            count, read_at, generation = self._reads[0]
            if count > rows:
                self._reads[0] = (count - rows, read_at, generation)
                break
            rows -= count
            self._reads.popleft()
        # Writes that landed before every read still in use began are seen by those reads themselves.
        since = [r[2] for r in self._reads] + ([self._prefetch[2]] if self._prefetch is not None else [])
        self._committer.forget_landed(min(since, default=self._committer.generation))

    def _expire_read_ahead(self) -> None:
        if self._reads and time.monotonic() - min(r[1] for r in self._reads) >= READ_AHEAD_MAX_AGE_S:
            self._drop_read_ahead()

    def _drop_read_ahead(self) -> None:
        """Forget what was read ahead (it is read again) and the read running in the background; the next
        read is a check (a new policy version may let older entries through)."""
        self._checked_at = -math.inf
        if self._ahead is not None and self._after is not None:
            self._after = min(self._after, just_before(position_at(self._ahead, 0)))
            self._more = True
        self._ahead = None
        self._reads.clear()
        self._prefetch = None
        self._resets += 1

    def _fetch_groups(self, filters: Filters, batch_size: int, n_rollouts: int | None) -> StepBatch:
        scope = self._scope()
        clauses, params = filter_sql(filters, self._policy_version)
        sql, scope_params = rollout_groups_sql(clauses, scope, batch_size, n_rollouts)
        chosen = self._link().query(sql, {**params, **scope_params}).to_pylist()
        complete = len({row["prompt_group_id"] for row in chosen}) == batch_size
        # Not enough complete groups yet: an empty batch (with the steps' columns) and nothing in flight.
        trajectories = [row["trajectory_id"] for row in chosen] if complete else []
        table = self._link().query(trajectories_sql(self._select), {"c_trajectories": trajectories})
        return self._deliver(StepBatch(table), scope.epoch)

    def _deliver(self, batch: StepBatch, epoch: str, hold: Position | None = None) -> StepBatch:
        """Mark the batch's steps in flight (what ``commit()`` records); ``hold``: where the batch holds
        the member's cursor (None: delivered outside the log's order)."""
        versions = batch.to_arrow().column("version").to_pylist()
        for step_id, version in zip(batch.step_ids, versions, strict=True):
            self._in_flight[step_id] = (epoch, int(version))
        self._ledger.deliver(batch.step_ids, hold)
        return batch

    def export(self, out: str | Path, **options: Any) -> ExportManifest:
        """Write every step matching this consumer's filters to dataset files in ``out`` (see
        :func:`clawr1.consumer_sdk.export.export_steps` for ``format``, ``group_by``, ``where``...). Reads
        only: nothing is delivered, committed or put in flight."""
        return export_steps(self._link(), out, filters=self.filters, **options)

    def iter_batches(
        self, max_steps: int = 256, max_tokens: int | None = None, idle_timeout: float | None = None
    ) -> Iterator[StepBatch]:
        """Batches as they come; ends after ``idle_timeout`` seconds without one, or when closed."""
        while not self.closed:
            batch = self.poll(max_steps=max_steps, max_tokens=max_tokens, timeout=idle_timeout)
            if not len(batch):
                return
            yield batch

    def __iter__(self) -> Iterator[StepBatch]:
        return self.iter_batches()

    # -- offsets -------------------------------------------------------------------------------

    def _cursor_row(self) -> CursorRow | None:
        """Where this member may resume in the log: the lowest of the end of its last read, just before
        the first step read ahead, and what deliveries not committed yet hold (none while a delivery made
        outside the log's order is uncommitted)."""
        if self._epoch is None or self._after is None or self._checked_ms is None or self._ledger.frozen:
            return None
        holds = [self._after]
        if self._ahead is not None:
            holds.append(just_before(position_at(self._ahead, 0)))
        if (held := self._ledger.hold()) is not None:
            holds.append(held)
        return CursorRow(self._epoch, self.member, self.members, self._filters_key, min(holds),
                         self._checked_ms)

    def commit(self, batch: StepBatch | None = None, *, sync: bool = False) -> int:
        """Record as consumed everything delivered so far (or just ``batch``); returns the step count.

        Steps of ``batch`` that are not in flight here (already committed, or forgotten by a seek)
        are skipped. Committed steps are never handed out again by this consumer.

        Returns at once: the commit reaches the pool in the background, with the ones before it, after
        ``CLAWR1_SDK_COMMIT_BATCHES`` commits or ``CLAWR1_SDK_COMMIT_SECONDS`` seconds, and on ``flush()``,
        ``seek()`` and ``close()``. A crash before that delivers those steps again to the group's next
        consumer (at-least-once); a background write the pool refused is tried again. ``sync=True`` writes
        it, and everything recorded before, now, and raises if the pool refused them: those steps are then
        in flight again (commit them again).
        """
        self._link()
        ids = list(self._in_flight) if batch is None else [s for s in batch.step_ids if s in self._in_flight]
        taken = {step_id: self._in_flight.pop(step_id) for step_id in ids}
        self._ledger.settle(taken)
        if taken:
            # The cursor is written with commits only: a consumer that never commits (the dashboard's
            # preview) never moves its group.
            self._committer.record(taken, self._cursor_row())
        if sync:
            try:
                self._committer.flush()
            except Exception:
                returned = self._committer.take_back()  # in flight again: commit them again
                self._in_flight.update(returned)
                self._ledger.deliver(returned, None)
                raise
        return len(taken)

    def flush(self) -> None:
        """Write what ``commit()`` recorded now and wait (``seek`` and ``close`` do this on their own);
        raises the write's error if the pool refused it."""
        self._link()
        self._committer.flush()

    def seek(self, position: Literal["earliest", "latest"] | datetime | int) -> None:
        """Move the whole group to ``earliest``, ``latest``, or a time (aware datetime / epoch ms).

        Writes this consumer's commits first. Uncommitted deliveries are dropped; every member of the
        group sees the new position on its next read of the pool.
        """
        link = self._link()
        self._committer.flush()
        if position == "earliest":
            floor_ms = 0
        elif position == "latest":
            floor_ms = int(link.query(LATEST_FLOOR_SQL, {}).to_pylist()[0]["floor_ms"])
        elif isinstance(position, str):
            raise UsageError(f"seek position must be 'earliest', 'latest' or a time, got {position!r}")
        else:
            floor_ms = to_epoch_ms(position, "seek position")
        epoch = uuid.uuid4().hex
        link.insert(POSITIONS_TABLE, [[self.group, epoch, floor_ms, time.time_ns(), self.consumer_id]],
                    _POSITION_COLUMNS)
        self._enter(epoch)

    # -- lifecycle -----------------------------------------------------------------------------

    def close(self) -> None:
        """Write what ``commit()`` recorded and release the connection. Uncommitted deliveries are not
        committed: they will come again; so will commits the pool refused (close raises the error)."""
        if self._transport is None:
            return
        try:
            self._drop_read_ahead()
            if self._reader is not None:
                self._reader.shutdown(wait=True)  # the read in the background, if one runs
            self._committer.close()
        finally:
            transport, self._transport = self._transport, None
            transport.close()

    def __enter__(self) -> PoolConsumer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"uncommitted={self.uncommitted}"
        return f"<PoolConsumer group={self.group!r} member={self.member}/{self.members} {state}>"
