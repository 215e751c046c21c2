"""Raw LLM calls and service events validated into turns; what cannot be a turn says why."""

from __future__ import annotations

import json

import pytest

from clawr1.streams.turns import (
    MAX_METADATA_HEADER_BYTES,
    InvalidEvent,
    turn_from_llm_call,
    turn_from_service_event,
)
from tests.support.events import assistant, llm_call, service_event, user


def test_llm_call_becomes_a_turn_with_one_reply_per_choice() -> None:
    record = llm_call(
        "e1",
        [user("hi")],
        ["a", "b"],
        prompt_ids=[1, 2],
        reply_ids=[[3], [4, 5]],
        trajectory_id="t1",
        response_id="chatcmpl-9",
    )
    turn = turn_from_llm_call(record)
    assert turn.messages == [user("hi")]
    assert [(r.index, r.text, r.token_ids) for r in turn.replies] == [(0, "a", [3]), (1, "b", [4, 5])]
    assert turn.replies[1].messages == [assistant("b")]
    assert turn.engine_tokens and turn.prompt_token_ids == [1, 2]
    assert turn.trajectory_id == "t1" and turn.engine_response_id == "chatcmpl-9"
    assert turn.latency_ms == 40 and turn.sampling_params == {"temperature": 0.7, "n": 2}
    assert not turn.failed


def _with_metadata(header: str) -> dict:
    record = llm_call("e1", [user("hi")], ["a"])
    record["request_headers"] = {**record["request_headers"], "x-claw-metadata": header}
    return turn_from_llm_call(record).metadata


def test_registration_metadata_header_is_merged_into_the_step_metadata() -> None:
    metadata = _with_metadata('{"ground_truth":"Paris","policy_version":3,"task":{"id":7}}')
    assert (metadata["ground_truth"], metadata["policy_version"], metadata["task"]) == ("Paris", 3, {"id": 7})
    assert metadata["api"] == "openai.chat" and metadata["capture_notes"] == []
    shadowing = _with_metadata('{"api":"mine","capture_notes":["x"],"k":1}')
    assert (shadowing["api"], shadowing["k"]) == ("openai.chat", 1)
    assert shadowing["capture_notes"] == [
        "X-Claw-Metadata keys ['api', 'capture_notes'] kept the capture's values"]


@pytest.mark.parametrize(("header", "note"), [
    (json.dumps({"blob": "x" * MAX_METADATA_HEADER_BYTES}), "bytes, over the 8192-byte bound"),
    ("[1, 2]", "not a JSON object"),
    ("{not json", "not a JSON object"),
])
def test_an_oversized_or_malformed_metadata_header_is_dropped_with_a_note(header: str, note: str) -> None:
    metadata = _with_metadata(header)
    assert "blob" not in metadata and metadata["api"] == "openai.chat"
    (capture_note,) = metadata["capture_notes"]
    assert capture_note.startswith("X-Claw-Metadata dropped") and note in capture_note


def test_upstream_failure_is_a_failed_turn_without_replies() -> None:
    turn = turn_from_llm_call(llm_call("e1", [user("hi")], [], status=503))
    assert turn.failed and turn.error == "upstream status 503" and turn.replies == []
    aborted = turn_from_llm_call(llm_call("e2", [user("hi")], [], status=None, error="client aborted"))
    assert aborted.error == "client aborted"


def test_llm_call_with_unreadable_messages_is_invalid() -> None:
    record = {**llm_call("e1", [user("hi")], ["a"]), "messages_json": "{not json"}
    with pytest.raises(InvalidEvent, match="messages_json is not JSON"):
        turn_from_llm_call(record)
    negative = llm_call("e2", [user("hi")], ["a"], prompt_ids=[1], reply_ids=[[-4]])
    with pytest.raises(InvalidEvent, match="non-negative"):
        turn_from_llm_call(negative)


def test_service_turn_payload_becomes_a_turn() -> None:
    record = service_event(
        "s1",
        "svc",
        {
            "prompt_messages": [user("q")],
            "response_text": "r",
            "reward": 0.5,
            "reward_final": False,
            "usage": {"prompt_tokens": 3},
            "metadata": {"tenant": "x"},
        },
        step_index=2,
    )
    turn = turn_from_service_event(record)
    assert turn is not None
    assert (turn.trajectory_id, turn.step_index, turn.reward, turn.reward_final) == ("svc", 2, 0.5, False)
    assert turn.usage_prompt_tokens == 3 and turn.metadata["tenant"] == "x"
    assert turn.replies[0].messages == [assistant("r")] and not turn.engine_tokens


def test_non_turn_service_events_are_not_steps() -> None:
    assert turn_from_service_event(service_event("s1", "svc", {"tool": "x"}, kind="tool_result")) is None


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ({"response_text": "r"}, "prompt_messages must be a list"),
        ({"prompt_messages": [user("q")], "reward": "high"}, "reward must be a finite number"),
        ({"prompt_messages": [user("q")], "policy_version": "v2"}, "policy_version has the wrong type"),
        ({"prompt_messages": [user("q")], "response_token_ids": [1, "2"]}, "non-negative integers"),
    ],
)
def test_bad_service_turns_are_invalid(payload: dict, reason: str) -> None:
    with pytest.raises(InvalidEvent, match=reason):
        turn_from_service_event(service_event("s1", "svc", payload))


def test_service_payload_that_is_not_an_object_is_invalid() -> None:
    record = {**service_event("s1", "svc", {}), "payload_json": json.dumps([1, 2])}
    with pytest.raises(InvalidEvent, match="JSON object"):
        turn_from_service_event(record)
