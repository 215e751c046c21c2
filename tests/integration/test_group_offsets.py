"""How far a consumer group is, read from a real broker in a few batched requests: the group's committed
offsets where it committed, the log's start where it never did (records deleted from the front
included), the end of every partition, and nothing for a topic that is not there."""

from __future__ import annotations

from confluent_kafka import TopicPartition

from clawr1.core.kafka_io import ensure_topics, make_admin, make_consumer, make_producer
from clawr1.core.offsets import Offsets, group_offsets, group_reader


def test_group_offsets_read_committed_start_and_end_of_every_partition(kafka_bootstrap: str,
                                                                      unique: str) -> None:
    topic, group = f"offsets.{unique}", f"g.{unique}"
    ensure_topics(kafka_bootstrap, [topic], partitions=3)
    producer = make_producer(kafka_bootstrap)
    for partition, count in ((0, 5), (1, 3)):
        for i in range(count):
            producer.produce(topic, value=f"m{i}".encode(), partition=partition)
    assert producer.flush(30) == 0
    committer = make_consumer(kafka_bootstrap, group)
    try:
        committer.commit(offsets=[TopicPartition(topic, 0, 2)], asynchronous=False)
    finally:
        committer.close()
    admin = make_admin(kafka_bootstrap)  # held: its futures end with it
    for future in admin.delete_records([TopicPartition(topic, 1, 2)]).values():
        future.result(30)

    reader = group_reader(kafka_bootstrap, group)
    try:
        offsets = group_offsets(reader, [topic, f"missing.{unique}"])
    finally:
        reader.close()
    assert offsets == {(topic, 0): Offsets(2, 5), (topic, 1): Offsets(2, 3, unset=True),
                       (topic, 2): Offsets(0, 0, unset=True)}
