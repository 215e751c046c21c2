"""Trajectory linking by conversation continuation, explicit ids, replays and the state bound."""

from __future__ import annotations

from streams.linking import Assignment, LinkState, link_turn, step_ids_of
from streams.turns import turn_from_llm_call, turn_from_service_event
from tests.integration.streams.events import assistant, llm_call, service_event, user

SYSTEM = {"role": "system", "content": "be brief"}


def turn(event_id: str, messages: list, replies: list[str], **kw):  # noqa: ANN201 - test shorthand
    return turn_from_llm_call(llm_call(event_id, messages, replies, **kw))


def test_continuation_links_to_the_call_it_extends() -> None:
    state = LinkState()
    first = [SYSTEM, user("q1")]
    a = link_turn(state, turn("c1", first, ["a1"]), 64)
    # The agent echoes the reply with cosmetic differences (extra null fields).
    echoed = {"role": "assistant", "content": "a1", "name": None, "tool_calls": []}
    b = link_turn(state, turn("c2", [*first, echoed, user("q2")], ["a2"]), 64)
    c = link_turn(
        state, turn("c3", [*first, assistant("a1"), user("q2"), assistant("a2"), user("q3")], ["a3"]), 64
    )
    assert a == Assignment("traj-c1", 0, None)
    assert b == Assignment("traj-c1", 1, "c1")
    assert c == Assignment("traj-c1", 2, "c2")


def test_same_prompt_without_ids_starts_separate_trajectories() -> None:
    state = LinkState()
    prompt = [SYSTEM, user("q")]
    assert link_turn(state, turn("g1", prompt, ["x"]), 64).trajectory_id == "traj-g1"
    assert link_turn(state, turn("g2", prompt, ["y"]), 64).trajectory_id == "traj-g2"


def test_continuation_of_one_choice_links_to_that_choice() -> None:
    state = LinkState()
    prompt = [user("q")]
    link_turn(state, turn("n2", prompt, ["left", "right"]), 64)
    assert step_ids_of(turn("n2", prompt, ["left", "right"])) == ["n2:0", "n2:1"]
    nxt = link_turn(state, turn("c", [*prompt, assistant("right"), user("more")], ["z"]), 64)
    assert nxt == Assignment("traj-n2", 1, "n2:1")


def test_explicit_trajectory_wins_and_follows_its_latest_step() -> None:
    state = LinkState()
    link_turn(state, turn("x1", [user("q")], ["a"], trajectory_id="T"), 64)
    # A rewritten context (no content link) still continues T, after its latest step.
    second = link_turn(state, turn("x2", [user("summary"), user("q2")], ["b"], trajectory_id="T"), 64)
    assert second == Assignment("T", 1, "x1")
    # Content that extends T's step but names another trajectory does not join T.
    other = link_turn(
        state, turn("x3", [user("q"), assistant("a"), user("q3")], ["c"], trajectory_id="U"), 64
    )
    assert other == Assignment("U", 0, None)


def test_replayed_turn_gets_its_first_assignment() -> None:
    state = LinkState()
    first = turn("r1", [user("q")], ["a"], trajectory_id="T")
    link_turn(state, first, 64)
    link_turn(state, turn("r2", [user("q"), assistant("a"), user("q2")], ["b"], trajectory_id="T"), 64)
    # Replaying r1 after r2 must not make it r2's child.
    assert link_turn(state, first, 64) == Assignment("T", 0, None)


def test_failed_calls_are_assigned_but_never_parents() -> None:
    state = LinkState()
    link_turn(state, turn("ok", [user("q")], ["a"]), 64)
    failed = link_turn(state, turn("bad", [user("q"), assistant("a"), user("q2")], [], status=500), 64)
    retry = link_turn(state, turn("retry", [user("q"), assistant("a"), user("q2")], ["b"]), 64)
    assert failed == Assignment("traj-ok", 1, "ok") and retry == Assignment("traj-ok", 1, "ok")


def test_service_turn_with_explicit_index_keeps_it() -> None:
    state = LinkState()
    event = service_event("s5", "svc", {"prompt_messages": [user("q")], "response_text": "a"}, step_index=5)
    service_turn = turn_from_service_event(event)
    assert service_turn is not None
    assert link_turn(state, service_turn, 64) == Assignment("svc", 5, None)


def test_state_is_bounded_and_survives_json() -> None:
    state = LinkState()
    for i in range(10):
        link_turn(state, turn(f"b{i}", [user(f"q{i}")], ["a"], trajectory_id=f"T{i}"), 4)
    assert len(state.links) == len(state.assigned) == len(state.latest) == 4
    assert set(state.assigned) == {"b6", "b7", "b8", "b9"}
    assert LinkState.from_json(state.to_json()) == state
