"""The trajectory view's shaping: what each step adds, where its new token ids start, whose feedback is
whose, and ids decoded only with the tokenizer that made them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clawr1.dashboard.conversation import (
    TOKENS_SHOWN,
    common_prefix,
    feedback_by_target,
    message_list,
    new_messages,
    token_view,
    trajectory_totals,
    turns,
)
from clawr1.dashboard.decoding import TokenDecoder, load_decoder, tokenizer_file_identity
from tests.support.events import build_tokenizer

SYSTEM = {"role": "system", "content": "be brief"}
USER = {"role": "user", "content": "find x"}
CALL = {"role": "assistant", "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "grep", "arguments": "{}"}}]}
RESULT = {"role": "tool", "tool_call_id": "c1", "content": "no matches"}
AGAIN = {"role": "user", "content": "look again"}


def test_the_first_step_shows_its_whole_prompt() -> None:
    assert new_messages(None, [SYSTEM, USER]) == {
        "repeated": 0, "messages": [SYSTEM, USER], "rewritten": False}


def test_a_later_step_shows_what_follows_the_previous_prompt_and_its_reply() -> None:
    # Step 1 repeats step 0's prompt, then sends step 0's reply (the tool call) back: only the result is new.
    assert new_messages([SYSTEM, USER], [SYSTEM, USER, CALL, RESULT]) == {
        "repeated": 3, "messages": [RESULT], "rewritten": False}
    later = new_messages([SYSTEM, USER, CALL, RESULT], [SYSTEM, USER, CALL, RESULT, CALL, AGAIN])
    assert later["messages"] == [AGAIN]


def test_a_prompt_that_does_not_extend_the_previous_one_is_flagged_rewritten() -> None:
    trimmed = [SYSTEM, AGAIN]
    assert new_messages([SYSTEM, USER, CALL, RESULT], trimmed) == {
        "repeated": 1, "messages": [AGAIN], "rewritten": True}


def test_a_prompt_that_is_not_a_message_list_is_shown_as_captured() -> None:
    assert new_messages([SYSTEM], "raw completion prompt") == {
        "repeated": 0, "messages": "raw completion prompt", "rewritten": False}
    assert message_list({"messages": [USER]}) == [USER]
    assert message_list({"text": "x"}) is None


@given(st.lists(st.integers(0, 3), max_size=12), st.lists(st.integers(0, 3), max_size=12))
def test_common_prefix_is_the_longest_shared_start(a: list[int], b: list[int]) -> None:
    n = common_prefix(a, b)
    assert a[:n] == b[:n]
    assert n == min(len(a), len(b)) or a[n] != b[n]


def test_a_token_view_starts_where_asked_and_is_bounded() -> None:
    ids = list(range(TOKENS_SHOWN + 10))
    view = token_view(ids, 5, None, None)
    assert (view["start"], view["total"], view["ids"][:2], len(view["ids"]), view["pieces"]) == (
        5, TOKENS_SHOWN + 10, [5, 6], TOKENS_SHOWN, None)


def test_feedback_goes_to_the_step_it_names_through_its_id_or_response() -> None:
    steps = [{"step_id": "s0", "response_id": "r0"}, {"step_id": "s1", "response_id": "r1"}]
    records = [{"feedback_id": "f1", "target_kind": "step", "target_id": "s1"},
               {"feedback_id": "f2", "target_kind": "response", "target_id": "r0"},
               {"feedback_id": "f3", "target_kind": "trajectory", "target_id": "t"}]
    per_step, whole = feedback_by_target(records, steps)
    assert {k: [r["feedback_id"] for r in v] for k, v in per_step.items()} == {"s0": ["f2"], "s1": ["f1"]}
    assert [r["feedback_id"] for r in whole] == ["f3"]


def _row(index: int, prompt: list[dict[str, Any]], prompt_ids: list[int], response_ids: list[int],
         **fields: Any) -> dict[str, Any]:
    return {"step_id": f"s{index}", "step_index": index, "response_id": f"r{index}",
            "prompt_messages": prompt,
            "prompt_token_ids": prompt_ids, "response_token_ids": response_ids, "tokenizer": None,
            "reward": fields.get("reward"), "policy_version": fields.get("policy_version"),
            "trajectory_reward": None, "terminal": fields.get("terminal", 0), "ready": 1, "status": "ok",
            "created_ms": 1000 + index, "prompt_group_id": "g", "source_kind": "whitebox_agent",
            "source_name": "w", "agent": "a"}


def test_turns_start_each_steps_new_ids_after_the_previous_prompt_and_response() -> None:
    rows = [_row(0, [SYSTEM, USER], [1, 2, 3], [4, 5], reward=1.0, policy_version=3),
            _row(1, [SYSTEM, USER, CALL, RESULT], [1, 2, 3, 4, 5, 6, 7], [8], reward=0.0, policy_version=4,
                 terminal=1)]
    out = turns(rows, {"s1": [{"feedback_id": "f"}]}, None)
    assert [(t["prompt_ids"]["start"], t["prompt_ids"]["ids"]) for t in out] == [(0, [1, 2, 3]), (5, [6, 7])]
    assert [t["prompt"]["messages"] for t in out] == [[SYSTEM, USER], [RESULT]]
    assert [t["feedback_records"] for t in out] == [[], [{"feedback_id": "f"}]]
    assert "prompt_token_ids" not in out[0] and out[1]["response_ids"]["ids"] == [8]
    totals = trajectory_totals("t", rows)
    assert (totals["steps"], totals["reward_sum"], totals["policy_versions"], totals["terminal"]) == (
        2, 1.0, [3, 4], True)


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> TokenDecoder:
    folder = tmp_path_factory.mktemp("tok") / "word-model"
    folder.mkdir()
    loaded = load_decoder(build_tokenizer(str(folder / "tokenizer.json")))
    assert loaded is not None
    return loaded


def test_ids_are_decoded_only_with_the_tokenizer_that_made_them(decoder: TokenDecoder) -> None:
    ids = decoder.tokenizer.encode("hi there", add_special_tokens=False).ids
    assert decoder.pieces(ids) == ["hi", "there"]
    mine = token_view(ids, 0, decoder, decoder.identity)
    assert mine["pieces"] == ["hi", "there"]
    # The same file under the model's chat template is still the same tokenizer.
    templated = f"{decoder.identity}+chat_template@sha256:0123"
    assert token_view(ids, 0, decoder, templated)["pieces"] == ["hi", "there"]
    assert token_view(ids, 0, decoder, "other@sha256:0000000000000000")["pieces"] is None
    assert token_view(ids, 0, decoder, None)["pieces"] is None
    assert tokenizer_file_identity("m@sha256:ab+chat_template@sha256:cd") == "m@sha256:ab"


def test_no_tokenizer_setting_means_no_decoder_and_a_bad_one_is_logged_not_raised(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert load_decoder("") is None
    assert load_decoder(str(tmp_path / "missing" / "tokenizer.json")) is None
    assert "decodes no token ids" in caplog.text
