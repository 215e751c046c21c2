"""Kafka curated topics -> pool tables: batched inserts, offsets committed only after ClickHouse took them.

Guarantees: a message is never lost (its offset is committed only after its row, or its dead letter, is
in the pool), never crashes the sink (undecodable or unstorable messages become dead-letter rows with
the reason), and is seen once in query results however often it is replayed (insert deduplication
tokens from offset ranges, plus version replacement in every table the sink writes).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from clawr1.core.backoff import Backoff
from clawr1.core.kafka_io import consumed_at, ensure_topics, make_consumer
from clawr1.core.metrics import (
    INGEST_TO_POOL_SECONDS,
    SINK_BATCH_MESSAGES,
    SINK_DEAD_LETTERS,
    SINK_FLUSH_SECONDS,
    SINK_MESSAGES_IN,
    SINK_ROWS_OUT,
)
from clawr1.pool.store import PoolDataError, PoolError, PoolStore
from clawr1.schemas.codec import AvroCodec, DecodeError, unpack_record
from clawr1.sinks.batch import Batch, ColumnPart, Envelope, RowPart, TableRows
from clawr1.sinks.columns import ColumnPlan
from clawr1.sinks.config import SinkConfig
from clawr1.sinks.late_feedback import expired_feedback, rejoined_steps
from clawr1.sinks.rows import (
    DEAD_LETTER_COLUMNS,
    DLQ_ROUTE,
    FEEDBACK_ROUTE,
    PREFIX_NODES_ROUTE,
    STEPS_ROUTE,
    Origin,
    RowError,
    TableRoute,
    sink_dead_letter_row,
    step_row,
)

log = logging.getLogger("clawr1.sink")

EXIT_AFTER_INSERT_CODE = 86
_DEAD_LETTER_TABLE = DLQ_ROUTE.table
# Waits between the retries of a refused insert: from 0.1 s doubling, at most 5 s (full jitter).
_RETRY_BACKOFF = Backoff(0.1, 5.0)
_IDLE_POLL_SECONDS = 0.2


@dataclass
class SinkStats:
    """Counters for tests, benchmarks and logs."""

    messages: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    dead_letters: int = 0
    flushes: int = 0
    insert_failures: int = 0
    commit_failures: int = 0
    late_feedback: int = 0  # step versions written for feedback the worker could no longer join


def routes_for(config: SinkConfig) -> dict[str, TableRoute]:
    return {
        config.steps_topic: STEPS_ROUTE,
        config.feedback_topic: FEEDBACK_ROUTE,
        config.prefix_nodes_topic: PREFIX_NODES_ROUTE,
        config.dlq_topic: DLQ_ROUTE,
    }


def now_ms() -> int:
    return int(time.time() * 1000)


_CREATED_AT = STEPS_ROUTE.columns.index("created_at_ms")


def _observe_flush(batch: Batch, seconds: float) -> None:
    """Metrics of one committed batch; ingest->pool latency runs from each step row's created_at."""
    SINK_BATCH_MESSAGES.observe(batch.messages)
    SINK_FLUSH_SECONDS.observe(seconds)
    for table, rows in batch.tables.items():
        SINK_ROWS_OUT.labels(table=table).inc(len(rows))
    steps = batch.tables.get(STEPS_ROUTE.table)
    now = now_ms()
    created = [row[_CREATED_AT] for row in steps.rows] if steps is not None else []
    if steps is not None and steps.columns_data is not None:
        created.extend(steps.columns_data.column("created_at_ms").cast(pa.int64()).to_pylist())
    for at in created:
        INGEST_TO_POOL_SECONDS.observe(max(0, now - at) / 1000)


class PoolSink:
    """One consumer-group member: poll, convert, batch, insert, then commit."""

    def __init__(self, bootstrap: str, store: PoolStore, config: SinkConfig, codec: AvroCodec,
                 partitions: int = 4) -> None:
        self.bootstrap = bootstrap
        self.store = store
        self.config = config
        self.codec = codec
        self.partitions = partitions
        self.routes = routes_for(config)
        self.plans = {route.table: ColumnPlan.of(route) for route in self.routes.values() if route.columnar}
        self.stats = SinkStats()
        self._batch = Batch()
        self._consumer: Consumer | None = None
        self._stop = threading.Event()
        # Offsets committed since the consumer was last idle, per partition: an idle moment checks whether
        # it has since moved past markers that followed them (see ``_commit_skipped_markers``).
        self._unsettled: dict[tuple[str, int], int] = {}

    # -- converting ---------------------------------------------------------------------------------

    def accept(self, msg: Message) -> None:
        """Turn one message (a record or an envelope of records) into rows of its table; what cannot be a
        row becomes a dead letter with the reason."""
        origin = Origin(*consumed_at(msg), msg.key(), msg.value())
        route = self.routes[origin.topic]
        stamp = now_ms()
        records: list[dict[str, Any]] = []
        envelope = False
        try:
            if origin.value is None:
                raise RowError("empty message (no value)")
            envelope = self.codec.writer_of(origin.value).name != route.schema
            records = self.codec.decode_records(origin.value, expect=route.schema, plain=False)
            if envelope and route.table in self.plans:  # columns, built at the flush
                self._batch.add_envelope(route.table, tuple(route.columns),
                                         self._envelope(route, records, origin))
                records = []
            elif envelope:
                records = [unpack_record(route.schema, record) for record in records]
        except DecodeError as exc:
            self._dead_letter(origin, "undecodable", f"undecodable {route.schema!r} message: {exc}", stamp)
        except ValueError as exc:  # RowError, or a packed array of a size no array has
            self._dead_letter(origin, "invalid", f"invalid {route.schema!r} record: {exc}", stamp)
            records = []
        self._add_rows(route, records, origin, envelope, stamp)
        self._batch.consumed(origin)
        self.stats.messages += 1
        SINK_MESSAGES_IN.labels(topic=origin.topic).inc()

    def _add_rows(self, route: TableRoute, records: list[dict[str, Any]], origin: Origin, envelope: bool,
                  stamp: int) -> None:
        """Plain records as row tuples; each that cannot be a row becomes a dead letter."""
        for index, record in enumerate(records):
            # A record of an envelope is cited alone: its own bytes, its place in the envelope.
            at = replace(origin, value=None, index=index,
                         cite=partial(self.codec.encode, route.schema, record)) if envelope else origin
            if route is DLQ_ROUTE and (late := expired_feedback(record, self.codec)) is not None:
                self._batch.late.append((at, late))
            try:
                row = route.to_row(record, at, stamp)
            except (RowError, KeyError, TypeError) as exc:
                self._dead_letter(at, "invalid", f"invalid {route.schema!r} record: {exc}", stamp)
            else:
                self._batch.add(route.table, tuple(route.columns), row, at)

    def _envelope(self, route: TableRoute, records: list[dict[str, Any]], origin: Origin) -> Envelope:
        def origin_of(index: int) -> Origin:
            plain = unpack_record(route.schema, records[index])
            return replace(origin, value=None, index=index,
                           cite=partial(self.codec.encode, route.schema, plain))
        return Envelope(records, origin, origin_of)

    def _build_columns(self, stamp: int) -> None:
        """Each columnar table's envelopes -> one Arrow block (built once per flush: its cost is mostly
        per column). An envelope with a record the row path would refuse goes that way instead, so its
        good records become rows and the bad ones dead letters, with the row path's reasons."""
        for table, rows in list(self._batch.tables.items()):
            plan = self.plans.get(table)
            if plan is None or not rows.envelopes:
                continue
            data = plan.build([(e.records, e.origin) for e in rows.envelopes], stamp)
            if data is None:
                kept: list[Envelope] = []
                for envelope in rows.envelopes:
                    if plan.build([(envelope.records, envelope.origin)], stamp) is None:
                        self._take_by_rows(plan.route, envelope, stamp)
                    else:
                        kept.append(envelope)
                rows.envelopes = kept
                data = plan.build([(e.records, e.origin) for e in kept], stamp) if kept else None
            rows.columns_data = data

    def _take_by_rows(self, route: TableRoute, envelope: Envelope, stamp: int) -> None:
        try:
            records = [unpack_record(route.schema, record) for record in envelope.records]
        except ValueError as exc:  # a packed array of a size no array has
            self._dead_letter(envelope.origin, "invalid", f"invalid {route.schema!r} record: {exc}", stamp)
            return
        self._add_rows(route, records, envelope.origin, envelope=True, stamp=stamp)

    def _dead_letter(self, origin: Origin, cause: str, reason: str, stamp: int) -> None:
        log.warning("dead letter %s: %s", origin.position, reason)
        self.stats.dead_letters += 1
        SINK_DEAD_LETTERS.labels(reason=cause).inc()
        self._batch.add(_DEAD_LETTER_TABLE, DEAD_LETTER_COLUMNS, sink_dead_letter_row(origin, reason, stamp),
                        origin)

    # -- writing ------------------------------------------------------------------------------------

    def _insert_rows(self, table: str, rows: TableRows, token: str, stop: threading.Event) -> bool:
        """Insert the rows, then the envelopes' block; False if stopped first."""
        return all(self._insert_part(table, part, part_token, stop) for part_token, part in rows.parts(token))

    def _insert_part(self, table: str, part: RowPart | ColumnPart, token: str, stop: threading.Event) -> bool:
        """Insert, isolating rows ClickHouse cannot type into dead letters; False if stopped first."""
        pending: list[tuple[int, int]] = [(0, len(part))]
        while pending:
            lo, hi = pending.pop()
            block_token = token if (lo, hi) == (0, len(part)) else f"{token}/{lo}-{hi}"
            try:
                if not self._insert_retrying(table, part.slice(lo, hi), block_token, stop):
                    return False
            except PoolDataError as exc:
                if hi - lo > 1:
                    mid = (lo + hi) // 2
                    pending.extend([(mid, hi), (lo, mid)])
                    continue
                origin = part.origin(lo)
                row = sink_dead_letter_row(origin, f"row rejected by table {table!r}: {exc}", now_ms())
                dead = RowPart(DEAD_LETTER_COLUMNS, [row], [origin])
                if not self._insert_retrying(_DEAD_LETTER_TABLE, dead, f"{block_token}/dead", stop):
                    return False
                self.stats.dead_letters += 1
                SINK_DEAD_LETTERS.labels(reason="rejected").inc()
        return True

    def _insert_retrying(self, table: str, part: RowPart | ColumnPart, token: str,
                         stop: threading.Event) -> bool:
        """Retry server-side failures with backoff until they pass or ``stop`` is set."""
        delays = _RETRY_BACKOFF.delays()
        while True:
            try:
                part.write(self.store, table, token)
                return True
            except PoolDataError:
                raise
            except PoolError as exc:
                self.stats.insert_failures += 1
                delay = next(delays)
                log.error("insert into %s failed (retrying in %.1fs): %s", table, delay, exc)
                if stop.wait(delay):
                    return False

    def flush(self, stop: threading.Event) -> bool:
        """Insert the batch, then commit its offsets; False (nothing committed) if stopped mid-way."""
        batch = self._batch
        if not batch.messages:
            return True
        started = time.monotonic()
        stamp = now_ms()
        self._build_columns(stamp)
        for table, rows in batch.tables.items():
            rows.restamp("ingested_at", stamp)
            if not self._insert_rows(table, rows, batch.dedup_token(table), stop):
                return False
        if batch.late and not self._join_late(batch, stamp, stop):
            return False
        if self.config.exit_after_insert:
            log.warning("exit-after-insert hook: leaving before the commit")
            os._exit(EXIT_AFTER_INSERT_CODE)
        self._commit(batch)
        for table, rows in batch.tables.items():
            self.stats.rows[table] = self.stats.rows.get(table, 0) + len(rows)
        self.stats.flushes += 1
        _observe_flush(batch, time.monotonic() - started)
        self._batch = Batch()
        return True

    def _join_late(self, batch: Batch, stamp: int, stop: threading.Event) -> bool:
        """The next version of each step that feedback in an ``expire`` dead letter names
        (``clawr1.sinks.late_feedback``); False if stopped first."""
        origin = batch.late[-1][0]
        try:
            records = rejoined_steps(self.store, [fact for _, fact in batch.late], self.config.readiness)
        except PoolError as exc:  # the pool is away: the batch is retried, as an insert would be
            log.error("late feedback could not be joined (retrying with the batch): %s", exc)
            return False
        rows = [step_row(record, origin, stamp) for record in records]
        part = RowPart(tuple(STEPS_ROUTE.columns), rows, [origin] * len(rows))
        self.stats.late_feedback += len(rows)
        token = f"{batch.dedup_token(STEPS_ROUTE.table)}/late"
        return self._insert_part(STEPS_ROUTE.table, part, token, stop)

    def _commit(self, batch: Batch) -> None:
        assert self._consumer is not None
        offsets = [TopicPartition(t, p, o) for t, p, o in batch.commit_offsets()]
        # Past a transaction's commit marker too: the worker writes its outputs in transactions, and a
        # marker after the last record would otherwise read as lag forever. The consumer's position
        # is past every record it returned, all of which are in this batch, plus skipped markers.
        for tp, at in zip(offsets, self._consumer.position(offsets), strict=True):
            if at.offset > tp.offset:
                tp.offset = at.offset
        self._commit_offsets(offsets)
        self._unsettled.update({(tp.topic, tp.partition): tp.offset for tp in offsets})

    def _commit_offsets(self, offsets: list[TopicPartition]) -> None:
        assert self._consumer is not None
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            # The rows are in the pool; a replay of these offsets collapses into them.
            self.stats.commit_failures += 1
            log.warning("offset commit failed (the batch will be replayed, harmlessly): %s", exc)

    def _commit_skipped_markers(self) -> None:
        """A batch written the moment its message arrived may be committed before the consumer read the
        commit marker behind it; once idle, commit past the markers read since, or that partition
        would show a lag of one forever."""
        assert self._consumer is not None
        positions = self._consumer.position([TopicPartition(t, p) for t, p in self._unsettled])
        moved = [at for at in positions if at.offset > self._unsettled[(at.topic, at.partition)]]
        self._unsettled = {}
        if moved:
            self._commit_offsets(moved)

    # -- consuming ----------------------------------------------------------------------------------

    def _on_revoke(self, _consumer: Consumer, _partitions: list[TopicPartition]) -> None:
        """Store and commit what was read before the partitions move to another member."""
        self.flush(self._stop)

    def _on_lost(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._batch.drop_partitions({(tp.topic, tp.partition) for tp in partitions})

    def run(self, stop: threading.Event, ready: Callable[[], None] | None = None) -> SinkStats:
        self._stop = stop
        topics = list(self.routes)
        ensure_topics(self.bootstrap, topics, self.partitions)
        self._consumer = make_consumer(self.bootstrap, self.config.group_id,
                                       **{"session.timeout.ms": self.config.session_timeout_ms})
        try:
            self._consumer.subscribe(topics, on_revoke=self._on_revoke, on_lost=self._on_lost)
            if ready is not None:
                ready()
            while not stop.is_set():
                self._poll_once()
                if self._batch.is_due(self.config.batch_rows, self.config.batch_seconds, self.config.thin):
                    self.flush(stop)
            self.flush(stop)
        finally:
            self._consumer.close()
            self._consumer = None
        return self.stats

    def _poll_once(self) -> None:
        """Read what is there, waiting no longer than freshness allows.

        librdkafka's ``consume(n, timeout)`` returns after ``n`` messages or the timeout, whichever
        comes first, so an empty batch waits for its first message with ``poll`` (which returns at
        once), and an open batch collects more only until it is due."""
        assert self._consumer is not None
        due_in = self._batch.seconds_until_due(self.config.batch_seconds, self.config.thin)
        if due_in is None:
            first = self._consumer.poll(_IDLE_POLL_SECONDS)
            if first is None and self._unsettled:
                self._commit_skipped_markers()
            messages = [] if first is None else [first]
        else:
            room = max(1, self.config.batch_rows - self._batch.rows)
            messages = self._consumer.consume(num_messages=min(room, 1000),
                                              timeout=min(_IDLE_POLL_SECONDS, max(0.005, due_in)))
        for msg in messages:
            error = msg.error()
            if error is None:
                self.accept(msg)
            elif error.fatal():
                raise KafkaException(error)
            elif error.code() != KafkaError._PARTITION_EOF:
                log.warning("consumer error: %s", error)
