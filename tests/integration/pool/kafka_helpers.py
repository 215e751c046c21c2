"""Kafka helpers for the pool tests: produce Avro records, wait until a group committed everything."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from clawr1.core.kafka_io import make_consumer, make_producer
from clawr1.schemas.codec import codec_for


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


def committed_lag(bootstrap: str, group: str, topics: list[str]) -> int:
    """Messages of ``topics`` the group has not committed yet."""
    probe = make_consumer(bootstrap, group)
    try:
        metadata = probe.list_topics(timeout=10)
        partitions = [TopicPartition(t, p) for t in topics for p in metadata.topics[t].partitions]
        committed = {(tp.topic, tp.partition): tp.offset for tp in probe.committed(partitions, timeout=10)}
        lag = 0
        for tp in partitions:
            low, high = probe.get_watermark_offsets(tp, timeout=10)
            done = committed[(tp.topic, tp.partition)]
            lag += high - (done if done >= 0 else low)
        return lag
    finally:
        probe.close()


def wait_committed(bootstrap: str, group: str, topics: list[str], timeout: float = 60.0) -> None:
    """Until the group committed every message; coordinator hiccups (a new group) are retried."""
    deadline = time.monotonic() + timeout
    lag: int | str = "unknown"
    while time.monotonic() < deadline:
        try:
            lag = committed_lag(bootstrap, group, topics)
        except KafkaException as exc:
            lag = f"unknown ({exc})"
        if lag == 0:
            return
        time.sleep(0.3)
    raise AssertionError(f"group {group} still has {lag} uncommitted messages after {timeout}s")
