"""The guard's Kafka reader against the real broker: where the group resumes, and ranges by offset."""

from __future__ import annotations

import uuid

from confluent_kafka import TopicPartition

from clawr1.core.kafka_io import ensure_topics, make_consumer, make_producer
from clawr1.streams.gaps import KafkaReader


def test_the_reader_finds_the_resume_point_and_reads_a_range(kafka_bootstrap: str) -> None:
    topic, group = f"gaps-{uuid.uuid4().hex[:8]}", f"gaps-group-{uuid.uuid4().hex[:8]}"
    ensure_topics(kafka_bootstrap, [topic], partitions=1)
    producer = make_producer(kafka_bootstrap)
    for n in range(10):
        producer.produce(topic, key=b"k", value=f"v{n}".encode())
    assert producer.flush(30) == 0
    reader = KafkaReader(kafka_bootstrap, group)
    try:
        assert reader.committed(topic, 0) == 0  # nothing committed yet: the log's start
        committer = make_consumer(kafka_bootstrap, group)
        committer.commit(offsets=[TopicPartition(topic, 0, 4)], asynchronous=False)
        committer.close()
        assert reader.committed(topic, 0) == 4
        events = reader.read(topic, 0, 4, 7)
        assert [(e.message.offset, e.value, e.key) for e in events] == [
            (4, b"v4", b"k"), (5, b"v5", b"k"), (6, b"v6", b"k")]
        assert [e.message.offset for e in reader.read(topic, 0, 8, 50)] == [8, 9]  # bounded by the log
        assert reader.committed(topic, 0) == 4  # reading moved nothing
    finally:
        reader.close()
