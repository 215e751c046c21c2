"""Offsets Faust handed to no agent, found and processed anyway.

Seen in the chaos suite (about one run in six, and once in CI): after a killed worker came back and
the group rebalanced, one raw step per partition never reached the pool. The raw topic held it, the
steps topic never did: Faust drops a message fetched in the previous consumer generation, the next
message is processed and acked, and Faust commits the highest run of consecutive acks, past the
dropped one (faust-streaming issue 312). Nothing upstream can fix that, so each agent checks that a
partition's offsets arrive without a forward jump, and reads a skipped range from Kafka itself
before it handles the event that revealed it: the skipped records are processed before that event's
ack can let a commit pass them. Handlers are idempotent, so a range read twice costs only time.

All our topics are written by non-transactional producers and never compacted (changelogs are not
consumed by agents), so consecutive offsets are the rule and a jump always means a skip.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, cast

from confluent_kafka import OFFSET_INVALID, Consumer, TopicPartition

from clawr1.core.kafka_io import make_consumer

log = logging.getLogger(__name__)

TP = tuple[str, int]
T = TypeVar("T")


class MessageLike(Protocol):
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: float


class EventLike(Protocol):
    """What a handler reads of an event: Faust's events and `SkippedEvent` both have it."""

    @property
    def key(self) -> Any: ...
    @property
    def value(self) -> Any: ...
    @property
    def message(self) -> Any: ...


@dataclass(frozen=True)
class SkippedMessage:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: float  # seconds, as Faust's messages carry it


@dataclass(frozen=True)
class SkippedEvent:
    """A record read back from Kafka, shaped like the Faust event a handler expects."""

    message: SkippedMessage

    @property
    def key(self) -> bytes | None:
        return self.message.key

    @property
    def value(self) -> bytes | None:
        return self.message.value


@dataclass
class _Position:
    generation: int
    next_offset: int


@dataclass
class GapTracker:
    """Per partition: the next offset an agent should see. Pure, so the rules are tested alone.

    Within one consumer generation the next offset is the one after the highest processed. When the
    generation changes the partition may have been elsewhere meanwhile, so the baseline is the later
    of that and the group's committed offset (asked once per partition and generation).
    """

    _positions: dict[TP, _Position] = field(default_factory=dict)

    def needs_committed(self, tp: TP, generation: int) -> bool:
        position = self._positions.get(tp)
        return position is None or position.generation != generation

    def missing(self, tp: TP, generation: int, offset: int, committed: int | None = None) -> range:
        """Offsets before ``offset`` that no event carried (empty when none)."""
        position = self._positions.get(tp)
        candidates = [] if committed is None else [committed]
        if position is not None:
            candidates.append(position.next_offset)
        if not candidates:
            return range(0)
        baseline = position.next_offset if position is not None and position.generation == generation \
            else max(candidates)
        return range(baseline, offset) if offset > baseline else range(0)

    def owed(self, tp: TP, generation: int, highwater: int | None,
             committed: int | None = None) -> int | None:
        """Where to fetch again from when the log holds offsets past all an idle agent was handed.

        That is a dropped tail: no later event will reveal it. The start is this generation's own
        progress, else the group's committed offset; None when nothing is owed.
        """
        position = self._positions.get(tp)
        start = position.next_offset if position is not None and position.generation == generation \
            else committed
        if start is None or highwater is None or start >= highwater:
            return None
        return start

    def processed(self, tp: TP, generation: int, offset: int) -> None:
        position = self._positions.get(tp)
        if position is None or position.generation != generation:
            self._positions[tp] = _Position(generation, offset + 1)
        else:
            position.next_offset = max(position.next_offset, offset + 1)


class KafkaReader:
    """The group's committed offsets and records by offset range, on a client of its own.

    It never subscribes, so it never joins the group or moves its offsets.
    """

    def __init__(self, bootstrap: str, group_id: str, timeout_s: float = 15.0) -> None:
        self.timeout_s = timeout_s
        self._consumer: Consumer = make_consumer(bootstrap, group_id)

    def committed(self, topic: str, partition: int) -> int:
        """Where the group resumes: its committed offset, else the log's start (offset reset earliest)."""
        [tp] = self._consumer.committed([TopicPartition(topic, partition)], timeout=self.timeout_s)
        if tp.offset != OFFSET_INVALID and tp.offset >= 0:
            return int(tp.offset)
        low, _ = self._consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                      timeout=self.timeout_s)
        return int(low)

    def read(self, topic: str, partition: int, start: int, stop: int) -> list[SkippedEvent]:
        """Records at offsets [start, stop) that the log still holds."""
        self._consumer.assign([TopicPartition(topic, partition, start)])
        events: list[SkippedEvent] = []
        try:
            low, high = self._consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                             timeout=self.timeout_s)
            stop = min(stop, high)
            position = max(start, low)
            while position < stop:
                batch = self._consumer.consume(num_messages=min(1000, stop - position),
                                               timeout=self.timeout_s)
                if not batch:
                    raise TimeoutError(f"{topic}[{partition}] gave nothing at offset {position} within "
                                       f"{self.timeout_s:.0f}s")
                for msg in batch:
                    # A consumed message without an error has an offset (the client types it optional).
                    if msg.error() is not None or cast(int, msg.offset()) >= stop:
                        continue
                    _, stamp = msg.timestamp()
                    events.append(SkippedEvent(SkippedMessage(topic, partition, cast(int, msg.offset()),
                                                              msg.key(), msg.value(), stamp / 1000)))
                    position = cast(int, msg.offset()) + 1
        finally:
            self._consumer.unassign()
        return events

    def close(self) -> None:
        self._consumer.close()


class GapGuard:
    """Ties the tracker to a reader for one worker's agents (they share one event loop).

    The reader is made on first use, so an app built for a test context needs no broker.
    """

    def __init__(self, reader: Callable[[], KafkaReader]) -> None:
        self.tracker = GapTracker()
        self._make_reader = reader
        self._reader: KafkaReader | None = None
        self._lock = asyncio.Lock()  # one client: reads from several agents take turns
        self._busy: dict[str, int] = {}  # topic -> events being handled
        self._since: dict[str, float] = {}  # topic -> when its agent last finished an event
        self._started = time.monotonic()

    @property
    def reader(self) -> KafkaReader:
        if self._reader is None:
            self._reader = self._make_reader()
        return self._reader

    async def skipped_before(self, event: EventLike) -> list[SkippedEvent]:
        msg = event.message
        tp: TP = (msg.topic, msg.partition)
        generation = _generation(msg)
        committed = await self._committed_if_new(tp, generation)
        missing = self.tracker.missing(tp, generation, msg.offset, committed)
        if not missing:
            return []
        log.warning("%s[%s]: offsets %s-%s reached no agent; processing them from Kafka", msg.topic,
                    msg.partition, missing.start, missing.stop - 1)
        return await self._retrying(self.reader.read, msg.topic, msg.partition, missing.start, missing.stop)

    async def _retrying(self, call: Callable[..., T], *args: Any) -> T:
        """Until it works: the revealing event waits unacked, so no commit can pass what is owed."""
        delay = 0.5
        while True:
            try:
                async with self._lock:
                    return await asyncio.to_thread(call, *args)
            except Exception as exc:  # noqa: BLE001 - Kafka away or slow: try again, never drop
                log.error("reading skipped offsets failed (retrying in %.1fs): %s", delay, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    def handling(self, event: EventLike) -> None:
        topic = event.message.topic
        self._busy[topic] = self._busy.get(topic, 0) + 1

    def processed(self, event: EventLike) -> None:
        msg = event.message
        self.tracker.processed((msg.topic, msg.partition), _generation(msg), msg.offset)
        self._busy[msg.topic] -= 1
        self._since[msg.topic] = time.monotonic()

    def idle(self, topic: str, seconds: float) -> bool:
        """No event of ``topic`` in hand, and none finished for ``seconds``: its queue is empty."""
        finished = self._since.get(topic, self._started)
        return not self._busy.get(topic) and time.monotonic() - finished >= seconds

    async def dropped_tail(self, tp: TP, generation: int, highwater: int | None) -> int | None:
        """The offset to fetch ``tp`` again from, when its idle agent never saw the log's last records."""
        if highwater is None:
            return None
        return self.tracker.owed(tp, generation, highwater, await self._committed_if_new(tp, generation))

    async def _committed_if_new(self, tp: TP, generation: int) -> int | None:
        """The group's committed offset, asked only when ``tp`` has no position in this generation."""
        if not self.tracker.needs_committed(tp, generation):
            return None
        return await self._retrying(self.reader.committed, *tp)


def _generation(msg: Any) -> int:
    """The consumer generation a Faust message was fetched in (0 for records read back here)."""
    return int(getattr(msg, "generation_id", 0) or 0)
