"""PoolConsumer: trainers pull curated steps from the pool with consumer-group offsets.

Delivery contract, per group (groups are fully independent):

* a ready step matching the group's filters is delivered once; ``commit()`` records what was
  delivered in the pool, and a committed step is never delivered to the group again;
* what was delivered but not committed (the consumer crashed, or closed without committing) is
  delivered again to the next consumer of the group: at-least-once, so commit right after the
  update a batch fed (a crash between the two replays just that batch);
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

import math
import time
import uuid
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
from clawr1.consumer_sdk.errors import ConsumerClosed, UsageError
from clawr1.consumer_sdk.export import ExportManifest, export_steps
from clawr1.consumer_sdk.filters import Filters, filter_sql, to_epoch_ms
from clawr1.consumer_sdk.presets import read_preset
from clawr1.consumer_sdk.queries import (
    LATEST_FLOOR_SQL,
    POSITION_SQL,
    Scope,
    newest_matching,
    queue_page_end_sql,
    ready_steps_sql,
    rollout_groups_sql,
    select_list,
    steps_sql,
    trajectories_sql,
    version_columns,
    whole_groups_sql,
)
from clawr1.consumer_sdk.source import TransportKind, parse_source
from clawr1.consumer_sdk.transport import Transport, open_transport
from clawr1.pool.consumer_tables import COMMITS_TABLE, POSITIONS_TABLE

__all__ = ["PoolConsumer"]

_COMMIT_COLUMNS = ["group_name", "epoch", "step_id", "step_version", "consumer_id"]
_POSITION_COLUMNS = ["group_name", "epoch", "floor_ms", "set_at_ns", "consumer_id"]
_FIRST_WAIT_S = 0.05
_MAX_WAIT_S = 1.0
READ_AHEAD_MAX_AGE_S = 5.0
"""How long steps read ahead (``read_ahead``) may wait in the consumer before they are read again."""
_READ_AHEAD_MAX_ROWS = 65_536
READ_AHEAD_MAX_TOKENS = 8_000_000
"""A read-ahead page holds at most about this many tokens (judged on the steps read so far; the first page
of a consumer reads one batch): about 50 MB of Arrow with logprobs on the responses."""


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


def _write_commits(link: Transport, data: pa.Table) -> None:
    """One insert of commit rows (on the commit thread): Arrow when the transport takes it."""
    insert_arrow = getattr(link, "insert_arrow", None)
    if insert_arrow is not None:
        insert_arrow(COMMITS_TABLE, data)
    else:
        link.insert(COMMITS_TABLE, [list(row.values()) for row in data.to_pylist()], _COMMIT_COLUMNS)


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
    (1: none; see ``_ready_batch``).
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
        self.consumer_id = uuid.uuid4().hex
        self._select = select_list(with_text)
        self._columns = version_columns(with_text)
        self._policy_version: int | None = None
        self._epoch: str | None = None
        self._in_flight: dict[str, tuple[str, int]] = {}
        # Committed by commit() whose insert may not have landed yet: still left out of every poll; durable
        # before the next poll, fetch_batch, seek or close returns (see commit()).
        self._committing: dict[str, tuple[str, int]] = {}
        self._pending: Future[None] | None = None
        self._committer: ThreadPoolExecutor | None = None
        self.read_ahead = read_ahead
        # Ready steps read ahead and not handed out yet (not in flight): the rest of the last page, and
        # when it was read (time.monotonic()). A new epoch, a seek or a new policy version drops it.
        self._ahead: pa.Table | None = None
        self._ahead_at = 0.0
        self._tokens_per_step: float | None = None  # of the ready steps read so far: sizes read-ahead pages
        self._transport: Transport | None = (
            open_transport(parse_source(source, transport), api_key=api_key, request_timeout=request_timeout)
            if transport is None or isinstance(transport, str)
            else transport  # an open link (the dashboard's preview reads through its own pool store)
        )
        try:
            self.filters: Filters = (
                read_preset(self._transport, preset).merged(**filters) if preset is not None else explicit
            )
            if self.whole_groups and self.filters.ready is not True:
                raise UsageError("whole_groups delivers only ready groups: leave ready=True")
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
            self._ahead = None  # read under the old version's max_staleness
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
        wait = _FIRST_WAIT_S
        while True:
            batch = fetch()
            remaining = deadline - time.monotonic()
            if len(batch) or remaining <= 0:
                return batch
            time.sleep(min(wait, remaining))
            wait = min(wait * 2, _MAX_WAIT_S)

    def _scope(self) -> Scope:
        """Where the group stands now (epoch, floor), forgetting deliveries of an older epoch."""
        position = self._link().query(POSITION_SQL, {"group": self.group}).to_pylist()[0]
        epoch, floor_ms = str(position["epoch"]), int(position["floor_ms"])
        if epoch != self._epoch:
            # The group was sought elsewhere: what this consumer holds belongs to a forgotten epoch.
            self._in_flight.clear()
            self._ahead = None
            self._epoch = epoch
        taken = (*self._in_flight, *self._committing)
        return Scope(self.group, epoch, floor_ms, taken, self.member, self.members)

    def _fetch(self, max_steps: int, max_tokens: int | None, max_groups: int | None) -> StepBatch:
        scope = self._scope()
        clauses, params = filter_sql(self.filters, self._policy_version)
        if self.whole_groups:
            sql, scope_params = whole_groups_sql(
                self._select, clauses, scope, max_steps, max_tokens, max_groups
            )
        elif self.filters.ready is True:
            return self._deliver(StepBatch(self._ready_batch(clauses, params, scope, max_steps, max_tokens)),
                                 scope.epoch)
        else:
            sql, scope_params = steps_sql(self._select, clauses, scope, max_steps, max_tokens)
        return self._deliver(StepBatch(self._link().query(sql, {**params, **scope_params})), scope.epoch)

    def _ready_batch(self, clauses: list[str], params: dict[str, Any], scope: Scope, max_steps: int,
                     max_tokens: int | None) -> pa.Table:
        """The next ready batch: from what was read ahead when it holds a full batch read under the same
        epoch and policy version less than ``READ_AHEAD_MAX_AGE_S`` ago, else from a fresh read of up to
        ``read_ahead`` batches (the rest is kept for the next polls).

        A read costs about the same for one batch as for several (its cost is the pool granules the
        scattered steps sit in, and a query's fixed cost), so a fast loop reads each granule once per
        ``read_ahead`` batches. Steps read ahead are not in flight: a crash or ``close()`` forgets them
        and nothing is lost; a seek (here or by another member, seen by the position read every poll)
        or a new policy version drops them."""
        ahead, self._ahead = self._ahead, None
        fresh = ahead is not None and time.monotonic() - self._ahead_at < READ_AHEAD_MAX_AGE_S
        if not (fresh and ahead is not None and _fills(ahead, max_steps, max_tokens)):
            ahead = self._ready_steps(clauses, params, scope, max_steps, max_tokens, self._scan(max_steps))
            self._ahead_at = time.monotonic()
            if ahead.num_rows:
                self._tokens_per_step = int(pc.sum(_token_counts(ahead)).as_py() or 0) / ahead.num_rows
        batch = _within(ahead, max_steps, max_tokens)
        if batch.num_rows < ahead.num_rows:
            self._ahead = ahead.slice(batch.num_rows)
        return batch

    def _scan(self, max_steps: int) -> int:
        """Queue entries one ready page reads: ``read_ahead`` batches, as far as about
        ``READ_AHEAD_MAX_TOKENS`` tokens of steps like those read so far hold (one batch before any)."""
        if self._tokens_per_step is None:
            return max_steps
        by_tokens = int(READ_AHEAD_MAX_TOKENS / max(self._tokens_per_step, 1.0))
        return max(max_steps, min(max_steps * self.read_ahead, by_tokens, _READ_AHEAD_MAX_ROWS))

    def _ready_steps(self, clauses: list[str], params: dict[str, Any], scope: Scope, max_steps: int,
                     max_tokens: int | None, scan: int) -> pa.Table:
        """Pages of ``scan`` ready-queue entries (see ``ready_steps_sql``) until a batch is full or the
        queue ends; usually one page, one query."""
        pages: list[pa.Table] = []
        rows = tokens = 0
        after: tuple[int, str] | None = None
        while True:
            sql, page_params = ready_steps_sql(self._columns, clauses, scope, scan, after)
            page = newest_matching(self._link().query(sql, {**params, **page_params}))
            if pages:  # a step with entries on two pages is delivered once
                taken = pa.array([s for p in pages for s in p.column("step_id").to_pylist()], pa.string())
                page = page.filter(pc.invert(pc.is_in(page.column("step_id"), value_set=taken)))
            pages.append(page)
            rows += page.num_rows
            tokens += int(pc.sum(_token_counts(page)).as_py() or 0)
            if rows >= max_steps or (max_tokens is not None and tokens >= max_tokens):
                break
            sql, end_params = queue_page_end_sql(scope, scan, after)
            end = self._link().query(sql, end_params).to_pylist()[0]
            if int(end["entries"]) < scan:
                break
            after = (int(end["at_ms"]), str(end["step_id"]))
        return pa.concat_tables(pages)

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

    def _deliver(self, batch: StepBatch, epoch: str) -> StepBatch:
        """Mark the batch's steps in flight (what ``commit()`` records), once the last commit landed."""
        self._settle()
        versions = batch.to_arrow().column("version").to_pylist()
        for step_id, version in zip(batch.step_ids, versions, strict=True):
            self._in_flight[step_id] = (epoch, int(version))
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

    def commit(self, batch: StepBatch | None = None, *, wait: bool = True) -> int:
        """Record as consumed everything delivered so far (or just ``batch``); returns the step count.

        Steps of ``batch`` that are not in flight here (already committed, or forgotten by a seek)
        are skipped.

        Returns once the commit is in the pool (and raises if the pool refused it). With ``wait=False``
        the rows are written on a background thread while the trainer goes on: the next ``poll``,
        ``fetch_batch``, ``seek``, ``commit`` or ``close`` (or ``flush()``) waits for them first and
        raises the insert's error there if it failed (the steps are then in flight again); until they
        land the steps are left out of every poll. A crash before that replays the batch, as a crash just
        before a waiting ``commit()`` would: at-least-once either way.
        """
        link = self._link()
        self._settle()
        ids = list(self._in_flight) if batch is None else [s for s in batch.step_ids if s in self._in_flight]
        if not ids:
            return 0
        taken = {step_id: self._in_flight.pop(step_id) for step_id in ids}
        self._committing.update(taken)
        n = len(ids)
        data = pa.table({
            "group_name": pa.array([self.group] * n, pa.string()),
            "epoch": pa.array([epoch for epoch, _ in taken.values()], pa.string()),
            "step_id": pa.array(ids, pa.string()),
            "step_version": pa.array([version for _, version in taken.values()], pa.int64()),
            "consumer_id": pa.array([self.consumer_id] * n, pa.string()),
        })
        if self._committer is None:
            # Not a daemon: an interpreter that exits waits for the commit being written.
            self._committer = ThreadPoolExecutor(1, thread_name_prefix="clawr1-commit")
        self._pending = self._committer.submit(_write_commits, link, data)
        if wait:
            self._settle()
        return n

    def flush(self) -> None:
        """Wait until what ``commit()`` recorded is in the pool (``poll``, ``fetch_batch``, ``seek`` and
        ``close`` do this on their own); raises the commit's error if its insert failed."""
        self._settle()

    def _settle(self) -> None:
        """Wait for the commit being written. If it failed, its steps are in flight again (a ``commit()``
        sends them again) and its error is raised."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        try:
            pending.result()
        except BaseException:
            self._in_flight.update(self._committing)
            raise
        finally:
            self._committing.clear()

    def seek(self, position: Literal["earliest", "latest"] | datetime | int) -> None:
        """Move the whole group to ``earliest``, ``latest``, or a time (aware datetime / epoch ms).

        Uncommitted deliveries are dropped; every member of the group sees the new position on its
        next poll.
        """
        link = self._link()
        self._settle()
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
        self._in_flight.clear()
        self._ahead = None
        self._epoch = epoch

    # -- lifecycle -----------------------------------------------------------------------------

    def close(self) -> None:
        """Release the connection. Uncommitted deliveries are not committed: they will come again."""
        self._ahead = None
        if self._transport is not None:
            try:
                self._settle()
            finally:
                transport, self._transport = self._transport, None
                if self._committer is not None:
                    self._committer.shutdown(wait=True)
                    self._committer = None
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
