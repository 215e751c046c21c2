"""confluent-kafka clients configured the one way Claw-R1 needs them.

Producers are idempotent with acks=all and hash keys with murmur2 (Java's partitioner), so a key
lands on the same partition whichever client (confluent-kafka or Faust/aiokafka) produced it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from clawr1.core.topics import ALL_TOPICS


def producer_config(bootstrap: str, **overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "partitioner": "murmur2_random",
        "linger.ms": 5,
        "compression.type": "lz4",
        "message.max.bytes": 16 * 1024 * 1024,
    }
    config.update(overrides)
    return config


def make_producer(bootstrap: str, **overrides: Any) -> Producer:
    return Producer(producer_config(bootstrap, **overrides))


def make_consumer(bootstrap: str, group_id: str, **overrides: Any) -> Consumer:
    """Offsets are committed by the caller only after its work is durable (at-least-once)."""
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group_id,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "fetch.max.bytes": 64 * 1024 * 1024,
    }
    config.update(overrides)
    return Consumer(config)


def ensure_topics(
    bootstrap: str, names: Iterable[str] | None = None, partitions: int = 4, timeout: float = 30.0
) -> None:
    """Create missing topics; existing ones are left as they are (Faust checks partition counts)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    wanted = list(names) if names is not None else [t.name for t in ALL_TOPICS]
    existing = set(admin.list_topics(timeout=timeout).topics)
    missing = [
        NewTopic(n, num_partitions=partitions, replication_factor=1) for n in wanted if n not in existing
    ]
    for name, future in (admin.create_topics(missing, operation_timeout=timeout).items() if missing else ()):
        try:
            future.result(timeout)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise RuntimeError(f"could not create topic {name}: {exc}") from exc
    wait_until_served(admin, wanted, timeout)


def wait_until_served(admin: AdminClient, names: Iterable[str], timeout: float = 30.0) -> None:
    """Return once the broker's metadata shows every partition of ``names`` with a leader.

    A created topic reaches the broker's metadata a moment after CreateTopics answers; a client that
    reads metadata in between sees it with no partitions, and Faust then keeps that view (its tables
    fail with ``PartitionsMismatch`` on their first write, seen on a loaded 2-core machine).
    """
    pending = set(names)
    deadline = time.monotonic() + timeout
    while pending:
        topics = admin.list_topics(timeout=timeout).topics
        pending = {name for name in pending if not _served(topics.get(name))}
        if not pending:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"topics without partition leaders after {timeout:.0f}s: {sorted(pending)}")
        time.sleep(0.1)


def _served(topic: Any) -> bool:
    return (topic is not None and topic.error is None and bool(topic.partitions)
            and all(p.error is None and p.leader >= 0 for p in topic.partitions.values()))
