"""The project's own broker keeps every acknowledged message across a restart."""

from __future__ import annotations

from pathlib import Path

from clawr1.broker.launcher import KafkaBroker
from clawr1.core.kafka_io import ensure_topics, make_consumer, make_producer
from clawr1.core.routing import partition_of
from tests.support.ports import free_port

MESSAGES = 5000


def test_acknowledged_messages_survive_a_broker_restart(tmp_path: Path, unique: str) -> None:
    broker = KafkaBroker(data_dir=tmp_path / "kafka", port=free_port(), controller_port=free_port())
    topic = f"durability.{unique}"
    acked: set[str] = set()

    def on_delivery(err: object, msg: object) -> None:
        if err is None:
            acked.add(msg.value().decode())  # type: ignore[attr-defined]

    with broker:
        ensure_topics(broker.bootstrap, [topic], partitions=3)
        producer = make_producer(broker.bootstrap)
        for i in range(MESSAGES):
            producer.produce(topic, key=str(i % 17).encode(), value=f"m{i}".encode(), on_delivery=on_delivery)
            producer.poll(0)
        assert producer.flush(30) == 0
    assert len(acked) == MESSAGES

    with broker:
        consumer = make_consumer(broker.bootstrap, f"g.{unique}")
        consumer.subscribe([topic])
        seen: list[str] = []
        try:
            idle = 0
            while idle < 10 and len(seen) < MESSAGES:
                msg = consumer.poll(1.0)
                if msg is None:
                    idle += 1
                    continue
                assert msg.error() is None, msg.error()
                seen.append(msg.value().decode())
        finally:
            consumer.close()
    assert set(seen) == acked
    assert len(seen) == MESSAGES, "a message was read twice or lost"


def test_same_key_lands_on_the_java_murmur2_partition(kafka_bootstrap: str, unique: str) -> None:
    """Our producers and ``clawr1.core.routing`` (Java's murmur2) agree on which partition a key owns:
    the worker relies on it to know where a trajectory, a target or a routable id lives."""
    topic = f"partitioner.{unique}"
    ensure_topics(kafka_bootstrap, [topic], partitions=8)
    producer = make_producer(kafka_bootstrap)
    placed: dict[bytes, int] = {}

    def on_delivery(err: object, msg: object) -> None:
        assert err is None
        placed[msg.key()] = msg.partition()  # type: ignore[attr-defined]

    keys = [f"trajectory-{i}-é".encode() for i in range(50)]
    for key in keys:
        producer.produce(topic, key=key, value=b"v", on_delivery=on_delivery)
    assert producer.flush(30) == 0
    for key in keys:
        assert placed[key] == partition_of(key.decode(), 8)
