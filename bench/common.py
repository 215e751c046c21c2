"""Small helpers the benchmarks share: a free loopback port, a percentile, Kafka messages per topic."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable

from confluent_kafka import TopicPartition

from clawr1.core.kafka_io import make_consumer


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    """The value at fraction ``q`` (0..1) of the sorted sample (nearest rank, no interpolation)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def settled_message_counts(bootstrap: str, label: Callable[[str], str | None]) -> dict[str, int]:
    """Messages in each topic ``label`` names (None skips it), from the offsets, once they stopped
    growing: a worker still finishes work that no awaited output waits for."""
    consumer = make_consumer(bootstrap, "bench-offsets-" + uuid.uuid4().hex[:8])

    def counts() -> dict[str, int]:
        found = {}
        for name, meta in consumer.list_topics(timeout=10).topics.items():
            if (shown := label(name)) is not None:
                found[shown] = sum(consumer.get_watermark_offsets(TopicPartition(name, p), timeout=10)[1]
                                   for p in meta.partitions)
        return dict(sorted(found.items()))

    try:
        previous, current = {}, counts()
        while current != previous:
            time.sleep(3)
            previous, current = current, counts()
        return current
    finally:
        consumer.close()
