"""One sink batch: rows per table plus the offset range consumed per topic partition.

A batch is flushed when it holds ``max_rows`` rows or is ``max_seconds`` old (a message may be an
envelope of many records: rows are what an insert costs). Its age counts from the previous flush: under
load that is one insert per ``max_seconds``, and the first message after a pause goes in at once. A thin
batch (a trickle of rows) waits longer, up to ``CLAWR1_SINK_THIN_BATCH_SECONDS`` (``clawr1.core.thin_batch``).
Its insert deduplication token is derived from the offset ranges it covers, so re-inserting the same
ranges after a crash (before the offsets were committed) is dropped by ClickHouse; replays with other
boundaries collapse through the tables' version replacement instead.

A table's rows come as row tuples (``rows.py``) or, from envelopes of a columnar route, as records still
packed that the flush turns into one Arrow block (``columns.py``); each kind is one insert, a ``RowPart``
or a ``ColumnPart``, which the sink can split to isolate a row ClickHouse refuses.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from clawr1.core.thin_batch import ThinWait
from clawr1.sinks.rows import Origin

if TYPE_CHECKING:
    from clawr1.pool.store import PoolStore


@dataclass
class OffsetRange:
    first: int
    last: int


@dataclass(frozen=True)
class Envelope:
    """An envelope's records, packed as they came; ``origin_of(i)`` is where its record ``i`` came from
    (made only for a dead letter: it re-encodes the record to cite it)."""

    records: list[dict[str, Any]]
    origin: Origin
    origin_of: Callable[[int], Origin]


@dataclass(frozen=True)
class RowPart:
    """Row tuples, inserted as one block."""

    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]]
    origins: list[Origin]

    def __len__(self) -> int:
        return len(self.rows)

    def slice(self, lo: int, hi: int) -> RowPart:
        return RowPart(self.columns, self.rows[lo:hi], self.origins[lo:hi])

    def origin(self, index: int) -> Origin:
        return self.origins[index]

    def write(self, store: PoolStore, table: str, token: str) -> None:
        store.insert(table, self.rows, self.columns, dedup_token=token)


@dataclass(frozen=True)
class ColumnPart:
    """Arrow blocks, inserted as one."""

    data: pa.Table
    origin: Callable[[int], Origin]

    def __len__(self) -> int:
        return int(self.data.num_rows)

    def slice(self, lo: int, hi: int) -> ColumnPart:
        return ColumnPart(self.data.slice(lo, hi - lo), lambda index: self.origin(lo + index))

    def write(self, store: PoolStore, table: str, token: str) -> None:
        store.insert_arrow(table, self.data, dedup_token=token)


def _origin_in(envelopes: list[Envelope]) -> Callable[[int], Origin]:
    def origin(index: int) -> Origin:
        for envelope in envelopes:
            if index < len(envelope.records):
                return envelope.origin_of(index)
            index -= len(envelope.records)
        raise IndexError(index)
    return origin


@dataclass
class TableRows:
    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    origins: list[Origin] = field(default_factory=list)
    envelopes: list[Envelope] = field(default_factory=list)
    columns_data: pa.Table | None = None  # the envelopes' records as one block, once the flush built it

    def __len__(self) -> int:
        return len(self.rows) + sum(len(envelope.records) for envelope in self.envelopes)

    def restamp(self, column: str, value: Any) -> None:
        """Set ``column`` in every row: the sink stamps ``ingested_at`` as it writes the rows (what a
        reader of the pool calls ingested), not when it read their messages."""
        at = self.columns.index(column)
        self.rows = [(*row[:at], value, *row[at + 1:]) for row in self.rows]

    def parts(self, token: str) -> list[tuple[str, RowPart | ColumnPart]]:
        """(deduplication token, part) per insert: the rows, then the envelopes' block (built by then);
        the first keeps ``token``, so a replay of the same offsets in the same form is dropped as before."""
        parts: list[tuple[str, RowPart | ColumnPart]] = []
        if self.rows:
            parts.append((token, RowPart(self.columns, self.rows, self.origins)))
        if self.envelopes:
            if self.columns_data is None:
                raise RuntimeError("the envelopes were not built into columns before the insert")
            part = ColumnPart(self.columns_data, _origin_in(self.envelopes))
            parts.append((f"{token}/columns" if parts else token, part))
        return parts


@dataclass
class Batch:
    started: float = field(default_factory=time.monotonic)
    messages: int = 0
    rows: int = 0
    tables: dict[str, TableRows] = field(default_factory=dict)
    ranges: dict[tuple[str, int], OffsetRange] = field(default_factory=dict)
    # Feedback the worker could no longer join (``clawr1.sinks.late_feedback``), with its dead letter's
    # position: joined in the pool by the same flush.
    late: list[tuple[Origin, dict[str, Any]]] = field(default_factory=list)

    def add(self, table: str, columns: tuple[str, ...], row: tuple[Any, ...], origin: Origin) -> None:
        rows = self.tables.setdefault(table, TableRows(columns))
        rows.rows.append(row)
        rows.origins.append(origin)
        self.rows += 1

    def add_envelope(self, table: str, columns: tuple[str, ...], envelope: Envelope) -> None:
        self.tables.setdefault(table, TableRows(columns)).envelopes.append(envelope)
        self.rows += len(envelope.records)

    def consumed(self, origin: Origin) -> None:
        """Record that the message at ``origin`` is covered by this batch (stored or dead-lettered)."""
        self.messages += 1
        key = (origin.topic, origin.partition)
        known = self.ranges.get(key)
        if known is None:
            self.ranges[key] = OffsetRange(origin.offset, origin.offset)
        else:
            known.first = min(known.first, origin.offset)
            known.last = max(known.last, origin.offset)

    def is_due(self, max_rows: int, max_seconds: float, thin: ThinWait, now: float | None = None) -> bool:
        due_in = self.seconds_until_due(max_seconds, thin, now)
        return due_in is not None and (self.rows >= max_rows or due_in == 0.0)

    def seconds_until_due(self, max_seconds: float, thin: ThinWait, now: float | None = None) -> float | None:
        """How long the batch may still wait for rows; None while it is empty (nothing is due). A thin
        batch waits ``thin.wait_s`` since the previous flush instead of ``max_seconds``."""
        if not self.messages:
            return None
        due = thin.due_at(self.started + max_seconds, self.started, self.rows)
        return max(0.0, due - (time.monotonic() if now is None else now))

    def commit_offsets(self) -> list[tuple[str, int, int]]:
        """(topic, partition, next offset to read) for every partition the batch consumed."""
        return [(topic, partition, r.last + 1) for (topic, partition), r in sorted(self.ranges.items())]

    def dedup_token(self, table: str) -> str:
        described = ",".join(f"{t}:{p}:{r.first}-{r.last}" for (t, p), r in sorted(self.ranges.items()))
        return f"{table}:{hashlib.sha256(described.encode()).hexdigest()[:40]}"

    def drop_partitions(self, lost: set[tuple[str, int]]) -> None:
        """Forget what came from partitions this consumer no longer owns (their new owner replays them)."""
        for key in lost:
            self.ranges.pop(key, None)
        for rows in self.tables.values():
            kept = [(r, o) for r, o in zip(rows.rows, rows.origins, strict=True)
                    if (o.topic, o.partition) not in lost]
            rows.rows = [r for r, _ in kept]
            rows.origins = [o for _, o in kept]
            rows.envelopes = [e for e in rows.envelopes if (e.origin.topic, e.origin.partition) not in lost]
        self.late = [(o, fact) for o, fact in self.late if (o.topic, o.partition) not in lost]
        self.rows = sum(len(r) for r in self.tables.values())
        self.messages = len({(o.topic, o.partition, o.offset) for r in self.tables.values()
                             for o in [*r.origins, *(e.origin for e in r.envelopes)]})
