"""Each topic of the stack gets the configs of its role (``kafka_io.topic_config``): how long Kafka keeps
it, how it compresses it, and segments that close often enough for retention and compaction to act."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest

from clawr1.core import topics
from clawr1.core.kafka_io import (
    CHANGELOG_SEGMENT_MS,
    COMPRESSION,
    HOUR_MS,
    SEGMENT_MS,
    TopicPolicy,
    align_topic_configs,
    topic_config,
)
from clawr1.core.registry import SettingsError
from clawr1.streams import quix_compat
from clawr1.streams.config import StreamTopics

POLICY = TopicPolicy(input_ms=6 * HOUR_MS, output_ms=12 * HOUR_MS, dead_letters_ms=168 * HOUR_MS)


@pytest.mark.parametrize("suffix", ["", ".t1"])
def test_every_topic_of_the_worker_has_its_role(suffix: str) -> None:
    names = StreamTopics().with_suffix(suffix)
    roles = {name: topics.role_of(name) for name in names.all_names()}
    inputs = (names.raw_llm, names.raw_steps, names.raw_events, names.raw_feedback, names.work)
    assert roles == {**dict.fromkeys(inputs, topics.INPUT), names.steps: topics.OUTPUT,
                     names.prefix_nodes: topics.OUTPUT, names.dlq: topics.DEAD_LETTERS}
    assert topics.role_of(quix_compat.changelog_topic("clawr1-streams", names.work)) == topics.CHANGELOG


def test_inputs_are_kept_shortest_and_dead_letters_longest() -> None:
    retention = {name: int(topic_config(name, POLICY)["retention.ms"])
                 for name in ("clawr1.raw.llm", "clawr1.internal.work", "clawr1.steps", "clawr1.dlq")}
    assert retention == {"clawr1.raw.llm": 6 * HOUR_MS, "clawr1.internal.work": 6 * HOUR_MS,
                         "clawr1.steps": 12 * HOUR_MS, "clawr1.dlq": 168 * HOUR_MS}


def test_every_topic_of_the_stack_is_compressed_and_closes_segments_hourly_the_changelog_sooner() -> None:
    for name in StreamTopics().all_names():
        config = topic_config(name, POLICY)
        assert config["compression.type"] == COMPRESSION
        assert int(config["segment.ms"]) == SEGMENT_MS, name
    changelog = topic_config(quix_compat.changelog_topic("app", "clawr1.internal.work"), POLICY)
    assert changelog["compression.type"] == COMPRESSION
    assert int(changelog["segment.ms"]) == CHANGELOG_SEGMENT_MS < SEGMENT_MS  # compaction acts sooner


def test_a_retention_under_an_hour_closes_segments_as_often() -> None:
    """Retention deletes closed segments only: a segment open longer than the retention would keep
    its data past it."""
    short = TopicPolicy(input_ms=600_000, output_ms=-1, dead_letters_ms=HOUR_MS)
    assert topic_config("clawr1.raw.steps", short)["segment.ms"] == "600000"
    kept = topic_config("clawr1.steps", short)
    assert kept["retention.ms"] == "-1" and kept["segment.ms"] == str(SEGMENT_MS)


def test_the_changelog_is_compacted_not_deleted_by_age() -> None:
    config = topic_config(quix_compat.changelog_topic("clawr1-streams", "clawr1.internal.work.x"), POLICY)
    assert config["cleanup.policy"] == "compact"
    assert "retention.ms" not in config
    assert int(config["delete.retention.ms"]) <= HOUR_MS  # tombstones of expired state go within the hour


def test_a_topic_of_anyone_else_keeps_kafka_s_defaults() -> None:
    assert topic_config("orders", POLICY) == {}
    assert topic_config("clawr1.other", POLICY) == {}


def test_the_policy_reads_hours_from_the_settings() -> None:
    assert TopicPolicy.from_env({}) == POLICY
    env = {"CLAWR1_KAFKA_INPUT_RETENTION_H": "0.5", "CLAWR1_KAFKA_OUTPUT_RETENTION_H": "-1",
           "CLAWR1_KAFKA_DLQ_RETENTION_H": "720"}
    assert TopicPolicy.from_env(env) == TopicPolicy(input_ms=HOUR_MS // 2, output_ms=-1,
                                                     dead_letters_ms=720 * HOUR_MS)
    with pytest.raises(SettingsError, match="CLAWR1_KAFKA_INPUT_RETENTION_H"):
        TopicPolicy.from_env({"CLAWR1_KAFKA_INPUT_RETENTION_H": "0"})


class _SlowAdmin:
    """An admin client whose describe never answers in time (a loaded cluster)."""

    def describe_configs(self, resources: list[Any], request_timeout: float) -> dict[Any, Future[Any]]:
        return {resource: Future() for resource in resources}


def test_a_cluster_that_does_not_answer_in_time_leaves_the_configs_and_the_role_starts() -> None:
    assert align_topic_configs(_SlowAdmin(), ["clawr1.raw.llm"], POLICY, timeout=0.05) == {}  # type: ignore[arg-type]
