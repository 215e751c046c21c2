"""Trajectory linking: a bijection between calls and trajectories, explicit flags where content
cannot decide, retries superseded, canonical matching, durable replays and an age-bounded state."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clawr1.streams.linking import Assignment, Linked, LinkState, link_turn, step_ids_of
from clawr1.streams.turns import InvalidEvent, Turn, turn_from_llm_call, turn_from_service_event
from tests.support.events import assistant, llm_call, service_event, user

SYSTEM = {"role": "system", "content": "be brief"}
TASK = [SYSTEM, user("task")]
HOUR = 3_600_000


def turn(event_id: str, messages: list, replies: list[str], **kw: Any) -> Turn:
    return turn_from_llm_call(llm_call(event_id, messages, replies, **kw))


def linked(state: LinkState, t: Turn, horizon: int = 24 * HOUR, bound: int = 4096, window: int = 0
           ) -> Linked:
    """What linking decided; without inferred prompt groups unless a window is given."""
    return link_turn(state, t, horizon, bound, window)


def link(state: LinkState, t: Turn, horizon: int = 24 * HOUR, bound: int = 4096, window: int = 0
         ) -> Assignment:
    """The first step's assignment (single-choice turns have one)."""
    return linked(state, t, horizon, bound, window).assignments[0]


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


def test_a_continuation_prefers_the_newest_identical_step_then_its_client_connection() -> None:
    """An identical step left by a rollout that ended long ago (the prompt's previous epoch) is not the
    one a call made now goes on from; among steps of one time, the one on the call's connection."""
    state = LinkState()
    link(state, turn("old", TASK, ["go"], at=1, connection="c-1"))
    link(state, turn("r0", TASK, ["go"], at=600_000, connection="c-0"))
    link(state, turn("r1", TASK, ["go"], at=600_000, connection="c-1"))
    nxt = link(state, turn("n", [*TASK, assistant("go"), user("o")], ["x"], at=600_010, connection="c-1"))
    assert nxt.trajectory_id == "traj-r1"
    other = link(state, turn("m", [*TASK, assistant("go"), user("o")], ["x"], at=600_020, connection="c-1"))
    assert other.trajectory_id == "traj-r0"


def test_a_retry_supersedes_the_earlier_call_and_a_late_one_is_superseded_itself() -> None:
    state = LinkState()
    link(state, turn("p", TASK, ["call tool"]))
    history = [*TASK, assistant("call tool"), user("result")]
    first = link(state, turn("try1", history, ["draft one"], at=2))
    retry = linked(state, turn("try2", history, ["draft two"], at=3))
    assert (first.trajectory_id, first.step_index) == ("traj-p", 1)
    assert retry.assignments[0] == Assignment("traj-p", 1, "p")
    assert retry.superseded == [("try1", "traj-p")]
    went_on = link(state, turn("next", [*history, assistant("draft two"), user("ok")], ["end"], at=4))
    assert went_on == Assignment("traj-p", 2, "try2")
    # A late duplicate of the slot after the trajectory went on is thrown away from the start.
    late = link(state, turn("try3", history, ["draft three"], at=5))
    assert (late.trajectory_id, late.step_index, late.link_status) == ("traj-p", 1, "superseded")


def test_one_shared_connection_never_makes_a_retry_while_an_identical_step_waits() -> None:
    """The issue's shared AsyncOpenAI client: four rollouts' identical calls reuse one connection in any
    order. Each takes a waiting identical step; none is taken for a retry of another, none superseded."""
    state = LinkState()
    roots = [link(state, turn(f"r{i}", TASK, ["search"], at=i, connection=f"c{i}")) for i in range(4)]
    history = [*TASK, assistant("search"), user("same result")]
    seconds = [linked(state, turn(f"s{i}", history, [f"answer {i}"], at=10 + i, connection="c0"))
               for i in (2, 0, 3, 1)]
    assert all(not d.superseded and d.assignments[0].link_status == "linked" for d in seconds)
    assert sorted(d.assignments[0].trajectory_id for d in seconds) == sorted(a.trajectory_id for a in roots)
    thirds = [link(state, turn(f"t{i}", [*history, assistant(f"answer {i}"), user("go on")], ["done"],
                                at=20 + i, connection="c0")) for i in range(4)]
    by_trajectory = {d.assignments[0].trajectory_id: f"s{i}"
                     for i, d in zip((2, 0, 3, 1), seconds, strict=True)}
    assert [(a.parent_step_id, a.step_index) for a in thirds] == [(f"s{i}", 2) for i in range(4)]
    assert {by_trajectory[a.trajectory_id] for a in thirds} == {f"s{i}" for i in range(4)}
    assert not any(n.superseded for n in state.nodes.values())


def test_identical_choices_of_one_call_are_each_continued_once() -> None:
    state = LinkState()
    first = linked(state, turn("n", TASK, ["same", "same"], connection="c"))
    history = [*TASK, assistant("same"), user("next")]
    nexts = [link(state, turn(f"k{i}", history, ["x"], at=1 + i, connection="c")) for i in range(2)]
    assert sorted(a.trajectory_id for a in nexts) == sorted(a.trajectory_id for a in first.assignments)
    assert {a.link_status for a in nexts} == {"linked"}


def test_a_retry_while_an_identical_step_waits_is_settled_by_counting() -> None:
    """Rollout a asks again (same prompt, same connection) while rollout b's identical step waits: the
    repeat takes b's step (nothing says it is a retry yet). b's own call then finds two slots still
    waiting, cannot tell whose retry it is, and is flagged. Once both rollouts went on, the one answer
    nobody continued is superseded; no continued step ever is."""
    state = LinkState()
    link(state, turn("a0", TASK, ["go"], at=2, connection="conn-a"))
    link(state, turn("b0", TASK, ["go"], at=1, connection="conn-b"))
    history = [*TASK, assistant("go"), user("same observation")]
    a1 = link(state, turn("a1", history, ["x"], at=3, connection="conn-a"))
    assert a1 == Assignment("traj-a0", 1, "a0")
    again = linked(state, turn("a1-again", history, ["y"], at=4, connection="conn-a"))
    assert again.assignments[0] == Assignment("traj-b0", 1, "b0") and again.superseded == []
    own = linked(state, turn("b1", history, ["z"], at=5, connection="conn-b"))
    assert own.assignments[0] == Assignment("traj-b1", 0, None, "ambiguous", "a0") and own.superseded == []
    a2 = linked(state, turn("a2", [*history, assistant("y"), user("more")], ["end"], at=6))
    assert a2.assignments[0] == Assignment("traj-b0", 2, "a1-again") and a2.superseded == []
    b2 = linked(state, turn("b2", [*history, assistant("z"), user("more")], ["end"], at=7))
    assert b2.assignments[0] == Assignment("traj-b1", 1, "b1") and b2.superseded == [("a1", "traj-a0")]
    assert [s for s, n in state.nodes.items() if n.superseded] == ["a1"]


def test_a_superseded_step_continued_later_is_revived_and_its_slot_mate_superseded() -> None:
    state = LinkState()
    link(state, turn("p", TASK, ["call tool"]))
    history = [*TASK, assistant("call tool"), user("result")]
    link(state, turn("x1", history, ["first draft"], at=2))
    retry = linked(state, turn("x2", history, ["second draft"], at=3))
    assert retry.assignments[0] == Assignment("traj-p", 1, "p") and retry.superseded == [("x1", "traj-p")]
    # The agent went on with the first draft after all: that decision is revisited.
    back = linked(state, turn("next", [*history, assistant("first draft"), user("ok")], ["end"], at=4))
    assert back.assignments[0] == Assignment("traj-p", 2, "x1")
    assert back.unsuperseded == [("x1", "traj-p")] and back.superseded == [("x2", "traj-p")]
    assert Linked.from_json(json.loads(json.dumps(back.to_json()))) == back
    # A slot that went on is never revived again: continuing the other draft is a branch, flagged.
    fork = link(state, turn("fork", [*history, assistant("second draft"), user("ok")], ["end"], at=5))
    assert fork.link_status == "ambiguous" and state.nodes["x2"].superseded


def test_a_failed_call_leaves_its_slot_open_for_the_retry() -> None:
    state = LinkState()
    failed_root = link(state, turn("f", TASK, [], status=500))
    retried = linked(state, turn("f-again", TASK, ["a"], at=2))
    assert retried.assignments[0] == Assignment(failed_root.trajectory_id, 0, None, "root")
    assert retried.superseded == [("f", failed_root.trajectory_id)]
    assert link(state, turn("other", TASK, ["a"], at=3)).trajectory_id == "traj-other"  # another rollout
    # Deeper: the retry goes to the step whose continuation failed, not to the identical one waiting.
    history = [*TASK, assistant("a"), user("o")]
    link(state, turn("g", history, [], status=503, at=4, connection="c"))
    retry = linked(state, turn("g-again", history, ["b"], at=5, connection="c"))
    assert retry.superseded == [("g", retry.assignments[0].trajectory_id)]


def test_failed_calls_are_never_parents_and_are_superseded_by_their_retry() -> None:
    state = LinkState()
    link(state, turn("ok", TASK, ["a"]))
    history = [*TASK, assistant("a"), user("q2")]
    failed = link(state, turn("bad", history, [], status=500, at=2))
    retry = linked(state, turn("retry", history, ["b"], at=3))
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
    first = linked(state, turn("n2", prompt, ["left", "right"]))
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
    again = linked(state, turn("f2", TASK, ["b"], trajectory_id="T", at=2))
    assert again.assignments[0] == Assignment("T", 0, None, "root") and again.superseded == [("f1", "T")]


def test_replay_after_thousands_of_other_calls_gets_its_first_assignment() -> None:
    state = LinkState()
    first = turn("r1", [user("q")], ["a"], trajectory_id="T")
    original = linked(state, first)
    for i in range(1_000):
        history = [user("q"), assistant("a"), user(f"o{i}")]
        link(state, turn(f"o{i}", history, ["b"], trajectory_id="T", at=i + 2))
    assert linked(state, first) == original


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


def test_state_beyond_its_count_bound_keeps_the_newest_entries() -> None:
    state = LinkState()
    for i in range(10):
        link(state, turn(f"b{i}", [user(f"q{i}")], ["a"], at=i * 1_000), bound=3)
    assert set(state.assigned) == set(state.nodes) == {"b7", "b8", "b9"}
    link(state, turn("b10", [user("q10")], ["a"], at=10_000), bound=5)  # a higher bound drops nothing
    assert set(state.nodes) == {"b7", "b8", "b9", "b10"}


def test_first_calls_with_one_prompt_form_an_inferred_group_within_its_window() -> None:
    state = LinkState()
    tool = [{"type": "function", "function": {"name": "search", "parameters": {}}}]

    def first(event_id: str, at: int, **kw: Any) -> Assignment:
        return link(state, turn(event_id, TASK, ["a"], at=at, **kw), window=1_000)

    rollouts = [first("g0", 0), first("g1", 400), first("g2", 1_000)]
    assert {(a.prompt_group_id, a.prompt_group_size, a.prompt_group_inferred, a.prompt_group_closes_at_ms)
            for a in rollouts} == {("g0", None, True, 1_000)}
    assert first("late", 1_001).prompt_group_id == "late"  # the window closed: the next run's group
    assert first("later", 1_500).prompt_group_id == "late"
    assert first("other-model", 500, model="m2").prompt_group_id == "other-model"
    assert first("with-tools", 500, tools=tool).prompt_group_id == "with-tools"
    assert first("val", 500, channel="val").prompt_group_id == "val"
    # Hints win; a failed first call starts no rollout; n > 1 is a group of its own.
    hinted = first("hinted", 600, group=("G", 4))
    assert (hinted.prompt_group_id, hinted.prompt_group_size, hinted.prompt_group_inferred) == ("G", 4, False)
    assert first("failed", 600, status=500).prompt_group_id is None
    assert first("explicit", 600, trajectory_id="T").prompt_group_id is None
    choices = link_turn(state, turn("n2", TASK, ["a", "b"], at=600), 24 * HOUR, 4096, 1_000)
    assert {(a.prompt_group_id, a.prompt_group_size) for a in choices.assignments} == {("n2", 2)}
    # A continuation keeps its rollout's inferred group; no window, no inference.
    nxt = link(state, turn("g0-next", [*TASK, assistant("a"), user("o")], ["b"], at=2_000), window=1_000)
    parent = state.nodes[nxt.parent_step_id or ""]
    assert (nxt.prompt_group_id, nxt.prompt_group_inferred, nxt.prompt_group_closes_at_ms) == (
        parent.group_id, True, parent.group_closes_at_ms) and parent.group_id is not None
    assert link(LinkState(), turn("off", TASK, ["a"]), window=0).prompt_group_id is None


# ---------------------------------------------------------------- property: a bijection up to relabelling

ACTIONS = st.sampled_from(["search", "read", "answer"])
OBSERVATIONS = st.sampled_from(["none", "hit"])
# How a call's client connection relates to its rollout: one shared keep-alive connection; a shared
# sync client, whose connection the openai SDK drops after each streamed call; an async client's pool,
# lent to whichever rollout calls next; a connection per call; one per rollout; none recorded.
CONNECTIONS = ("shared", "after_stream", "pooled", "per_call", "per_rollout", "none")
Rollout = list[tuple[str, str, str | None]]  # (action, observation, how the call was first tried)


def _history(rollout: Rollout, depth: int) -> list[dict[str, Any]]:
    messages = list(TASK)
    for action, observation, _ in rollout[:depth]:
        messages += [assistant(action), user(observation)]
    return messages


@st.composite
def interleaved_rollouts(draw: st.DrawFn, retries: bool = False
                         ) -> tuple[list[Rollout], list[int], list[str]]:
    """m rollouts of one task, from few actions (so many share their first actions), an order of their
    calls that keeps each rollout's own order (a call follows its parent's reply), and each call's client
    connection under a drawn pattern. With ``retries`` a call may first be tried and failed (the client
    retried it) or answered and thrown away (the agent asked again; not on a first call, where it cannot
    be told from another rollout)."""
    kinds = st.sampled_from([None, None, "failed", "thrown"] if retries else [None])
    rollouts = draw(st.lists(st.lists(st.tuples(ACTIONS, OBSERVATIONS, kinds), min_size=1, max_size=4),
                             min_size=1, max_size=6))
    for rollout in rollouts:
        if rollout[0][2] == "thrown":
            rollout[0] = (*rollout[0][:2], None)
    slots = [r for r, rollout in enumerate(rollouts) for call in rollout for _ in range(1 + bool(call[2]))]
    order = draw(st.permutations(slots))
    pattern = draw(st.sampled_from(CONNECTIONS))
    if pattern == "after_stream":
        streamed = draw(st.lists(st.booleans(), min_size=len(order), max_size=len(order)))
        drops = [sum(streamed[:i]) for i in range(len(order))]
        connections = [f"c{d}" for d in drops]
    elif pattern == "pooled":
        pool = st.lists(st.integers(0, 2), min_size=len(order), max_size=len(order))
        connections = [f"c{i}" for i in draw(pool)]
    else:
        connections = [{"shared": "c", "per_call": f"c{i}", "per_rollout": f"r{r}", "none": ""}[pattern]
                       for i, r in enumerate(order)]
    return rollouts, order, connections


def _replay(case: tuple[list[Rollout], list[int], list[str]]) -> tuple[LinkState, dict[str, tuple[Any, ...]]]:
    """Link every call of the case; per step: (assignment, messages, reply, rollout, depth, how tried)."""
    rollouts, order, connections = case
    calls = [[(depth, tried) for depth, (_, _, kind) in enumerate(rollout) for tried in ([kind, None] if kind
             else [None])] for rollout in rollouts]
    cursor = [0] * len(rollouts)
    state = LinkState()
    steps: dict[str, tuple[Any, ...]] = {}
    for at, (r, connection) in enumerate(zip(order, connections, strict=True)):
        depth, tried = calls[r][cursor[r]]
        cursor[r] += 1
        action = rollouts[r][depth][0]
        messages = _history(rollouts[r], depth)
        reply = [] if tried == "failed" else [f"{action} (thrown away)" if tried == "thrown" else action]
        event_id = f"e{at}"
        status = 500 if tried == "failed" else 200
        assignment = link(state, turn(event_id, messages, reply, at=at, status=status, connection=connection))
        steps[event_id] = (assignment, messages, reply[0] if reply else None, r, depth, tried)
    return state, steps


@settings(max_examples=300, deadline=None)
@given(interleaved_rollouts())
def test_trajectories_equal_the_rollouts_up_to_relabelling(case: tuple[list[Rollout], list[int], list[str]]
                                                           ) -> None:
    rollouts = case[0]
    state, steps = _replay(case)
    trajectories: dict[str, list[tuple[Assignment, list[dict[str, Any]], str]]] = {}
    for assignment, messages, action, *_ in steps.values():
        assert assignment.link_status == ("root" if assignment.step_index == 0 else "linked")
        trajectories.setdefault(assignment.trajectory_id, []).append((assignment, messages, action))
    assert not any(n.superseded for n in state.nodes.values())
    produced = []
    for chain in trajectories.values():
        chain.sort(key=lambda s: s[0].step_index)
        assert [s[0].step_index for s in chain] == list(range(len(chain)))  # 0..k, each once
        for (_, before, action), (_, after, _) in zip(chain, chain[1:], strict=False):
            assert after[: len(before) + 1] == [*before, assistant(action)]  # a prefix-extension
        produced.append(json.dumps([*chain[-1][1], assistant(chain[-1][2])]))
    expected = [json.dumps([*_history(r, len(r) - 1), assistant(r[-1][0])]) for r in rollouts]
    assert Counter(produced) == Counter(expected)


@settings(max_examples=300, deadline=None)
@given(interleaved_rollouts(retries=True))
def test_retries_are_superseded_or_flagged_and_continued_steps_never_are(
        case: tuple[list[Rollout], list[int], list[str]]) -> None:
    """With failed tries and thrown-away answers on any connection pattern: no step a rollout went on
    from is superseded, every failed try is, each trajectory is one chain of prefix-extensions with one
    live step per index. A thrown-away answer stands only where content cannot tell it from a rollout's
    step: beside a flagged (ambiguous) call that could have followed its parent, or after a state some
    rollout ended at (indistinguishable from that rollout having gone on)."""
    rollouts = case[0]
    state, steps = _replay(case)
    ended = {state.nodes[s].tail for s, (*_, r, depth, tried) in steps.items()
             if tried is None and depth == len(rollouts[r]) - 1}

    def hangs_off(step_id: str) -> str:
        node = state.nodes[step_id]
        return node.extra_of or (state.nodes[node.parent_step_id].tail if node.parent_step_id else "")

    # Tails a flagged step hangs off: a branch names the step it may follow, a retry the sibling it may be.
    flagged = {t for a, *_ in steps.values() if a.link_status == "ambiguous" and a.candidate_step_id
               for t in (state.nodes[a.candidate_step_id].tail, hangs_off(a.candidate_step_id))}
    live: dict[str, dict[int, str]] = {}
    for step_id, (assignment, _, _, r, depth, tried) in steps.items():
        node = state.nodes[step_id]
        went_on = tried is None and depth < len(rollouts[r]) - 1
        assert not (went_on and node.superseded), f"{step_id} was continued but is superseded"
        assert node.superseded or tried != "failed", f"the failed try {step_id} was retried but stands"
        if tried == "thrown" and not node.superseded:
            assert assignment.link_status == "ambiguous" or hangs_off(step_id) in flagged | ended, \
                f"the thrown-away {step_id} stands unflagged"
        if not node.superseded:
            chain = live.setdefault(node.trajectory_id, {})
            assert node.step_index not in chain, f"two live steps at {node.slot}"
            chain[node.step_index] = step_id
    for chain in live.values():
        assert sorted(chain) == list(range(len(chain)))
        ordered = [steps[chain[i]] for i in range(len(chain))]
        for before, after in zip(ordered, ordered[1:], strict=False):
            assert after[1][: len(before[1]) + 1] == [*before[1], assistant(before[2])]
