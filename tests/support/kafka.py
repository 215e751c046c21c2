"""The one way the tests read a Kafka topic: decoded with the codec (a lone record or an envelope of
several, ``decode_all``), as a consumer of committed data (``read_committed``, as every role reads), from
the topic's beginning; either up to its end as of the call (``read_topic``) or as it grows
(``TopicFollower``). And how far a consumer group has committed (``committed_lag``, ``wait_committed``)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Message, TopicPartition

from clawr1.core.kafka_io import make_consumer, make_producer
from clawr1.schemas.codec import AvroCodec, CodecError, codec_for
from tests.support.waiting import wait_until


@dataclass(frozen=True)
class TopicRecord:
    """One record as read: the records of one message (an envelope carries several) share its partition,
    key, bytes and timestamp; ``partitions`` is the topic's partition count (what keys hash into)."""

    topic: str
    partition: int
    partitions: int
    key: bytes | None
    value: bytes
    schema: str
    record: dict[str, Any]
    timestamp_ms: int


def _reader(bootstrap: str, **overrides: Any) -> Consumer:
    # make_consumer: read_committed, from the earliest offset, nothing committed.
    return make_consumer(bootstrap, f"test-reader-{uuid.uuid4().hex[:8]}", **overrides)


def _records(message: Message, partitions: int, codec: AvroCodec,
             skip_undecodable: bool) -> list[TopicRecord]:
    if message.error():
        raise RuntimeError(f"{message.topic()}: {message.error()}")
    try:
        schema, records = codec.decode_all(message.value())
    except CodecError:
        if skip_undecodable:  # a test's (or a fault's) deliberate garbage
            return []
        raise
    return [TopicRecord(str(message.topic()), int(message.partition()), partitions, message.key(),
                        message.value(), schema, record, message.timestamp()[1]) for record in records]


def read_topic(bootstrap: str, topic: str, timeout: float = 30.0, *,
               skip_undecodable: bool = False) -> list[TopicRecord]:
    """Every record on ``topic`` up to its end as of the call, in each partition's order; a message the
    codec cannot read raises, or is left out with ``skip_undecodable``."""
    codec = codec_for("")
    consumer = _reader(bootstrap)
    try:
        count = len(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(count)}
        pending = {TopicPartition(topic, p, OFFSET_BEGINNING) for p, end in ends.items() if end > 0}
        consumer.assign(list(pending))
        out: list[TopicRecord] = []
        started = time.monotonic()
        while pending:
            if time.monotonic() - started > timeout:
                raise TimeoutError(f"{topic}: partitions {sorted(p.partition for p in pending)} not read to "
                                   f"their end within {timeout:g} s")
            for message in consumer.consume(1000, 0.5):
                if message.error() is None and message.offset() >= ends[message.partition()]:
                    continue  # written after the call
                out += _records(message, count, codec, skip_undecodable)
            # Past the end also when the end is a transaction's marker, which is never delivered.
            pending = {tp for tp in pending if consumer.position([tp])[0].offset < ends[tp.partition]}
        return out
    finally:
        consumer.close()


class TopicFollower:
    """Reads ``topics`` from their beginning as they grow; ``read`` returns what came since the last call."""

    def __init__(self, bootstrap: str, topics: Sequence[str], *, skip_undecodable: bool = False) -> None:
        self._consumer = _reader(bootstrap, **{"topic.metadata.refresh.interval.ms": 1000})
        self._consumer.subscribe(list(topics))
        self._codec = codec_for("")
        self._skip = skip_undecodable
        self._partitions: dict[str, int] = {}

    def _count(self, topic: str) -> int:
        # Asked once per topic: asking per message kept a reader behind a busy topic.
        if topic not in self._partitions:
            described = self._consumer.list_topics(topic, timeout=10).topics[topic]
            self._partitions[topic] = len(described.partitions)
        return self._partitions[topic]

    def read(self, seconds: float = 0.2) -> list[TopicRecord]:
        """The records of the messages that arrived within ``seconds`` (at least one fetch)."""
        out: list[TopicRecord] = []
        started = time.monotonic()
        while True:
            for message in self._consumer.consume(1000, min(0.2, seconds)):
                out += _records(message, self._count(str(message.topic())), self._codec, self._skip)
            if time.monotonic() - started >= seconds:
                return out

    def close(self) -> None:
        self._consumer.close()


def committed_lag(bootstrap: str, group: str, topics: Sequence[str], *, transactional: bool = False) -> int:
    """Messages of ``topics`` the consumer group has not committed yet (read with a consumer that never
    joins the group, so it moves nothing). Of a topic written in transactions each partition's last
    offset is the marker that ended its last transaction, never delivered: ``transactional`` leaves it
    out."""
    probe = make_consumer(bootstrap, group)
    try:
        metadata = probe.list_topics(timeout=10)
        partitions = [TopicPartition(t, p) for t in topics for p in metadata.topics[t].partitions]
        committed = {(tp.topic, tp.partition): tp.offset for tp in probe.committed(partitions, timeout=10)}
        lag = 0
        for tp in partitions:
            low, high = probe.get_watermark_offsets(tp, timeout=10)
            done = committed[(tp.topic, tp.partition)]
            end = high - 1 if transactional and high > low else high
            lag += max(0, end - (done if done >= 0 else low))
        return lag
    finally:
        probe.close()


def wait_committed(bootstrap: str, group: str, topics: Sequence[str], timeout: float = 60.0, *,
                   transactional: bool = False) -> None:
    """Until the group committed every message of ``topics``; coordinator hiccups (a new group) are
    retried."""
    lags: list[int | str] = ["unknown"]

    def caught_up() -> bool:
        try:
            lags[0] = committed_lag(bootstrap, group, topics, transactional=transactional)
        except KafkaException as exc:
            lags[0] = f"unknown ({exc})"
        return lags[0] == 0

    wait_until(caught_up, timeout, interval=0.3,
               message=lambda: f"group {group} still has {lags[0]} uncommitted messages on {list(topics)}")


def produce(bootstrap: str, topic: str, messages: Iterable[tuple[str, str, dict[str, Any] | bytes]]) -> int:
    """Produce (key, schema, record-or-raw-bytes) messages; returns how many were acknowledged."""
    codec = codec_for()
    producer = make_producer(bootstrap)
    count = 0
    for key, schema, payload in messages:
        value = payload if isinstance(payload, bytes) else codec.encode(schema, payload)
        producer.produce(topic, key=key.encode(), value=value)
        producer.poll(0)
        count += 1
    assert producer.flush(30) == 0, "messages left unacknowledged"
    return count
