"""Step facts from turns and white-box steps: ids, groups, token provenance, failures."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from clawr1.streams.linking import Assignment, LinkState, link_turn
from clawr1.streams.normalize import step_from_whitebox, steps_from_turn
from clawr1.streams.tokenization import Retokenizer, render_prompt, render_response
from clawr1.streams.turns import InvalidEvent, Turn, _token_ids, turn_from_llm_call, turn_from_service_event
from tests.support.events import build_tokenizer, llm_call, service_event, user, whitebox_step

FIRST = [Assignment("T", 0, None)]


def placed(turn: Turn) -> list[Assignment]:
    """Where the linker puts a turn's steps on an empty state (groups of n > 1 choices included)."""
    return link_turn(LinkState(), turn, 3_600_000, 64).assignments


@pytest.fixture(scope="module")
def retokenizer(tmp_path_factory: pytest.TempPathFactory) -> Retokenizer:
    return Retokenizer.load(build_tokenizer(str(tmp_path_factory.mktemp("tok") / "tokenizer.json")))


def test_engine_ids_are_kept_exactly() -> None:
    record = llm_call("e1", [user("hi")], ["hello"], prompt_ids=[7, 8], reply_ids=[[9]], response_id="cmpl-1")
    (fact,) = steps_from_turn(turn_from_llm_call(record), FIRST, None)
    step = fact.step
    assert (step["step_id"], step["trajectory_id"], step["step_index"]) == ("e1", "T", 0)
    assert (step["prompt_token_ids"], step["response_token_ids"]) == ([7, 8], [9])
    assert (step["token_provenance"], step["tokenizer"], step["response_id"]) == ("engine", None, "cmpl-1")
    assert step["prompt_group_id"] is None and step["status"] == "ok" and fact.feedback == []
    assert json.loads(step["prompt_messages"]) == [user("hi")]


def test_choices_become_one_prompt_group() -> None:
    record = llm_call(
        "e2", [user("hi")], ["a", "b", "a"], prompt_ids=[1], reply_ids=[[2], [3], [2]], response_id="cmpl-2"
    )
    turn = turn_from_llm_call(record)
    steps = [f.step for f in steps_from_turn(turn, placed(turn), None)]
    assert [s["step_id"] for s in steps] == ["e2:0", "e2:1", "e2:2"]
    assert [s["trajectory_id"] for s in steps] == ["traj-e2:0", "traj-e2:1", "traj-e2:2"]
    assert {(s["prompt_group_id"], s["prompt_group_size"], s["step_index"]) for s in steps} == {("e2", 3, 0)}
    assert [s["response_id"] for s in steps] == ["cmpl-2:0", "cmpl-2:1", "cmpl-2:2"]
    assert len({s["prompt_id"] for s in steps}) == 1


def test_declared_group_wins_over_choices() -> None:
    record = llm_call("e3", [user("hi")], ["a", "b"], group=("g-7", 8))
    turn = turn_from_llm_call(record)
    steps = [f.step for f in steps_from_turn(turn, placed(turn), None)]
    assert {(s["prompt_group_id"], s["prompt_group_size"]) for s in steps} == {("g-7", 8)}


def test_without_engine_ids_or_tokenizer_there_are_no_ids() -> None:
    (fact,) = steps_from_turn(turn_from_llm_call(llm_call("e4", [user("hi")], ["hello"])), FIRST, None)
    assert (fact.step["prompt_token_ids"], fact.step["response_token_ids"]) == ([], [])
    assert fact.step["token_provenance"] == "none" and fact.step["tokenizer"] is None


def test_retokenized_with_the_template_and_marked(retokenizer: Retokenizer, tmp_path: Path) -> None:
    (fact,) = steps_from_turn(
        turn_from_llm_call(llm_call("e5", [user("hi")], ["hello there"])), FIRST, retokenizer
    )
    step = fact.step
    encode = retokenizer.tokenizer.encode
    assert step["prompt_token_ids"] == encode(render_prompt([user("hi")]), add_special_tokens=False).ids
    assert (
        step["response_token_ids"] == encode(render_response("hello there", []), add_special_tokens=False).ids
    )
    digest = hashlib.sha256(Path(build_tokenizer(str(tmp_path / "tokenizer.json"))).read_bytes()).hexdigest()
    # The name is the tokenizer's folder (tok0, tok1, ... as other tests made theirs first).
    assert step["token_provenance"] == "retokenized" and step["tokenizer"] == retokenizer.identity
    assert retokenizer.identity.endswith(f"@sha256:{digest[:16]}")


def test_partial_engine_ids_are_never_mixed(retokenizer: Retokenizer) -> None:
    record = llm_call("e6", [user("hi")], ["hello"], prompt_ids=[1, 2], reply_ids=[[]])
    (bare,) = steps_from_turn(turn_from_llm_call(record), FIRST, None)
    assert (bare.step["prompt_token_ids"], bare.step["token_provenance"]) == ([], "none")
    (retok,) = steps_from_turn(turn_from_llm_call(record), FIRST, retokenizer)
    assert retok.step["token_provenance"] == "retokenized" and retok.step["prompt_token_ids"] != [1, 2]
    assert "incomplete engine ids not used" in json.loads(retok.step["metadata_json"])["token_check"]


def test_failed_call_is_one_failed_step(retokenizer: Retokenizer) -> None:
    (fact,) = steps_from_turn(
        turn_from_llm_call(llm_call("e7", [user("hi")], [], status=500)), FIRST, retokenizer
    )
    step = fact.step
    assert (step["step_id"], step["status"], step["error"]) == ("e7", "failed", "upstream status 500")
    assert step["token_provenance"] == "none" and step["response_text"] == ""


def test_service_turn_reward_travels_as_inline_feedback() -> None:
    event = service_event(
        "s1",
        "svc",
        {
            "prompt_messages": [user("q")],
            "response_text": "r",
            "reward": 1.0,
            "prompt_token_ids": [4],
            "response_token_ids": [5],
        },
        step_id="svc-step",
    )
    turn = turn_from_service_event(event)
    assert turn is not None
    (fact,) = steps_from_turn(turn, [Assignment("svc", 0, None)], None)
    assert fact.step["step_id"] == "svc-step" and fact.step["source_kind"] == "blackbox_service"
    assert fact.step["token_provenance"] == "engine"
    assert [(f["feedback_id"], f["reward"], f["source"]) for f in fact.feedback] == [
        ("svc-step:inline", 1.0, "service")
    ]


def test_whitebox_step_keeps_its_ids_and_reward() -> None:
    fact = step_from_whitebox(
        whitebox_step(
            "w1",
            "W",
            2,
            prompt_ids=[1, 2],
            response_ids=[3],
            reward=0.25,
            final=False,
            messages=[user("q")],
            text="a",
        ),
        None,
    )
    step = fact.step
    assert (step["step_id"], step["trajectory_id"], step["step_index"], step["parent_step_id"]) == (
        "w1",
        "W",
        2,
        None,
    )
    assert step["token_provenance"] == "engine" and step["source_kind"] == "whitebox_agent"
    assert [(f["reward"], f["final"], f["source"], f["source_name"]) for f in fact.feedback] == [
        (0.25, False, "whitebox", "team-wb")
    ]


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"step_index": -1}, "step_index must be >= 0"),
        ({"prompt_messages": "[oops"}, "prompt_messages is not JSON"),
        ({"metadata_json": "[]"}, "metadata_json must be a JSON object"),
        ({"reward": float("nan")}, "finite"),
    ],
)
def test_bad_whitebox_steps_are_invalid(changes: dict, reason: str) -> None:
    with pytest.raises(InvalidEvent, match=reason):
        step_from_whitebox({**whitebox_step("w1", "W", 0), **changes}, None)


def test_normalizing_is_deterministic(retokenizer: Retokenizer) -> None:
    record = llm_call("e8", [user("hi")], ["a", "b"])
    turn = turn_from_llm_call(record)
    first = steps_from_turn(turn, placed(turn), retokenizer)
    again = steps_from_turn(turn_from_llm_call(record), placed(turn), retokenizer)
    assert [f.to_json() for f in first] == [f.to_json() for f in again]


@pytest.mark.parametrize("bad", [[1, True], [1, -1], [1.0], ["1"], "abc", [None], {"a": 1}])
def test_token_ids_must_be_non_negative_integers(bad: object) -> None:
    with pytest.raises(InvalidEvent, match="non-negative integers"):
        _token_ids(bad, "prompt_token_ids")
    assert _token_ids([0, 5, 2**40], "x") == [0, 5, 2**40] and _token_ids(None, "x") == []
