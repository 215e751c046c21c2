"""Request bodies: what is accepted, and for each rejection the status, field and reason."""

from __future__ import annotations

import json
from typing import Any

import pytest

from clawr1.core.epoch import MAX_EPOCH_MS, is_epoch_ms
from clawr1.gateway.errors import ApiError
from clawr1.gateway.models import EventIn, FeedbackIn, StepIn
from clawr1.gateway.validation import check_event, check_feedback, check_step, parse_items

STEP: dict[str, Any] = {
    "trajectory_id": "traj-1", "step_index": 0, "prompt_token_ids": [1, 2, 3],
    "response_token_ids": [4, 5], "response_logprobs": [-0.5, -0.25],
}


def steps(body: Any, max_batch: int = 10) -> list[StepIn]:
    return parse_items(json.dumps(body).encode(), StepIn, check_step, max_batch)


def rejection(body: Any, model: type = StepIn, check: Any = check_step, raw: bytes | None = None) -> ApiError:
    with pytest.raises(ApiError) as error:
        parse_items(raw if raw is not None else json.dumps(body).encode(), model, check, 10)
    return error.value


def fields(error: ApiError) -> dict[str, str]:
    return {e.field: e.type for e in error.errors}


def test_single_step_and_batch_are_accepted() -> None:
    [one] = steps(STEP)
    assert one.response_logprobs == [-0.5, -0.25] and one.reward_final is True
    assert [s.step_index for s in steps([STEP, {**STEP, "step_index": 1}])] == [0, 1]


def test_whole_floats_are_integers_as_in_json_schema() -> None:
    [one] = steps({**STEP, "step_index": 2.0, "prompt_token_ids": [1.0, 7], "policy_version": 3.0})
    assert (one.step_index, one.prompt_token_ids, one.policy_version) == (2, [1, 7], 3)
    assert type(one.prompt_token_ids[0]) is int
    assert fields(rejection({**STEP, "prompt_token_ids": [1e10]})) == {"prompt_token_ids[0]": "less_than"}


def test_text_only_step_is_accepted() -> None:
    [one] = steps({"trajectory_id": "t", "step_index": 3,
                   "prompt_messages": [{"role": "user", "content": "hi"}], "response_text": ""})
    assert one.prompt_token_ids == [] and one.response_text == ""


@pytest.mark.parametrize(("change", "field", "kind"), [
    ({"trajectory_id": None}, "trajectory_id", "string_type"),
    ({"step_index": "0"}, "step_index", "int_type"),
    ({"step_index": 1.5}, "step_index", "int_type"),
    ({"step_index": -1}, "step_index", "greater_than_equal"),
    ({"prompt_token_ids": [1, -2]}, "prompt_token_ids[1]", "greater_than_equal"),
    ({"prompt_token_ids": [1, 2.5]}, "prompt_token_ids[1]", "int_type"),
    ({"prompt_token_ids": [True]}, "prompt_token_ids[0]", "int_type"),
    ({"response_token_ids": [2**31, 1]}, "response_token_ids[0]", "less_than"),
    ({"response_logprobs": [-0.5]}, "response_logprobs", "length_mismatch"),
    ({"response_logprobs": ["x", -1.0]}, "response_logprobs[0]", "float_type"),
    ({"reward": "1"}, "reward", "float_type"),
    ({"reward_final": "false"}, "reward_final", "bool_type"),
    ({"policy_version": 1.5}, "policy_version", "int_type"),
    ({"metadata": [1]}, "metadata", "dict_type"),
    ({"source_name": "spoofed"}, "source_name", "extra_forbidden"),
    ({"reward_finl": False}, "reward_finl", "extra_forbidden"),
    ({"prompt_token_ids": [], "prompt_messages": None}, "prompt_token_ids", "missing"),
    ({"response_token_ids": [], "response_logprobs": None}, "response_token_ids", "missing"),
])
def test_bad_step_fields_are_named(change: dict[str, Any], field: str, kind: str) -> None:
    error = rejection({**STEP, **change})
    assert error.status == 422 and error.code == "invalid_request"
    assert fields(error) == {field: kind}
    assert all(e.reason for e in error.errors)


def test_missing_required_fields() -> None:
    error = rejection({"prompt_token_ids": [1], "response_token_ids": [2]})
    assert fields(error) == {"trajectory_id": "missing", "step_index": "missing"}


def test_batch_errors_carry_the_item_index() -> None:
    error = rejection([STEP, {**STEP, "response_logprobs": [-1.0]}, {**STEP, "step_index": "x"}])
    assert fields(error) == {"[1].response_logprobs": "length_mismatch", "[2].step_index": "int_type"}


def test_non_finite_number_in_metadata_is_refused() -> None:
    error = rejection(None, raw=json.dumps(STEP).encode()[:-1] + b', "metadata": {"x": 1e999}}')
    assert fields(error) == {"metadata": "finite_number"}


@pytest.mark.parametrize("raw", [b"", b"  ", b"{", b'{"a": NaN}', b"\xff\xfe", b'{"s": "\\ud800"}'])
def test_malformed_json_is_400(raw: bytes) -> None:
    error = rejection(None, raw=raw)
    assert error.status == 400 and error.code == "malformed_json"


def test_batch_limits() -> None:
    with pytest.raises(ApiError) as too_many:
        steps([STEP] * 11, max_batch=10)
    assert too_many.value.status == 413 and "limit of 10" in too_many.value.message
    empty = rejection([])
    assert empty.status == 422 and fields(empty) == {"": "too_short"}


def test_body_must_be_an_object_or_list() -> None:
    assert fields(rejection(5)) == {"": "model_type"}


def test_errors_are_capped() -> None:
    error = rejection([{**STEP, "prompt_token_ids": [-1] * 100}])
    assert len(error.errors) == 50 and "100 invalid" in error.message


def feedback_rejection(body: dict[str, Any]) -> ApiError:
    return rejection(body, FeedbackIn, check_feedback)


def test_feedback_needs_exactly_one_target_and_some_content() -> None:
    [fb] = parse_items(json.dumps({"response_id": "r", "components": {"format": 1}}).encode(),
                       FeedbackIn, check_feedback, 10)
    assert fb.components == {"format": 1.0}
    assert fields(feedback_rejection({"reward": 1.0})) == {"step_id": "target"}
    two_targets = feedback_rejection({"step_id": "s", "trajectory_id": "t", "reward": 1.0})
    assert fields(two_targets) == {"step_id": "target"}
    assert "given: step_id, trajectory_id" in two_targets.errors[0].reason
    assert fields(feedback_rejection({"step_id": "s", "final": False})) == {"reward": "missing"}
    bad_component = feedback_rejection({"step_id": "s", "components": {"x": "1"}})
    assert fields(bad_component) == {"components.x": "float_type"}


def test_terminal_alone_completes_a_trajectory_and_needs_a_trajectory_target() -> None:
    [fb] = parse_items(json.dumps({"trajectory_id": "t", "terminal": True}).encode(), FeedbackIn,
                       check_feedback, 10)
    assert fb.terminal and fb.reward is None
    assert fields(feedback_rejection({"step_id": "s", "terminal": True})) == {"terminal": "target"}
    assert fields(feedback_rejection({"trajectory_id": "t", "terminal": False})) == {"reward": "missing"}
    assert fields(feedback_rejection({"trajectory_id": "t", "terminal": "yes"})) == {"terminal": "bool_type"}


def event_rejection(body: dict[str, Any]) -> ApiError:
    return rejection(body, EventIn, check_event)


TURN = {"prompt_messages": [{"role": "user", "content": "2+2?"}], "response_text": "4", "model": "m"}


def test_turn_events_need_a_well_formed_payload() -> None:
    [event] = parse_items(json.dumps({"kind": "turn", "trajectory_id": "t", "payload": TURN}).encode(),
                          EventIn, check_event, 10)
    assert event.payload == TURN
    assert fields(event_rejection({"kind": "turn", "trajectory_id": "t", "payload": {}})) == {
        "payload.prompt_messages": "missing"}
    assert fields(event_rejection({"kind": "turn", "trajectory_id": "t",
                                   "payload": {**TURN, "response_text": None}})) == {
        "payload.response_text": "missing"}
    assert fields(event_rejection({"kind": "turn", "trajectory_id": "t",
                                   "payload": {**TURN, "rewrd": 1}})) == {"payload.rewrd": "extra_forbidden"}
    mismatch = {**TURN, "response_token_ids": [5, 6], "logprobs": [-1.0]}
    assert fields(event_rejection({"kind": "turn", "trajectory_id": "t", "payload": mismatch})) == {
        "payload.logprobs": "length_mismatch"}
    assert fields(event_rejection({"kind": "turn", "trajectory_id": "t",
                                   "payload": {**TURN, "prompt_token_ids": [-1]}})) == {
        "payload.prompt_token_ids[0]": "greater_than_equal"}


def test_other_events_take_any_payload() -> None:
    [event] = parse_items(json.dumps({"kind": "tool_result", "trajectory_id": "t", "timestamp_ms": 5,
                                      "payload": {"anything": [1, {"x": None}]}}).encode(),
                          EventIn, check_event, 10)
    assert event.timestamp_ms == 5
    assert fields(event_rejection({"kind": "", "trajectory_id": "t"})) == {"kind": "string_too_short"}


def test_an_event_time_the_pool_cannot_store_is_refused() -> None:
    """The sink's rule (clawr1.core.epoch): such a time was accepted (any long), then dead-lettered."""
    too_late = {"kind": "tool_result", "trajectory_id": "t", "timestamp_ms": MAX_EPOCH_MS}
    assert fields(event_rejection(too_late)) == {"timestamp_ms": "less_than"}
    [event] = parse_items(json.dumps({"kind": "tool_result", "trajectory_id": "t",
                                      "timestamp_ms": MAX_EPOCH_MS - 1}).encode(), EventIn, check_event, 10)
    assert is_epoch_ms(event.timestamp_ms or 0)


@pytest.mark.parametrize(("model", "check", "body", "field"), [
    (StepIn, check_step, {**STEP, "trajectory_id": "t\r\nX: 1"}, "trajectory_id"),
    (StepIn, check_step, {**STEP, "step_id": "s\x00"}, "step_id"),
    (StepIn, check_step, {**STEP, "prompt_group_id": "g\u2028"}, "prompt_group_id"),
    (FeedbackIn, check_feedback, {"trajectory_id": "t\n", "reward": 1.0}, "trajectory_id"),
    (EventIn, check_event, {"kind": "note", "trajectory_id": "t", "step_id": "s\x7f"}, "step_id"),
])
def test_ids_with_control_characters_are_refused_naming_the_field(model: type, check: Any, body: Any,
                                                                   field: str) -> None:
    """A CR/LF trajectory id was stored, then 404 in the dashboard: ids follow clawr1.core.ids everywhere."""
    error = rejection(body, model, check)
    assert error.status == 422 and fields(error) == {field: "value_error"}
    assert "no control character" in error.errors[0].reason


def test_tool_call_arguments_nest_no_deeper_than_any_body() -> None:
    """Arguments are JSON in a string, parsed by the streams: 50,000 levels were accepted, then lost."""
    deep = "[" * 50_000 + "]" * 50_000
    calls = [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}},
             {"id": "d", "type": "function", "function": {"name": "f", "arguments": deep}}]
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": calls}]
    step = rejection({**STEP, "prompt_messages": messages})
    assert fields(step) == {"prompt_messages[1].tool_calls[1].function.arguments": "too_deep"}
    assert "nests deeper than 200 levels" in step.errors[0].reason
    turn = {"kind": "turn", "trajectory_id": "t",
            "payload": {"prompt_messages": messages, "tool_calls": calls[1:]}}
    assert fields(rejection(turn, EventIn, check_event)) == {
        "payload.prompt_messages[1].tool_calls[1].function.arguments": "too_deep",
        "payload.tool_calls[0].function.arguments": "too_deep"}
    shallow = [{"role": "assistant", "tool_calls": calls[:1]}]
    assert steps({**STEP, "prompt_messages": shallow})[0].prompt_messages == shallow
