"""`clawr1 status`'s view of a Kafka cluster, from metadata alone: each broker, the replication factor,
and which partitions are under-replicated (a copy missing from the in-sync set)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from clawr1.status import BOOTSTRAP_FILE, PartitionState, kafka_report, partition_states, stack_bootstrap


def _partition(pid: int, leader: int, replicas: list[int], isrs: list[int]) -> SimpleNamespace:
    return SimpleNamespace(id=pid, leader=leader, replicas=replicas, isrs=isrs)


def test_metadata_becomes_partition_states_in_order() -> None:
    topics = {"b": SimpleNamespace(partitions={0: _partition(0, 1, [1, 2, 3], [1, 2, 3])}),
              "a": SimpleNamespace(partitions={1: _partition(1, 2, [2, 3, 1], [2, 1]),
                                               0: _partition(0, 3, [3, 1, 2], [3, 1, 2])})}
    states = partition_states(topics)
    assert [(s.topic, s.partition) for s in states] == [("a", 0), ("a", 1), ("b", 0)]
    assert [s.under_replicated for s in states] == [False, True, False]


def test_a_broker_down_shows_as_missing_and_its_partitions_as_under_replicated() -> None:
    partitions = [PartitionState("clawr1.steps", 0, 1, (1, 2, 3), (1, 3)),
                  PartitionState("clawr1.steps", 1, 3, (3, 1, 2), (3, 1)),
                  PartitionState("clawr1.dlq", 0, 1, (1, 3, 2), (1, 3))]
    lines = kafka_report({1: "127.0.0.1:9092", 3: "127.0.0.1:9094"},
                         ["127.0.0.1:9092", "127.0.0.1:9093", "127.0.0.1:9094"], partitions)
    assert lines[0] == "kafka: 2 broker(s) up; 3 partitions, replication factor 3, 3 under-replicated"
    assert "kafka broker 1 (127.0.0.1:9092): up, leads 2, out of sync in 0" in lines
    assert "kafka broker 3 (127.0.0.1:9094): up, leads 1, out of sync in 0" in lines
    assert "kafka broker 127.0.0.1:9093: not among the live brokers (down?)" in lines
    assert "under-replicated: clawr1.steps/1 in sync [3, 1] of [3, 1, 2]" in lines


def test_a_broker_catching_up_is_named_and_a_long_list_is_cut() -> None:
    partitions = [PartitionState("t", n, 1, (1, 2), (1,)) for n in range(12)]
    lines = kafka_report({1: "h:1", 2: "h:2"}, ["h:1"], partitions)
    assert "kafka broker 2 (h:2): up, leads 0, out of sync in 12" in lines
    assert sum(line.startswith("under-replicated: t/") for line in lines) == 10
    assert lines[-1] == "under-replicated: 2 more"


def test_a_healthy_cluster_says_so() -> None:
    lines = kafka_report({1: "h:1"}, ["h:1"], [PartitionState("t", 0, 1, (1,), (1,))])
    assert lines == ["kafka: 1 broker(s) up; 1 partitions, replication factor 1, 0 under-replicated",
                     "kafka broker 1 (h:1): up, leads 1, out of sync in 0"]


def test_status_looks_at_the_brokers_the_stack_recorded(tmp_path: Path) -> None:
    assert stack_bootstrap(tmp_path, "127.0.0.1:9092") == "127.0.0.1:9092"
    (tmp_path / BOOTSTRAP_FILE).parent.mkdir(parents=True)
    (tmp_path / BOOTSTRAP_FILE).write_text("127.0.0.1:7000,127.0.0.1:7001\n")
    assert stack_bootstrap(tmp_path, "127.0.0.1:9092") == "127.0.0.1:7000,127.0.0.1:7001"
