"""Asynchronous delivery of captured calls to Kafka, through the spool, on one background thread.

The proxy's event loop only calls ``submit`` (a queue put). The thread builds and encodes records,
writes them to the spool (fsync'd), hands them to an idempotent confluent-kafka producer and drops
them from the spool once Kafka confirms the message that carried them. If Kafka is down or slow,
records wait in the spool and go out when it answers again; agent traffic never waits for any of it.
So do they while ``paused`` says so (the pipeline is behind past ``CLAWR1_MAX_LAG_S``: backpressure,
``clawr1.core.backpressure``): captured and spooled as ever, sent once the worker has caught up.

Envelopes: given ``combine``, records bound for one partition (their key hashed as Kafka's
partitioner does, over the topic's partition count as the broker has it) are held up to ``batch_s``
or until ``batch_records`` of them wait, then leave as one message (``combine`` of their spooled
values), cut to fit Kafka's message size (``clawr1.core.envelopes``); while the emitter holds few
calls, they wait longer, up to ``thin.wait_s`` after the last envelopes (``clawr1.core.thin_batch``;
spooled meanwhile).
Each record stays in the spool until the envelope that carried it is acknowledged; one Kafka refuses
as too large is sent again in halves, so only a record too large on its own is set aside (``rejected.log``).
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from clawr1.core.backoff import Backoff
from clawr1.core.envelopes import fit, halved
from clawr1.core.kafka_io import (
    Fatal,
    ProduceOutcome,
    RebuildingProducer,
    Undeliverable,
    classify,
    ensure_topics,
)
from clawr1.core.metrics import PROXY_RECORDS_DELIVERED, PROXY_RECORDS_REJECTED
from clawr1.core.routing import partition_of
from clawr1.core.thin_batch import NEVER, ThinWait
from clawr1.proxy.spool import Spool, SpoolRecord, encode_frame

logger = logging.getLogger("clawr1.proxy.emitter")
T = TypeVar("T")

# Between the starts of the tries to reach Kafka and make the topic: from 0.25 s doubling, at most 2 s
# (full jitter).
_TOPIC_BACKOFF = Backoff(0.25, 2.0)
_WARN_EVERY_S = 30.0
# How often the thread looks at Kafka's delivery reports while records await them, and at the stop flag
# and the topic when nothing does: it otherwise sleeps until an item is submitted or a held envelope is due.
_ACK_POLL_S = 0.05
_IDLE_S = 0.5


@dataclass
class EmitterStats:
    submitted: int = 0
    spooled: int = 0
    delivered: int = 0
    rejected: int = 0
    recovered: int = 0


# An envelope waiting for the producer: its partition, the spooled records it carries, its value.
_Envelope = tuple[int, Sequence[SpoolRecord], bytes]


class Emitter(Generic[T]):
    """``prepare`` turns a submitted item into (key, value bytes); it runs on the emitter thread.
    ``combine`` makes one message of several spooled values (None: every record is its own message).
    ``paused``: while it answers True nothing new is handed to Kafka (records keep being spooled)."""

    def __init__(self, *, bootstrap: str, topic: str, spool_dir: Path,
                 prepare: Callable[[T], tuple[str, bytes]], partitions: int = 4,
                 producer_overrides: dict[str, Any] | None = None, max_in_flight: int = 10_000,
                 segment_records: int = 1000, combine: Callable[[list[bytes]], bytes] | None = None,
                 batch_s: float = 0.0, batch_records: int = 1, thin: ThinWait = NEVER,
                 paused: Callable[[], bool] | None = None) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.stats = EmitterStats()
        self._prepare = prepare
        self._paused = paused or (lambda: False)
        self._combine = combine
        self._batch_s = batch_s
        self._batch_records = max(1, batch_records) if combine is not None else 1
        # Taken from the spool (in flight to it), waiting for their partition's window to close ...
        self._held: dict[int, list[SpoolRecord]] = {}
        self._held_since: dict[int, float] = {}
        self._thin = thin
        self._released = -float("inf")  # when the last envelopes were made
        # ... then envelopes ready for the producer, including the halves of one Kafka found too large.
        self._ready: deque[_Envelope] = deque()
        self._producer_overrides = producer_overrides or {}
        self._max_in_flight = max_in_flight
        self._spool = Spool(spool_dir, segment_records)
        self._queue: queue.SimpleQueue[T | None] = queue.SimpleQueue()  # None: only a wake-up
        self._stop = threading.Event()
        self._deadline = 0.0
        self._thread = threading.Thread(target=self._run, name="clawr1-proxy-emitter", daemon=True)
        self._topic_ready = False
        self._sending = False  # as of the last pass: the topic is there and no pause holds records back
        self._next_topic_try = 0.0
        self._topic_waits = _TOPIC_BACKOFF.delays()
        self._last_warning = 0.0
        self._pending = 0
        # Built records the spool could not take yet (disk full); written before any newer ones.
        self._unspooled: list[tuple[bytes, bytes]] = []

    @property
    def pending(self) -> int:
        """Records written to the spool and not yet confirmed by Kafka (as of the thread's last pass)."""
        return self._pending

    def start(self) -> None:
        """Open the spool (raises SpoolBusyError if another process owns it), then start the thread."""
        self.stats.recovered = self._spool.open()
        if self.stats.recovered:
            logger.info("replaying %d spooled records to %s", self.stats.recovered, self.topic)
        self._thread.start()

    def submit(self, item: T) -> None:
        """Never blocks and never raises: called on the proxy's event loop."""
        self.stats.submitted += 1
        self._queue.put(item)

    def close(self, timeout: float = 10.0) -> None:
        """Deliver what Kafka takes within ``timeout``; the rest stays spooled for the next start."""
        self._deadline = time.monotonic() + timeout
        self._stop.set()
        self._queue.put(None)  # wakes the thread from its wait
        if self._thread.is_alive():
            self._thread.join(timeout + 5.0)

    def _run(self) -> None:
        # Undeliverable records go to rejected.log; everything else stays spooled until Kafka takes
        # it, including what a producer held when it failed fatally (kafka_io's one policy: a new
        # producer replaces it, and its records are sent again).
        producers = RebuildingProducer(self.bootstrap, on_error=self._on_error,
                                       logger=logging.getLogger("clawr1.proxy.kafka"),
                                       **self._producer_overrides)
        try:
            while True:
                self._spool_batch(self._take_batch(self._wait_s()))
                self._ensure_topic()
                self._sending = self._topic_ready and not self._paused()
                if self._sending:
                    self._send_unsent(producers.producer)
                producers.producer.poll(0)
                if producers.rebuild_if_fatal() is not None:
                    # The old producer's delivery reports put its records back; any it never reported
                    # on are sent again too (at least once: Kafka may hold a copy already).
                    self._held.clear()
                    self._ready.clear()
                    self._spool.release_in_flight()
                self._spool.trim()
                self._pending = self._spool.pending
                if self._stop.is_set() and self._queue.empty() and \
                        (self._pending == 0 and not self._unspooled or time.monotonic() > self._deadline):
                    break
        except Exception:  # noqa: BLE001 - the thread must say why it died, loudly
            logger.exception("emitter thread stopped; undelivered records stay in %s", self._spool.directory)
        finally:
            self._spool.close()
            if self._pending:
                logger.warning("%d records not yet confirmed by Kafka stay spooled in %s",
                               self._pending, self._spool.directory)

    def _wait_s(self) -> float:
        """How long the next pass may wait for a submitted item before it goes on: until the first held
        envelope is due (while sending); while records await Kafka (its confirmation, the topic, the end of
        a pause), ``_ACK_POLL_S`` (the producer reports only when polled); else ``_IDLE_S``. A submitted
        item (or ``close``) ends the wait at once."""
        if self._unspooled:
            return 0.0
        if self._held and self._sending:
            return max(0.0, min(self._due_at(p) for p in self._held) - time.monotonic())
        return _ACK_POLL_S if self._spool.pending or self._held else _IDLE_S

    def _take_batch(self, timeout: float) -> list[T]:
        batch: list[T] = []
        try:
            item = self._queue.get(timeout=timeout) if timeout else self._queue.get_nowait()
            while True:
                if item is not None:
                    batch.append(item)
                if len(batch) >= 1000:
                    break
                item = self._queue.get_nowait()
        except queue.Empty:
            pass
        return batch

    def _spool_batch(self, batch: list[T]) -> None:
        for item in batch:
            try:
                key, value = self._prepare(item)
            except Exception:  # noqa: BLE001 - one bad item must not stop the others
                logger.exception("could not build a record from %r; it is not sent", item)
                continue
            self._unspooled.append((key.encode(), value))
        if not self._unspooled:
            return
        try:
            written = self._spool.append(self._unspooled)
        except OSError as exc:  # e.g. a full disk: keep the records in memory and try again
            self._warn(f"cannot write the spool in {self._spool.directory} ({exc}); holding "
                       f"{len(self._unspooled)} records in memory")
            time.sleep(0.5)
            return
        self.stats.spooled += written
        self._unspooled = self._unspooled[written:]

    def _ensure_topic(self) -> None:
        if self._topic_ready or time.monotonic() < self._next_topic_try:
            return
        self._next_topic_try = time.monotonic() + next(self._topic_waits)
        try:
            counts = ensure_topics(self.bootstrap, [self.topic], self.partitions, timeout=1.0)
        except KafkaException as exc:
            self._warn(f"Kafka at {self.bootstrap} not reachable ({exc}); spooling")
            return
        except RuntimeError as exc:
            logger.warning("could not check/create topic %s (%s); producing anyway", self.topic, exc)
        else:
            self.partitions = counts[self.topic]  # as the broker has it: what keys hash into
        self._topic_ready = True

    def _send_unsent(self, producer: Producer) -> None:
        self._hold(self._spool.take_unsent(max(self._max_in_flight - self._spool.in_flight, 0)))
        self._release_due()
        while self._ready:
            partition, records, value = self._ready.popleft()
            if not self._send(producer, partition, records, value):
                for _, waiting, _ in self._ready:  # the producer takes nothing now: back to the spool
                    for record in waiting:
                        self._spool.retry(record.seq)
                self._ready.clear()
                return

    def _hold(self, records: Iterator[SpoolRecord]) -> None:
        now = time.monotonic()
        for record in records:
            partition = partition_of(record.key.decode(), self.partitions)
            held = self._held.setdefault(partition, [])
            if not held:
                self._held_since[partition] = now
            held.append(record)

    def _due_at(self, partition: int) -> float:
        """When a partition's held records are due: ``batch_s`` after the first; while the emitter holds
        few calls in all, not before ``thin.wait_s`` after the last envelopes were made, so the thin ones
        of every partition leave together (one produce request, one fetch of the worker's)."""
        return self._thin.due_at(self._held_since[partition] + self._batch_s, self._released,
                                 sum(len(held) for held in self._held.values()))

    def _release_due(self) -> None:
        """Held records whose partition has ``batch_records`` of them or is due (all of them when
        stopping) become envelopes ready to send."""
        now, stopping = time.monotonic(), self._stop.is_set()
        due = [partition for partition, held in self._held.items()
               if len(held) >= self._batch_records or now >= self._due_at(partition) or stopping]
        if due:
            self._released = now
        for partition in due:
            held = self._held.pop(partition)
            for start in range(0, len(held), self._batch_records):
                group = held[start:start + self._batch_records]
                self._ready.extend((partition, records, value) for records, value in self._fit(group))

    def _fit(self, records: Sequence[SpoolRecord]) -> list[tuple[Sequence[SpoolRecord], bytes]]:
        try:
            return fit(records, self._value_of)
        except Exception:  # noqa: BLE001 - a value combine cannot read must not hold the others back
            logger.exception("could not combine %d spooled records; sending them one by one", len(records))
            return [([record], record.value) for record in records]

    def _value_of(self, records: Sequence[SpoolRecord]) -> bytes:
        if len(records) == 1 or self._combine is None:
            return records[0].value
        return self._combine([record.value for record in records])

    def _send(self, producer: Producer, partition: int, records: Sequence[SpoolRecord], value: bytes) -> bool:
        """Hand one message to the producer; False when it takes nothing more now (the records are back
        in the spool's unsent ones)."""
        seqs = [record.seq for record in records]
        try:
            producer.produce(self.topic, key=records[0].key if len(records) == 1 else None, value=value,
                             partition=partition,
                             on_delivery=functools.partial(self._on_delivery, partition, seqs, len(value)))
        except BufferError:
            for seq in seqs:
                self._spool.retry(seq)
            return False
        except KafkaException as exc:
            outcome = classify(exc.args[0])
            self._failed(partition, seqs, len(value), outcome)
            if not isinstance(outcome, Undeliverable):
                self._warn(f"produce failed, will retry: {outcome.reason}")
                return False
        return True

    def _on_delivery(self, partition: int, seqs: list[int], size: int, err: KafkaError | None,
                     _msg: Message) -> None:
        if err is None:
            for seq in seqs:
                self._spool.ack(seq)
            self.stats.delivered += len(seqs)
            PROXY_RECORDS_DELIVERED.inc(len(seqs))
            return
        outcome = classify(err)
        self._failed(partition, seqs, size, outcome)
        if not isinstance(outcome, Undeliverable | Fatal):  # a fatal error is logged once, by the policy
            self._warn(f"delivery failed, will retry: {outcome.reason}")

    def _failed(self, partition: int, seqs: list[int], size: int, outcome: ProduceOutcome) -> None:
        """A message Kafka did not take: too large, it goes again in halves (each record stays in flight);
        else its records are set aside for good (undeliverable) or sent again later."""
        if isinstance(outcome, Undeliverable) and outcome.too_large:
            pieces = halved([self._spool.read(seq) for seq in seqs], size, self._value_of)
            if pieces is not None:
                self._ready.extend((partition, records, value) for records, value in pieces)
                return
        for seq in seqs:
            if isinstance(outcome, Undeliverable):
                self._reject(seq, outcome.reason)
            else:
                self._spool.retry(seq)

    def _reject(self, seq: int, reason: str) -> None:
        logger.error("Kafka refuses record %d for good (%s); kept in rejected.log", seq, reason)
        record = self._spool.read(seq)
        # Owner-only like the spool: a rejected record holds a whole prompt and reply.
        fd = os.open(self._spool.directory / "rejected.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "ab") as handle:
            os.fchmod(fd, 0o600)  # a log left by an older version may be wider
            handle.write(encode_frame(record.key, record.value))
        self._spool.ack(seq)
        self.stats.rejected += 1
        PROXY_RECORDS_REJECTED.inc()

    def _on_error(self, err: KafkaError) -> None:
        if not err.fatal():  # a fatal one is logged and handled by RebuildingProducer
            self._warn(f"Kafka: {err}")

    def _warn(self, message: str) -> None:
        now = time.monotonic()
        if now - self._last_warning >= _WARN_EVERY_S:
            self._last_warning = now
            logger.warning(message)

