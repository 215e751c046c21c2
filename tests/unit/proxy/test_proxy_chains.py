"""Responses-API chains: the full prompt of a call continued by previous_response_id, or a note."""

from __future__ import annotations

from clawr1.proxy.chains import UNKNOWN_PARENT_NOTE, ResponseChains


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def reply(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def test_a_chain_is_rebuilt_from_each_calls_own_part_with_this_calls_instructions() -> None:
    chains, notes = ResponseChains(), []
    chains.record({"instructions": "old", "input": "a"}, "r1", reply("A"))
    chains.record({"input": "b", "previous_response_id": "r1"}, "r2", reply("B"))
    prompt = chains.prompt({"instructions": "new", "input": "c", "previous_response_id": "r2"}, notes)
    assert prompt == [{"role": "system", "content": "new"}, user("a"), *reply("A"), user("b"), *reply("B"),
                      user("c")]
    assert notes == ["previous_response_id r2: the prompt holds the chain's 4 earlier messages"]
    assert chains.prompt({"input": "x"}, notes) == [user("x")] and len(notes) == 1


def test_an_unknown_or_evicted_link_flags_the_call_with_its_own_input_only() -> None:
    chains, notes = ResponseChains(max_entries=2), []
    chains.record({"input": "a"}, "r1", reply("A"))
    chains.record({"input": "b", "previous_response_id": "r1"}, "r2", reply("B"))
    chains.record({"input": "z"}, "other", reply("Z"))  # evicts the least recently used: r1
    assert chains.prompt({"input": "c", "previous_response_id": "r2"}, notes) == [user("c")]
    (note,) = notes
    assert note.startswith(f"{UNKNOWN_PARENT_NOTE}: r2")


def test_a_cycle_of_reused_ids_is_unknown_not_a_hang() -> None:
    chains, notes = ResponseChains(), []
    chains.record({"input": "a", "previous_response_id": "r1"}, "r1", reply("A"))
    assert chains.prompt({"input": "b", "previous_response_id": "r1"}, notes) == [user("b")]
    assert notes[0].startswith(UNKNOWN_PARENT_NOTE)
