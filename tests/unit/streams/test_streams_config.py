"""Worker configuration from settings: topic names, app id, readiness rule, bounds."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from clawr1.core.settings import load_settings
from clawr1.streams.config import StreamConfig, StreamTopics
from clawr1.streams.readiness import ReadinessRule


def test_defaults_follow_the_project_topics() -> None:
    topics = StreamTopics()
    assert (topics.raw_llm, topics.steps, topics.dlq) == ("clawr1.raw.llm", "clawr1.steps", "clawr1.dlq")
    assert all(n.startswith("clawr1.") for n in topics.all_names()) and len(topics.all_names()) == 8


def test_from_environment() -> None:
    settings = load_settings(
        {
            "CLAWR1_KAFKA_BOOTSTRAP": "k:1",
            "CLAWR1_DATA_DIR": "/d",
            "CLAWR1_TOPIC_PARTITIONS": "2",
            "CLAWR1_TOPIC_SUFFIX": ".t1",
            "CLAWR1_STREAMS_APP_ID": "w",
            "CLAWR1_READY_RULE": "tokens",
            "CLAWR1_PREFIX_MAX_STEPS": "9",
            "CLAWR1_TOKENIZER": "/tok.json",
        }
    )
    config = StreamConfig.from_settings(settings)
    assert (config.bootstrap, config.data_dir, config.partitions, config.app_id) == (
        "k:1",
        Path("/d/streams"),
        2,
        "w",
    )
    assert config.topics.raw_feedback == "clawr1.raw.feedback.t1" and config.topics.work.endswith(".t1")
    assert config.readiness == ReadinessRule(frozenset({"tokens"})) and config.max_scope_steps == 9
    assert config.tokenizer == "/tok.json" and config.commit_interval_ms == 100


def test_bad_values_fail_fast_with_the_variable() -> None:
    with pytest.raises(ValueError, match="unknown readiness requirement"):
        StreamConfig.from_settings(load_settings({"CLAWR1_READY_RULE": "tokens,vibes"}))
    with pytest.raises(ValueError, match="CLAWR1_STREAMS_COMMIT_INTERVAL_MS"):
        StreamConfig.from_settings(load_settings({"CLAWR1_STREAMS_COMMIT_INTERVAL_MS": "soon"}))


def test_a_named_slot_is_a_static_member_with_a_stable_transactional_id() -> None:
    """An instance id makes the worker a static group member whose transactional id survives a restart
    (so the restart fences its predecessor's open transaction); none, a dynamic member with a random one."""
    from clawr1.streams.app import kafka_overrides

    named = StreamConfig.from_settings(load_settings({"CLAWR1_STREAMS_INSTANCE_ID": "w-1",
                                                      "CLAWR1_STREAMS_APP_ID": "g"}))
    consumer, producer = kafka_overrides(named, "g-w-1")
    assert consumer["group.instance.id"] == "w-1" and producer["transactional.id"] == "g-w-1"
    assert producer["partitioner"] == "murmur2_random"
    consumer, producer = kafka_overrides(StreamConfig.from_settings(load_settings({})), "c")
    assert "group.instance.id" not in consumer and "transactional.id" not in producer


def test_each_worker_slot_keeps_its_state_in_a_folder_of_its_own() -> None:
    """Two workers of one machine never open (and wait on the lock of) the same RocksDB partition."""
    from clawr1.streams.app import state_dir

    base = StreamConfig("k:1", Path("/d/streams"), app_id="w")
    slots = {state_dir(replace(base, instance_id=slot)) for slot in ("up-0", "up-1")}
    assert slots == {Path("/d/streams/w/up-0"), Path("/d/streams/w/up-1")}
    assert state_dir(base) == Path("/d/streams/w")  # a worker without a slot: the app's folder
