"""Trajectory linking: a bijection between calls and trajectories, explicit flags where content
cannot decide, retries superseded, canonical matching, durable replays and an age-bounded state."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clawr1.streams.linking import Assignment, LinkState, link_turn, step_ids_of
from clawr1.streams.turns import InvalidEvent, Turn, turn_from_llm_call, turn_from_service_event
from tests.integration.streams.events import assistant, llm_call, service_event, user

SYSTEM = {"role": "system", "content": "be brief"}
TASK = [SYSTEM, user("task")]
HOUR = 3_600_000


def turn(event_id: str, messages: list, replies: list[str], **kw: Any) -> Turn:
    return turn_from_llm_call(llm_call(event_id, messages, replies, **kw))


def link(state: LinkState, t: Turn, horizon: int = 24 * HOUR, bound: int = 4096) -> Assignment:
    """The first step's assignment (single-choice turns have one)."""
    return link_turn(state, t, horizon, bound).assignments[0]


def test_continuation_links_to_the_call_it_extends() -> None:
    state = LinkState()
    a = link(state, turn("c1", TASK, ["a1"]))
    # The agent echoes the reply with cosmetic differences (extra null fields).
    echoed = {"role": "assistant", "content": "a1", "name": None, "tool_calls": []}
    b = link(state, turn("c2", [*TASK, echoed, user("q2")], ["a2"], at=2_000))
    c = link(state, turn("c3", [*TASK, assistant("a1"), user("q2"), assistant("a2"), user("q3")], ["a3"],
                         at=3_000))
    assert a == Assignment("traj-c1", 0, None, "root")
    assert b == Assignment("traj-c1", 1, "c1")
    assert c == Assignment("traj-c1", 2, "c2")


def test_rollouts_with_identical_first_actions_stay_apart() -> None:
    """Four GRPO rollouts answer the task identically; their tool observations then differ."""
    state = LinkState()
    firsts = [link(state, turn(f"r{i}", TASK, ["search"], at=i)) for i in range(4)]
    assert [(a.trajectory_id, a.link_status) for a in firsts] == [(f"traj-r{i}", "root") for i in range(4)]
    seconds = [link(state, turn(f"s{i}", [*TASK, assistant("search"), user(f"obs{i}")], ["done"], at=10 + i))
               for i in range(4)]
    assert sorted(a.trajectory_id for a in seconds) == [f"traj-r{i}" for i in range(4)]
    assert {a.step_index for a in seconds} == {1} and {a.link_status for a in seconds} == {"linked"}


def test_a_continuation_prefers_the_rollout_on_its_client_connection() -> None:
    state = LinkState()
    link(state, turn("r0", TASK, ["go"], connection="c-0"))
    link(state, turn("r1", TASK, ["go"], at=2, connection="c-1"))
    nxt = link(state, turn("n", [*TASK, assistant("go"), user("o")], ["x"], at=3, connection="c-1"))
    assert nxt.trajectory_id == "traj-r1"


def test_a_retry_supersedes_the_earlier_call_and_a_late_one_is_superseded_itself() -> None:
    state = LinkState()
    link(state, turn("p", TASK, ["call tool"]))
    history = [*TASK, assistant("call tool"), user("result")]
    first = link(state, turn("try1", history, ["draft one"], at=2))
    retry = link_turn(state, turn("try2", history, ["draft two"], at=3), 24 * HOUR, 4096)
    assert (first.trajectory_id, first.step_index) == ("traj-p", 1)
    assert retry.assignments[0] == Assignment("traj-p", 1, "p")
    assert retry.superseded == [("try1", "traj-p")]
    went_on = link(state, turn("next", [*history, assistant("draft two"), user("ok")], ["end"], at=4))
    assert went_on == Assignment("traj-p", 2, "try2")
    # A late duplicate of the slot after the trajectory went on is thrown away from the start.
    late = link(state, turn("try3", history, ["draft three"], at=5))
    assert (late.trajectory_id, late.step_index, late.link_status) == ("traj-p", 1, "superseded")


def test_a_retry_on_its_siblings_connection_is_told_from_an_identical_rollout() -> None:
    state = LinkState()
    link(state, turn("a0", TASK, ["go"], connection="conn-a"))
    link(state, turn("b0", TASK, ["go"], at=2, connection="conn-b"))
    history = [*TASK, assistant("go"), user("same observation")]
    link(state, turn("a1", history, ["x"], at=3, connection="conn-a"))
    retry = link_turn(state, turn("a1-again", history, ["y"], at=4, connection="conn-a"), 24 * HOUR, 4096)
    assert retry.assignments[0] == Assignment("traj-a0", 1, "a0") and retry.superseded == [("a1", "traj-a0")]
    # Rollout b's own identical continuation still finds its free step.
    own = link(state, turn("b1", history, ["z"], at=5, connection="conn-b"))
    assert own == Assignment("traj-b0", 1, "b0")


def test_failed_calls_are_never_parents_and_are_superseded_by_their_retry() -> None:
    state = LinkState()
    link(state, turn("ok", TASK, ["a"]))
    history = [*TASK, assistant("a"), user("q2")]
    failed = link(state, turn("bad", history, [], status=500, at=2))
    retry = link_turn(state, turn("retry", history, ["b"], at=3), 24 * HOUR, 4096)
    assert failed == retry.assignments[0] == Assignment("traj-ok", 1, "ok")
    assert retry.superseded == [("bad", "traj-ok")]


def test_reserialized_arguments_and_dropped_thinking_still_link() -> None:
    state = LinkState()
    call = {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": '{"q": "x"}'}}
    reply = [{"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"},
                                               {"type": "text", "text": "looking"}], "tool_calls": [call]}]
    link(state, turn("t1", TASK, ["looking"], reply_messages=[reply]))
    echoed = {"role": "assistant", "content": "looking",
              "tool_calls": [{**call, "function": {"name": "search", "arguments": '{"q":"x"}'}}]}
    nxt = link(state, turn("t2", [*TASK, echoed, {"role": "tool", "tool_call_id": "call_1", "content": "r"}],
                           ["done"], at=2))
    assert nxt == Assignment("traj-t1", 1, "t1")


def test_compacted_context_starts_a_flagged_trajectory_naming_its_candidate() -> None:
    state = LinkState()
    link(state, turn("k1", TASK, ["a"]))
    link(state, turn("k2", [*TASK, assistant("a"), user("o")], ["b"], at=2))
    compacted = link(state, turn("k3", [*TASK, user("summary of the work so far")], ["c"], at=3))
    assert compacted == Assignment("traj-k3", 0, None, "compacted", "k2")


def test_a_turn_extending_a_prompt_but_not_its_reply_is_ambiguous() -> None:
    state = LinkState()
    link(state, turn("e1", TASK, ["a"]))
    link(state, turn("e2", [*TASK, assistant("a"), user("o")], ["b"], at=2))
    edited = link(state, turn("e3", [*TASK, assistant("a"), user("o"), assistant("b (edited)"), user("p")],
                              ["c"], at=3))
    assert edited == Assignment("traj-e3", 0, None, "ambiguous", "e2")


def test_a_branch_of_an_already_continued_step_is_ambiguous() -> None:
    state = LinkState()
    link(state, turn("b1", TASK, ["a"]))
    link(state, turn("b2", [*TASK, assistant("a"), user("first")], ["x"], at=2))
    branch = link(state, turn("b3", [*TASK, assistant("a"), user("second")], ["y"], at=3))
    assert branch == Assignment("traj-b3", 0, None, "ambiguous", "b1")


def test_each_choice_of_n_is_a_rollout_of_one_group_and_continuations_keep_it() -> None:
    state = LinkState()
    prompt = [user("q")]
    first = link_turn(state, turn("n2", prompt, ["left", "right"]), 24 * HOUR, 4096)
    assert step_ids_of(turn("n2", prompt, ["left", "right"])) == ["n2:0", "n2:1"]
    assert first.assignments == [Assignment(f"traj-n2:{i}", 0, None, "root", None, "n2", 2) for i in (0, 1)]
    nxt = link(state, turn("c", [*prompt, assistant("right"), user("more")], ["z"], at=2))
    assert nxt == Assignment("traj-n2:1", 1, "n2:1", "linked", None, "n2", 2)


def test_explicit_trajectory_wins_and_follows_its_latest_step() -> None:
    state = LinkState()
    link(state, turn("x1", [user("q")], ["a"], trajectory_id="T"))
    # A rewritten context (no content link) still continues T, after its latest step.
    second = link(state, turn("x2", [user("summary"), user("q2")], ["b"], trajectory_id="T", at=2))
    assert second == Assignment("T", 1, "x1")
    # Content that extends T's step but names another trajectory does not join T.
    other = link(state, turn("x3", [user("q"), assistant("a"), user("q3")], ["c"], trajectory_id="U", at=3))
    assert other == Assignment("U", 0, None, "root")


def test_explicit_trajectory_makes_a_repeated_first_call_a_retry() -> None:
    state = LinkState()
    link(state, turn("f1", TASK, ["a"], trajectory_id="T"))
    again = link_turn(state, turn("f2", TASK, ["b"], trajectory_id="T", at=2), 24 * HOUR, 4096)
    assert again.assignments[0] == Assignment("T", 0, None, "root") and again.superseded == [("f1", "T")]


def test_replay_after_thousands_of_other_calls_gets_its_first_assignment() -> None:
    state = LinkState()
    first = turn("r1", [user("q")], ["a"], trajectory_id="T")
    original = link_turn(state, first, 24 * HOUR, 4096)
    for i in range(1_000):
        history = [user("q"), assistant("a"), user(f"o{i}")]
        link(state, turn(f"o{i}", history, ["b"], trajectory_id="T", at=i + 2))
    assert link_turn(state, first, 24 * HOUR, 4096) == original


def test_service_turn_with_explicit_index_keeps_it() -> None:
    state = LinkState()
    event = service_event("s5", "svc", {"prompt_messages": [user("q")], "response_text": "a"}, step_index=5)
    service_turn = turn_from_service_event(event)
    assert service_turn is not None
    assert link(state, service_turn) == Assignment("svc", 5, None)


def test_state_expires_by_event_age_and_refuses_older_unknown_events() -> None:
    state = LinkState()
    for i in range(10):
        link(state, turn(f"b{i}", [user(f"q{i}")], ["a"], at=i * HOUR), horizon=3 * HOUR)
    assert set(state.assigned) == set(state.nodes) == {"b6", "b7", "b8", "b9"}
    assert LinkState.from_json(json.loads(json.dumps(state.to_json()))) == state
    with pytest.raises(InvalidEvent, match="older than the linking horizon"):
        link(state, turn("late", [user("q")], ["a"], at=HOUR), horizon=3 * HOUR)


# ---------------------------------------------------------------- property: a bijection up to relabelling

ACTIONS = st.sampled_from(["search", "read", "answer"])
OBSERVATIONS = st.sampled_from(["none", "hit"])


def _history(rollout: list[tuple[str, str]], depth: int) -> list[dict[str, Any]]:
    messages = list(TASK)
    for action, observation in rollout[:depth]:
        messages += [assistant(action), user(observation)]
    return messages


@st.composite
def interleaved_rollouts(draw: st.DrawFn) -> tuple[list[list[tuple[str, str]]], list[int]]:
    """m rollouts of one task, from few actions (so many share their first actions), and an order
    of their calls that keeps each rollout's own order (a call follows its parent's reply)."""
    rollouts = draw(st.lists(st.lists(st.tuples(ACTIONS, OBSERVATIONS), min_size=1, max_size=4),
                             min_size=1, max_size=6))
    slots = [r for r, rollout in enumerate(rollouts) for _ in rollout]
    return rollouts, draw(st.permutations(slots))


@settings(max_examples=300, deadline=None)
@given(interleaved_rollouts())
def test_trajectories_equal_the_rollouts_up_to_relabelling(case: tuple[list[list[tuple[str, str]]], list[int]]
                                                           ) -> None:
    rollouts, order = case
    state = LinkState()
    depth = [0] * len(rollouts)
    steps: dict[str, tuple[Assignment, list[dict[str, Any]], str]] = {}
    for at, r in enumerate(order):
        messages, action = _history(rollouts[r], depth[r]), rollouts[r][depth[r]][0]
        event_id = f"e{at}"
        steps[event_id] = (link(state, turn(event_id, messages, [action], at=at)), messages, action)
        depth[r] += 1
    trajectories: dict[str, list[tuple[Assignment, list[dict[str, Any]], str]]] = {}
    for assignment, messages, action in steps.values():
        assert assignment.link_status == ("root" if assignment.step_index == 0 else "linked")
        trajectories.setdefault(assignment.trajectory_id, []).append((assignment, messages, action))
    produced = []
    for chain in trajectories.values():
        chain.sort(key=lambda s: s[0].step_index)
        assert [s[0].step_index for s in chain] == list(range(len(chain)))  # 0..k, each once
        for (_, before, action), (_, after, _) in zip(chain, chain[1:], strict=False):
            assert after[: len(before) + 1] == [*before, assistant(action)]  # a prefix-extension
        produced.append(json.dumps([*chain[-1][1], assistant(chain[-1][2])]))
    expected = [json.dumps([*_history(r, len(r) - 1), assistant(r[-1][0])]) for r in rollouts]
    assert Counter(produced) == Counter(expected)
