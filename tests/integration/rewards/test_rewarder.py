"""The rewarder on the real broker: it scores terminal trajectories once, replays post identical
feedback, and a failing reward function gives a dead letter while the rewarder carries on."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from clawr1.core.kafka_io import ensure_topics, make_consumer, make_producer
from clawr1.rewards.worker import Rewarder, RewarderConfig, feedback_id_of
from clawr1.schemas.codec import AvroCodec
from tests.support.kafka import TopicFollower
from tests.support.records import step as step_record
from tests.support.waiting import wait_until

SPEC = "clawr1.rewards.rules:math_answer"
CODEC = AvroCodec()


@pytest.fixture
def config(kafka_bootstrap: str, unique: str) -> RewarderConfig:
    suffix = f".{unique}"
    config = RewarderConfig(
        bootstrap=kafka_bootstrap, spec=SPEC, name=SPEC, group_id=f"rw-{unique}", partitions=2,
        steps_topic=f"clawr1.steps{suffix}", feedback_topic=f"clawr1.raw.feedback{suffix}",
        dlq_topic=f"clawr1.dlq{suffix}",
    )
    ensure_topics(kafka_bootstrap, [config.steps_topic, config.feedback_topic, config.dlq_topic], 2)
    return config


def publish(config: RewarderConfig, *records: dict[str, Any]) -> None:
    producer = make_producer(config.bootstrap)
    for record in records:
        producer.produce(config.steps_topic, CODEC.encode("step", record), record["step_id"])
    assert producer.flush(30) == 0


def read(bootstrap: str, topic: str, count: int, timeout: float = 60.0) -> list[tuple[bytes, Any]]:
    """``count`` records of ``topic`` from the start, as (raw message value, decoded record); a message may
    be an envelope of several records."""
    follower = TopicFollower(bootstrap, [topic])
    out: list[tuple[bytes, Any]] = []

    def enough() -> bool:
        out.extend((read.value, read.record) for read in follower.read(0.5))
        return len(out) >= count

    try:
        wait_until(enough, timeout, interval=0, message=lambda: f"{count} records on {topic}, got {out}")
    finally:
        follower.close()
    assert len(out) == count, f"expected {count} records on {topic}, got {len(out)}: {out}"
    return out


@pytest.fixture
def running() -> Iterator[Any]:
    """Start rewarders in threads; every one is stopped at the end of the test."""
    stops: list[tuple[threading.Event, threading.Thread]] = []

    def start(config: RewarderConfig) -> Rewarder:
        rewarder = Rewarder(config)
        stop = threading.Event()
        consumer, producer = make_consumer(config.bootstrap, config.group_id), make_producer(config.bootstrap)

        def run() -> None:
            try:
                rewarder.run(consumer, producer, stop)
            finally:
                consumer.close()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        stops.append((stop, thread))
        return rewarder

    yield start
    for stop, thread in stops:
        stop.set()
        thread.join(30)


def step(step_id: str, trajectory: str, **fields: Any) -> dict[str, Any]:
    return step_record(step_id, trajectory_id=trajectory, **fields)


def test_terminal_trajectories_are_scored_once_and_failures_are_dead_letters(
    config: RewarderConfig, running: Any
) -> None:
    truth = '{"ground_truth": "4"}'
    publish(
        config,
        step("right-0", "right", terminal=False, response_text="thinking", metadata_json=truth),
        step("right-1", "right", step_index=1, terminal=True, response_text=r"\boxed{4}",
             metadata_json=truth),
        step("wrong-0", "wrong", terminal=True, response_text="it is 5", metadata_json=truth),
        step("nogt-0", "nogt", terminal=True, response_text="4"),  # no ground truth: the function fails
        # already rewarded by the agent itself, and a failed call: neither is scored
        step("agent-0", "agent", terminal=True, response_text="4", metadata_json=truth,
             trajectory_reward=1.0),
        step("failed-0", "failed", terminal=True, status="failed", metadata_json=truth),
    )
    rewarder = running(config)
    feedback = {record["target_id"]: (raw, record) for raw, record in read(config.bootstrap,
                                                                            config.feedback_topic, 2)}
    assert set(feedback) == {"right", "wrong"}
    right = feedback["right"][1]
    assert right["target_kind"] == "trajectory" and right["reward"] == 1.0 and right["final"]
    assert (right["source"], right["source_name"]) == ("reward_fn", SPEC)
    assert right["feedback_id"] == feedback_id_of(SPEC, "trajectory", "right")
    assert feedback["wrong"][1]["reward"] == 0.0
    [(_, letter)] = read(config.bootstrap, config.dlq_topic, 1)
    assert letter["stage"] == "reward" and "no ground truth" in letter["reason"]
    assert letter["source_topic"] == config.steps_topic and "nogt" in letter["reason"]
    assert CODEC.decode(letter["original_value"])[1]["step_id"] == "nogt-0"

    # The same trajectory again, in a newer version that holds the joined reward: not scored twice.
    joined = f'[{{"feedback_id": "{right["feedback_id"]}"}}]'
    publish(config, step("right-1", "right", version=2, step_index=1, terminal=True,
                         response_text=r"\boxed{4}", metadata_json=truth, feedback_json=joined),
            step("late-0", "late", terminal=True, response_text="4", metadata_json=truth))
    later = read(config.bootstrap, config.feedback_topic, 3)
    assert [record["target_id"] for _, record in later].count("right") == 1
    assert rewarder.scored == 3 and rewarder.dead_letters == 1

    # A replay from the start (a new group, as after losing offsets) posts byte-identical feedback.
    running(replace(config, group_id=config.group_id + "-replay"))
    replayed = read(config.bootstrap, config.feedback_topic, 6)
    by_target: dict[str, set[bytes]] = {}
    for raw, record in replayed:
        by_target.setdefault(record["target_id"], set()).add(raw)
    assert {target: len(raws) for target, raws in by_target.items()} == {"right": 1, "wrong": 1, "late": 1}
