"""Two real stream workers with one app id split the partitions and, together, write exactly what a
single worker writes for the recorded mix (``clawr1 up`` / several ``clawr1 worker``)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from clawr1.core.kafka_io import make_consumer
from clawr1.streams.config import StreamTopics
from tests.integration.streams.conftest import (
    PARTITIONS,
    Outputs,
    Result,
    WorkerRun,
    final_state,
    settled,
)
from tests.integration.streams.mix import MIX
from tests.support.waiting import wait_until

Shares = dict[str, dict[str, frozenset[int]]]  # member id -> consumed topic -> its partitions there


def consumed_topics(topics: StreamTopics) -> set[str]:
    """The topics the agents consume: a worker's partitions of these are its share of the work."""
    return set(topics.all_names()) - {topics.steps, topics.prefix_nodes, topics.dlq}


def describe_shares(admin: AdminClient, run: WorkerRun) -> tuple[str, Shares]:
    """The consumer group's state and each member's partitions of the consumed topics (changelog
    partitions are left out: every worker also holds the others' as standbys)."""
    group = admin.describe_consumer_groups([run.app_id], request_timeout=10)[run.app_id].result(15)
    consumed = consumed_topics(run.topics)
    shares: Shares = {}
    for member in group.members:
        owned: dict[str, set[int]] = defaultdict(set)
        for assigned in member.assignment.topic_partitions:
            if assigned.topic in consumed:
                owned[assigned.topic].add(assigned.partition)
        shares[member.member_id] = {topic: frozenset(partitions) for topic, partitions in owned.items()}
    return group.state.name, shares


def split_of(state: str, shares: Shares, consumed: set[str], members: int) -> set[frozenset[int]] | None:
    """Each member's partitions once the group is a stable split: ``members`` members, each owning the
    same non-empty partitions of every consumed topic (co-partitioned, so a table key lives with the
    events that touch it), no partition owned twice, none left out. None until then."""
    if state != "STABLE" or len(shares) != members:
        return None
    per_member = []
    for owned in shares.values():
        if set(owned) != consumed or len(set(owned.values())) != 1:
            return None
        per_member.append(next(iter(owned.values())))
    disjoint = sum(len(p) for p in per_member) == len(frozenset().union(*per_member))
    covering = frozenset().union(*per_member) == frozenset(range(PARTITIONS))
    if not (all(per_member) and disjoint and covering):
        return None
    return set(per_member)


def wait_for_split(runs: list[WorkerRun], timeout: float) -> set[frozenset[int]]:
    admin = AdminClient({"bootstrap.servers": runs[0].bootstrap})
    consumed = consumed_topics(runs[0].topics)
    seen: list[Any] = [None, None]

    def split() -> set[frozenset[int]] | None:
        seen[:] = describe_shares(admin, runs[0])
        return split_of(seen[0], seen[1], consumed, len(runs))

    def unsettled() -> str:
        logs = "\n".join(f"worker log {run.log}:\n{run.tail()}" for run in runs)
        return (f"group {runs[0].app_id} settling into a split of all {PARTITIONS} partitions: "
                f"state {seen[0]}, shares {seen[1]}\n{logs}")

    return wait_until(split, timeout, interval=0.2, message=unsettled)


def fed_partitions(run: WorkerRun) -> set[int]:
    """Partitions of the consumed topics that hold at least one message."""
    consumer = make_consumer(run.bootstrap, "test-watermarks" + run.suffix)
    try:
        return {
            partition
            for topic in consumed_topics(run.topics)
            for partition in range(PARTITIONS)
            if consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[1] > 0
        }
    finally:
        consumer.close()


def test_two_workers_split_the_partitions_and_write_what_one_worker_writes(
    uninterrupted: Result,
    worker_runs: Callable[[], tuple[WorkerRun, Outputs]],
    worker_peers: Callable[[WorkerRun], WorkerRun],
) -> None:
    first, outputs = worker_runs()
    runs = [first, worker_peers(first)]
    with ThreadPoolExecutor(len(runs)) as pool:  # started at once, like workers on several hosts
        list(pool.map(WorkerRun.start, runs))
    split = wait_for_split(runs, 45)  # each worker owns a non-empty, disjoint share of the partitions

    first.produce(MIX)
    outputs.wait_for(settled, 90, *runs)
    outputs.poll(2.0)  # anything after the final state would be a wrong extra version
    final, reference = final_state(Result(first, outputs)), final_state(uninterrupted)
    assert final["steps"] == reference["steps"]
    assert final["dead_letters"] == reference["dead_letters"]
    assert final["trees"] == reference["trees"]

    # The split held through the replay and both shares had input: both workers did part of the work.
    assert wait_for_split(runs, 10) == split, "the split changed during the replay"
    fed = fed_partitions(first)
    assert all(share & fed for share in split), f"the mix fed only partitions {fed}, shares {split}"

    with ThreadPoolExecutor(len(runs)) as pool:  # SIGTERM (how `clawr1` stops a worker), both at once
        assert list(pool.map(WorkerRun.stop, runs)) == [0, 0]
