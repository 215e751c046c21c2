"""Reading the pool's delivery log: pages of ready steps after a position, and the deliveries that hold a
group's cursor back.

The delivery log (``pool/migrations.py``, ``DELIVERY_LOG``) holds every step version in the order it landed
in the pool; a position ``(logged_at ms, step_id, version)`` is a point in it. A member of a group reads
the entries after its position, so a page is one range read by primary key, with the training payload in
the same rows. What may be written as the member's cursor is the lowest position it could still owe the
group anything after: the end of what it read, or just before the first step it read and has not handed
out, or just before the first step of a delivery not committed yet.

Entries are stamped with the pool's clock when the sink's insert runs; two inserts running at once (several
sink processes) may become visible in the other order, up to ``LATE_ARRIVAL_MS`` after their stamp. A member
therefore keeps a *checked* time: every entry stamped before it, up to where the member has read, has been
read. A *check* read starts there (or at the member's position, when that is lower), leaving out the steps
the member already holds, and moves it to ``LATE_ARRIVAL_MS`` before the pool's clock; other reads start at
the member's position and leave it where it is. The consumer makes every read a check once
``LATE_CHECK_S`` have passed since the last one, so a late entry is read at most that much after it became
visible, however long the trainer paused between polls, and a fast loop does not read its last seconds of
log again on every poll.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from clawr1.consumer_sdk.queries import (
    CURSOR_SQL,
    NEWEST_SQL,
    POSITION_SQL,
    SIZES_SQL,
    Position,
    Scope,
    delivery_columns,
    delivery_page_sql,
    stored_versions_sql,
    version_columns,
)
from clawr1.consumer_sdk.transport import Transport

READ_AHEAD_MAX_TOKENS = 8_000_000
"""A read holds at most about this many tokens (judged on the steps read so far, or on the sizes of the next
entries for a member's first read): about 50 MB of Arrow with logprobs on the responses."""
_READ_AHEAD_MAX_ROWS = 65_536

LATE_ARRIVAL_MS = 5_000
"""How late an entry may become visible after its ``logged_at`` (an insert still running) and be
read; also the allowance between the sink's clock (``ingested_at``, the floor) and the pool's."""

LATE_CHECK_S = 1.0
"""How often a consumer's read goes back over what became visible late (see the module's docstring)."""


def scan_for(batch_steps: int, read_ahead: int, tokens_per_step: float | None) -> int:
    """Log entries one read takes: ``read_ahead`` batches, as far as about ``READ_AHEAD_MAX_TOKENS`` tokens
    of steps of ``tokens_per_step`` hold, and never less than a batch (one batch when sizes are unknown)."""
    if tokens_per_step is None:
        return batch_steps
    by_tokens = int(READ_AHEAD_MAX_TOKENS / max(tokens_per_step, 1.0))
    return max(batch_steps, min(batch_steps * read_ahead, by_tokens, _READ_AHEAD_MAX_ROWS))


def floor_start(floor_ms: int) -> Position:
    """Where a member with no cursor starts: before every entry of a version that landed at the floor."""
    return (floor_ms - LATE_ARRIVAL_MS, "", -1)


def just_before(position: Position) -> Position:
    """The greatest position below ``position`` a read can resume after and still read it."""
    at_ms, step_id, version = position
    return (at_ms, step_id, version - 1)


def position_at(table: pa.Table, row: int) -> Position:
    return (int(table.column("logged_at")[row].value), str(table.column("step_id")[row].as_py()),
            int(table.column("version")[row].as_py()))


def sort_by_position(table: pa.Table) -> pa.Table:
    return table.take(pc.sort_indices(table, sort_keys=[("logged_at", "ascending"), ("step_id", "ascending"),
                                                        ("version", "ascending")]))


@dataclass(frozen=True)
class Where:
    """Where a group stands, as the pool answered: its epoch and floor, and the pool's clock."""

    epoch: str
    floor_ms: int
    now_ms: int


def where(link: Transport, group: str) -> Where:
    row = link.query(POSITION_SQL, {"group": group}).to_pylist()[0]
    return Where(str(row["epoch"]), int(row["floor_ms"]), int(row["now_ms"]))


def resume_at(link: Transport, request: PageRequest, now: Where,
              checked_ms: int) -> tuple[Position, Position]:
    """A member's first read in the epoch ``now`` names: its place (its cursor, else the floor) and where the
    read starts, back from there to the checked time the cursor was written with and to ``checked_ms``
    (``LATE_ARRIVAL_MS`` before the pool's clock), for entries that became visible late before or after the
    member stopped."""
    params = {"group": request.group, "epoch": now.epoch, "member": request.member,
              "members": request.members, "filters": request.filters_key}
    row = link.query(CURSOR_SQL, params).to_pylist()[0]
    starts = [(checked_ms, "", -1)]
    if not int(row["cursors"]):
        base = floor_start(now.floor_ms)
    else:
        base = (int(row["at_ms"]), str(row["step_id"]), int(row["step_version"]))
        if int(row["checked_ms"]) > 0:
            starts.append((int(row["checked_ms"]), "", -1))
    return base, min(base, *starts)


@dataclass(frozen=True)
class PageRequest:
    """Everything a read needs, taken on the consumer's thread, so the read may run on another."""

    group: str
    member: int
    members: int
    filters_key: str
    epoch: str | None
    """The epoch the consumer is in (None before its first read)."""
    after: Position | None
    """Where the last read ended in that epoch (None: start at the cursor or the floor)."""
    handed: tuple[tuple[Position, tuple[str, ...]], ...]
    """Batches this consumer handed out (the last position of each, its steps): left out when a read
    starts below them."""
    batch_steps: int
    read_ahead: int
    tokens_per_step: float | None
    """Of the steps read so far (None: a member's first read, sized on the next entries' sizes)."""
    with_text: bool
    filter_clauses: list[str]
    filter_params: dict[str, Any]
    generation: int
    """The committer's landed writes when the read began."""
    policy_version: int | None
    checked_ms: int | None = None
    """Every entry stamped before this (pool ms), up to ``after``, was read (None: a first read)."""
    check: bool = True
    """Go back to ``checked_ms`` for entries that became visible late (else start at ``after``)."""
    known: Where | None = None
    """Where the group stood at the read before, for a read that is not a check to take as its own (a read
    in the background, like batches served from read-ahead, does not ask for the group's position)."""


@dataclass
class Page:
    """One read of the delivery log: its deliverable steps in log order (with ``logged_at``)."""

    request: PageRequest
    where: Where
    start: Position
    rows: pa.Table
    end: Position
    """Where the next read resumes: the last entry this read covered."""
    full: bool
    """The read stopped at its size: the log goes on after ``end``."""
    checked_ms: int
    """The member's checked time after this read."""
    read_at: float = field(default=0.0)


def read_page(link: Transport, request: PageRequest, read_at: float) -> Page:
    """The position read, then one page of the log from the member's place (see the module's docstring)."""
    now = where(link, request.group) if request.check or request.known is None else request.known
    handed = request.handed
    checked = now.now_ms - LATE_ARRIVAL_MS  # what a check read leaves checked
    if now.epoch != request.epoch or request.after is None or request.checked_ms is None:
        base, start = resume_at(link, request, now, checked)
        handed = ()
    else:
        base = request.after
        if request.check:
            start = min(base, (request.checked_ms, "", -1))
        else:
            start, checked = base, request.checked_ms
    scope = Scope(request.group, now.epoch, now.floor_ms, (), request.member, request.members)
    exclude = [step_id for last, step_ids in handed if last > start for step_id in step_ids]
    tokens = request.tokens_per_step
    if tokens is None and request.read_ahead > 1:
        tokens = _next_sizes(link, start, request.batch_steps)
    scan = scan_for(request.batch_steps, request.read_ahead, tokens)
    sql, params = delivery_page_sql(delivery_columns(request.with_text), request.filter_clauses, scope,
                                    start, scan, exclude)
    table = link.query(sql, {**request.filter_params, **params})
    full = table.num_rows >= scan
    end = position_at(table, table.num_rows - 1) if table.num_rows else start
    rows = _with_payload(link, _deliverable(link, table, start), request.with_text)
    return Page(request, now, start, rows, end if full else max(base, end), full, checked, read_at)


def _next_sizes(link: Transport, start: Position, sample: int) -> float | None:
    """The mean tokens of the next ready entries after ``start`` that carry their payload (None: none)."""
    params = {"c_start_ms": start[0], "c_start_id": start[1], "c_start_version": start[2], "c_sample": sample}
    row = link.query(SIZES_SQL, params).to_pylist()[0]
    return float(row["tokens"]) if int(row["entries"]) else None


def _deliverable(link: Transport, table: pa.Table, start: Position) -> pa.Table:
    """The page's entries that are their step's newest and not committed, each step once."""
    deliverable = pc.and_(pc.equal(table.column("_newest"), 1), pc.equal(table.column("_committed"), 0))
    doubtful = np.flatnonzero(~table.column("_newest").to_numpy(zero_copy_only=False).astype(bool))
    if len(doubtful):  # a later entry under the step's hash: is it the step's own?
        keys = table.take(pa.array(doubtful)).select(["step_id", "version", "logged_at"])
        newest = {row["step_id"]: (row["newest_version"], row["at_ms"]) for row in link.query(
            NEWEST_SQL, {"c_start_ms": start[0], "c_steps": keys.column("step_id").to_pylist()}).to_pylist()}
        mine = [newest.get(step_id) == (version, at) for step_id, version, at in zip(
            keys.column("step_id").to_pylist(), keys.column("version").to_pylist(),
            pc.cast(keys.column("logged_at"), pa.int64()).to_pylist(), strict=True)]
        confirmed = np.zeros(table.num_rows, dtype=bool)
        confirmed[doubtful[np.asarray(mine, dtype=bool)]] = True
        deliverable = pc.or_(deliverable, pc.and_(pa.array(confirmed),
                                                  pc.equal(table.column("_committed"), 0)))
    table = table.drop_columns(["_committed", "_newest"])
    if not pc.all(deliverable).as_py():  # a filter copies every column: only when something goes
        table = table.filter(deliverable)
    ids = table.column("step_id")
    if pc.count_distinct(ids).as_py() == table.num_rows:
        return table
    # The same version twice (a backfill racing the feed): keep its last entry.
    last = {step_id: i for i, step_id in enumerate(ids.to_pylist())}
    return table.take(pa.array(sorted(last.values())))


def _with_payload(link: Transport, table: pa.Table, with_text: bool) -> pa.Table:
    """``table`` with every row's payload: entries whose copy expired (or, ``with_text``, every entry, the
    log holding no text) are read from ``step_versions`` by primary key, in the version the log named."""
    lacking = np.ones(table.num_rows, dtype=bool) if with_text else (
        ~table.column("has_payload").to_numpy(zero_copy_only=False).astype(bool))
    table = table.drop_columns(["has_payload"])
    if not lacking.any():
        return table
    rows = np.flatnonzero(lacking)
    keys = table.take(pa.array(rows))
    wanted = dict(zip(keys.column("step_id").to_pylist(), keys.column("version").to_pylist(), strict=True))
    columns = version_columns(True) if with_text else delivery_columns(False)
    stored = link.query(stored_versions_sql(columns),
                        {"c_trajectories": sorted(set(keys.column("trajectory_id").to_pylist())),
                         "c_steps": list(wanted)})
    found: dict[str, int] = {}
    for i, (step_id, version) in enumerate(zip(stored.column("step_id").to_pylist(),
                                               stored.column("version").to_pylist(), strict=True)):
        if wanted.get(step_id) == version:
            found[step_id] = i
    # A version step_versions no longer holds was replaced by a newer one, which has its own entry.
    order = [int(r) for r, step_id in zip(rows, keys.column("step_id").to_pylist(), strict=True)
             if step_id in found]
    fetched = stored.take(pa.array([found[table.column("step_id")[r].as_py()] for r in order], pa.int64()))
    fetched = fetched.append_column("logged_at", table.column("logged_at").take(pa.array(order, pa.int64())))
    if with_text:
        return fetched
    kept = table.filter(pa.array(~lacking))
    at = np.concatenate([np.flatnonzero(~lacking), np.asarray(order, dtype=np.int64)])
    merged = pa.concat_tables([kept, fetched.select(kept.column_names).cast(kept.schema)])
    return merged.take(pa.array(np.argsort(at, kind="stable")))


class Ledger:
    """Deliveries not committed yet, each with the position it holds the cursor at (None: delivered
    outside the log's order, by ``fetch_batch``, ``whole_groups`` or a not-ready poll; such a delivery
    holds the cursor where it is until it is committed)."""

    def __init__(self) -> None:
        self._deliveries: list[tuple[Position | None, set[str]]] = []

    def deliver(self, step_ids: Iterable[str], hold: Position | None) -> None:
        ids = set(step_ids)
        if ids:
            self._deliveries.append((hold, ids))

    def settle(self, step_ids: Iterable[str]) -> None:
        """The steps were committed (or forgotten): they hold nothing any more."""
        done = set(step_ids)
        for _, ids in self._deliveries:
            ids -= done
        self._deliveries = [(hold, ids) for hold, ids in self._deliveries if ids]

    def clear(self) -> None:
        self._deliveries.clear()

    @property
    def frozen(self) -> bool:
        return any(hold is None for hold, _ in self._deliveries)

    def hold(self) -> Position | None:
        """The lowest position a delivery holds (None: nothing holds)."""
        holds = [hold for hold, _ in self._deliveries if hold is not None]
        return min(holds) if holds else None
