"""The rewarder's pure decisions: what is a target, when it is already scored, what it is called with,
and the feedback record it posts (valid Avro, deterministic)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from clawr1.core.settings import load_settings
from clawr1.rewards.worker import (
    RewarderConfig,
    already_scored,
    feedback_id_of,
    feedback_of,
    reward_fields,
    target_of,
)
from clawr1.schemas.codec import AvroCodec
from tests.support.records import step as step_record


def step(**fields: Any) -> dict[str, Any]:
    return step_record("s1", trajectory_id="t1", **fields)


def test_trajectories_are_targets_at_their_terminal_step_and_steps_always() -> None:
    assert target_of(step(terminal=False), "trajectory") is None
    assert target_of(step(terminal=True), "trajectory") == ("trajectory", "t1")
    assert target_of(step(terminal=False), "step") == ("step", "s1")
    assert target_of(step(terminal=True, status="failed"), "trajectory") is None
    assert target_of(step(terminal=True, link_status="superseded"), "step") is None


def test_feedback_ids_name_the_function_and_target_only() -> None:
    one = feedback_id_of("m:f", "trajectory", "t1")
    assert one == feedback_id_of("m:f", "trajectory", "t1")
    assert len({one, feedback_id_of("m:g", "trajectory", "t1"), feedback_id_of("m:f", "step", "t1")}) == 3


def test_already_scored_by_this_function_or_by_anyone_when_asked() -> None:
    fid = feedback_id_of("m:f", "trajectory", "t1")
    ours = step(terminal=True, trajectory_reward=1.0, feedback_json=json.dumps([{"feedback_id": fid}]))
    assert already_scored(ours, "trajectory", fid, skip_rewarded=False)
    agents = step(terminal=True, trajectory_reward=0.5)
    assert already_scored(agents, "trajectory", fid, skip_rewarded=True)
    assert not already_scored(agents, "trajectory", fid, skip_rewarded=False)
    assert not already_scored(step(terminal=True, reward=1.0), "trajectory", fid, skip_rewarded=True)
    assert already_scored(step(reward=1.0), "step", fid, skip_rewarded=True)


def test_reward_fields_are_the_compute_reward_arguments() -> None:
    record = step(step_index=2, prompt_token_ids=[1, 2], response_token_ids=[3], response_text="4",
                  prompt_messages='[{"role": "user", "content": "2+2"}]', channel="val",
                  metadata_json='{"ground_truth": "4"}')
    got = reward_fields(record)
    assert got["prompt_ids"] == [1, 2] and got["response_ids"] == [3] and got["num_turns"] == 3
    assert got["dataset_fields"] == {"ground_truth": "4"}
    extra = got["extra_fields"]
    assert extra["response_text"] == "4" and extra["channel"] == "val" and extra["trajectory_id"] == "t1"
    assert extra["prompt_messages"] == [{"role": "user", "content": "2+2"}]


def test_feedback_record_is_valid_avro_and_keeps_extra_info() -> None:
    record = feedback_of("m:f", "trajectory", "t1", "fid", 1.0, {"acc": True, "pred": "4"}, 123)
    assert record["source"] == "reward_fn" and record["source_name"] == "m:f"
    assert record["components"] == {"acc": 1.0}
    assert json.loads(record["comment"]) == {"acc": True, "pred": "4"}
    codec = AvroCodec()
    assert codec.decode(codec.encode("feedback", record), expect="feedback")[1] == record


def test_config_from_environment() -> None:
    env = {"CLAWR1_REWARD_FN": "clawr1.rewards.rules:exact_match", "CLAWR1_TOPIC_SUFFIX": ".x",
           "CLAWR1_REWARD_TARGET": "step", "CLAWR1_KAFKA_BOOTSTRAP": "k:9092"}
    config = RewarderConfig.from_settings(load_settings(env))
    assert config.name == "clawr1.rewards.rules:exact_match" and config.target == "step"
    assert (config.steps_topic, config.feedback_topic, config.dlq_topic) == (
        "clawr1.steps.x", "clawr1.raw.feedback.x", "clawr1.dlq.x")
    with pytest.raises(ValueError, match="CLAWR1_REWARD_TARGET"):
        RewarderConfig.from_settings(load_settings({**env, "CLAWR1_REWARD_TARGET": "episode"}))
