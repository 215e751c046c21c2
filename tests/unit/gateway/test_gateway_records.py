"""Submissions become Avro records with deterministic ids, the right Kafka keys and no lost field."""

from __future__ import annotations

import json
import uuid

from clawr1.core.routing import id_tag, key_hash
from clawr1.gateway.models import EventIn, FeedbackIn, StepIn
from clawr1.gateway.records import deterministic_id, event_record, feedback_record, step_record
from clawr1.schemas.codec import codec_for

STEP = StepIn(trajectory_id="traj", step_index=2, prompt_token_ids=[1, 2], response_token_ids=[3],
              response_logprobs=[-0.1], prompt_messages=[{"role": "user", "content": "hi"}],
              response_text="yo", reward=0.5, reward_final=False, policy_version=7, metadata={"seed": 1})


def roundtrip(schema: str, record: dict) -> dict:
    codec = codec_for("")
    name, decoded = codec.decode(codec.encode(schema, record), expect=schema)
    assert name == schema
    return decoded


def test_step_record_round_trips_through_the_codec() -> None:
    out = step_record(STEP, "agent-a", 1234)
    decoded = roundtrip("whitebox_step", out.record)
    assert out.key == "traj" and decoded["step_id"] == out.id
    assert decoded["prompt_token_ids"] == [1, 2] and decoded["response_logprobs"] == [-0.1]
    assert json.loads(decoded["prompt_messages"]) == [{"role": "user", "content": "hi"}]
    assert decoded["reward"] == 0.5 and decoded["reward_final"] is False and decoded["policy_version"] == 7
    assert decoded["source_name"] == "agent-a" and json.loads(decoded["metadata_json"]) == {"seed": 1}
    assert decoded["received_at_ms"] == 1234 and len(decoded["content_digest"]) == 64


def test_generated_step_id_is_stable_across_retries_and_reward_updates() -> None:
    first = step_record(STEP, "agent-a", 1)
    retried = step_record(STEP.model_copy(), "agent-a", 99)
    rewarded = step_record(STEP.model_copy(update={"reward": 1.0, "reward_final": True}), "agent-a", 5)
    assert uuid.UUID(first.id).version == 8 and id_tag(first.id) == key_hash("traj")  # routable
    assert first.id == retried.id == rewarded.id
    assert first.record["content_digest"] == retried.record["content_digest"]
    assert rewarded.record["content_digest"] != first.record["content_digest"]


def test_step_ids_and_digests_do_not_drift_between_releases() -> None:
    # Stored ids and digests make a re-sent step a duplicate; a change to how they are computed would
    # turn every re-send after an upgrade into a new step. The digest was written by the release before
    # the fast path and the model path shared one formula; the id by the release that made it routable
    # (until then it was the UUIDv5 766293f3-5a31-5b36-9795-4717f63455e7).
    out = step_record(STEP, "agent-a", 1234)
    assert out.id == "c0cd39ad-41a7-8863-8b32-cb2841e17e3a"
    assert out.record["content_digest"] == "59d67f4d73def3d1dd8c292a06ef792d6340da80868bc2c5479ea1c0976cf2e9"


def test_step_identity_differs_by_source_position_and_content() -> None:
    base = step_record(STEP, "agent-a", 1).id
    assert step_record(STEP, "agent-b", 1).id != base
    assert step_record(STEP.model_copy(update={"step_index": 3}), "agent-a", 1).id != base
    assert step_record(STEP.model_copy(update={"response_token_ids": [4]}), "agent-a", 1).id != base


def test_given_step_id_is_kept() -> None:
    assert step_record(STEP.model_copy(update={"step_id": "mine"}), "a", 1).id == "mine"


def test_feedback_targets_and_key() -> None:
    for target, kind in (("step_id", "step"), ("response_id", "response"), ("trajectory_id", "trajectory")):
        fb = FeedbackIn(**{target: "x1"}, reward=1.0, components={"fmt": 0.5}, source="human", label="good")
        out = feedback_record(fb, "rater", 10)
        decoded = roundtrip("feedback", out.record)
        assert (decoded["target_kind"], decoded["target_id"], out.key) == (kind, "x1", "x1")
        assert decoded["components"] == {"fmt": 0.5} and decoded["source_name"] == "rater"
    fb = FeedbackIn(step_id="s", reward=1.0)
    assert feedback_record(fb, "rater", 1).id == feedback_record(fb, "rater", 2).id
    assert feedback_record(fb, "other", 1).id != feedback_record(fb, "rater", 1).id
    # An id derived before terminal existed stays the same; a completion is another fact.
    assert feedback_record(fb, "rater", 1).id == deterministic_id(
        "feedback", "rater", fb.model_dump(exclude={"feedback_id", "terminal"}))
    done = FeedbackIn(trajectory_id="t", reward=1.0, terminal=True)
    out = feedback_record(done, "rater", 1)
    assert roundtrip("feedback", out.record)["terminal"] and out.id != feedback_record(
        FeedbackIn(trajectory_id="t", reward=1.0), "rater", 1).id
    assert not roundtrip("feedback", feedback_record(fb, "rater", 1).record)["terminal"]


def test_turn_payload_is_normalized_and_other_payloads_kept_as_sent() -> None:
    turn = EventIn(kind="turn", trajectory_id="t", payload={
        "prompt_messages": [{"role": "user", "content": "q"}], "response_text": "a",
        "prompt_group_size": 4.0, "response_token_ids": [7.0, 8], "logprobs": [-1, -0.5],
        "usage": {"prompt_tokens": 3.0}})
    payload = json.loads(event_record(turn, "svc", 1).record["payload_json"])
    assert payload == {"prompt_messages": [{"role": "user", "content": "q"}], "response_text": "a",
                       "prompt_group_size": 4, "response_token_ids": [7, 8], "logprobs": [-1.0, -0.5],
                       "usage": {"prompt_tokens": 3}}
    assert type(payload["prompt_group_size"]) is int
    other = EventIn(kind="tool_result", trajectory_id="t", payload={"n": 3.0, "z": None})
    assert json.loads(event_record(other, "svc", 1).record["payload_json"]) == {"n": 3.0, "z": None}


def test_event_timestamp_defaults_to_receipt_and_id_is_deterministic() -> None:
    event = EventIn(kind="tool_result", trajectory_id="t", payload={"ok": True})
    out = event_record(event, "svc", 777)
    decoded = roundtrip("service_event", out.record)
    assert decoded["timestamp_ms"] == 777 and json.loads(decoded["payload_json"]) == {"ok": True}
    assert out.key == "t" and out.id == event_record(event, "svc", 888).id
    assert id_tag(out.id) == key_hash("t")  # routable to its trajectory
    stamped = EventIn(kind="tool_result", trajectory_id="t", payload={"ok": True}, timestamp_ms=5)
    assert event_record(stamped, "svc", 777).record["timestamp_ms"] == 5
    assert event_record(stamped, "svc", 777).id != out.id
