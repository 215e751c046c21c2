"""The project's own broker keeps every acknowledged message across a restart, and a crashed one comes
back without acting on its crashed run's metadata."""

from __future__ import annotations

from pathlib import Path

from confluent_kafka import TopicPartition

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


def test_a_broker_restarted_after_a_crash_leads_nothing_before_it_has_registered(
        tmp_path: Path, unique: str) -> None:
    """SIGKILL, then start again: the crashed run is fenced first, so the restarted broker neither loads
    the transaction coordinator nor is refused as a duplicate before it registers (the window in which
    Kafka skipped a prepared transaction's markers and wedged the worker's group, seen in the chaos
    test). A transaction committed before the crash stays readable and its group's offsets fetchable."""
    broker = KafkaBroker(data_dir=tmp_path / "kafka", port=free_port(), controller_port=free_port())
    topic, group = f"txn.{unique}", f"g.{unique}"
    with broker:
        ensure_topics(broker.bootstrap, [topic], partitions=2)
        producer = make_producer(broker.bootstrap, **{"transactional.id": f"t.{unique}"})
        producer.init_transactions(30)
        reader = make_consumer(broker.bootstrap, group)
        reader.assign([TopicPartition(topic, 0, 0)])
        producer.begin_transaction()
        for i in range(10):
            producer.produce(topic, value=f"m{i}".encode(), partition=i % 2)
        offsets = [TopicPartition(topic, 0, 7)]
        producer.send_offsets_to_transaction(offsets, reader.consumer_group_metadata(), 30)
        producer.commit_transaction(30)
        reader.close()
        run_before = broker.log_file.stat().st_size
        broker.kill()

        broker.start()
        with broker.log_file.open("rb") as log:
            log.seek(run_before)
            lines = log.read().decode(errors="replace").splitlines()

        def first(text: str) -> int:
            return next((n for n, line in enumerate(lines) if text in line), -1)

        fenced, registered = first("Fencing broker 1 at epoch"), first("Successfully registered broker 1")
        coordinator = first("Elected as the txn coordinator")
        assert 0 <= fenced < registered, (fenced, registered)
        assert first("DUPLICATE_BROKER_REGISTRATION") == -1
        assert coordinator == -1 or coordinator > registered, (coordinator, registered)

        consumer = make_consumer(broker.bootstrap, group)  # read_committed: stable offsets required
        try:
            committed = consumer.committed([TopicPartition(topic, 0)], timeout=30)
            assert committed[0].error is None and committed[0].offset == 7, committed
        finally:
            consumer.close()


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
