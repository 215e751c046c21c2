"""Kafka helpers for the pool tests: produce Avro records (a group's progress: tests/support/kafka.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from clawr1.core.kafka_io import make_producer
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
