"""Worker configuration from settings: topic names, app id, readiness rule, bounds."""

from __future__ import annotations

from pathlib import Path

import pytest

from clawr1.core.settings import load_settings
from clawr1.streams.config import StreamConfig, StreamTopics
from clawr1.streams.readiness import ReadinessRule


def test_defaults_follow_the_project_topics() -> None:
    topics = StreamTopics()
    assert (topics.raw_llm, topics.steps, topics.dlq) == ("clawr1.raw.llm", "clawr1.steps", "clawr1.dlq")
    assert all(n.startswith("clawr1.") for n in topics.all_names()) and len(topics.all_names()) == 10


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
    assert config.topics.raw_feedback == "clawr1.raw.feedback.t1" and config.topics.scopes.endswith(".t1")
    assert config.readiness == ReadinessRule(frozenset({"tokens"})) and config.max_scope_steps == 9
    assert config.tokenizer == "/tok.json" and config.web_port == 0


def test_bad_values_fail_fast_with_the_variable() -> None:
    with pytest.raises(ValueError, match="unknown readiness requirement"):
        StreamConfig.from_settings(load_settings({"CLAWR1_READY_RULE": "tokens,vibes"}))
    with pytest.raises(ValueError, match="CLAWR1_STREAMS_WEB_PORT"):
        StreamConfig.from_settings(load_settings({"CLAWR1_STREAMS_WEB_PORT": "web"}))


def test_static_membership_only_when_named() -> None:
    """An instance id makes the worker a static group member of Faust's consumer; none, a dynamic one."""
    from clawr1.streams.app import StreamsApp

    named = StreamConfig.from_settings(load_settings({"CLAWR1_STREAMS_INSTANCE_ID": "w-1"}))
    assert named.instance_id == "w-1"
    assert StreamsApp(named).app.conf.consumer_group_instance_id == "w-1"
    unnamed = StreamConfig.from_settings(load_settings({}))
    assert StreamsApp(unnamed).app.conf.consumer_group_instance_id is None
