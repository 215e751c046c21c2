"""Feedback resolves to exactly one step by target id, or is refused with the candidates named."""

from __future__ import annotations

from clawr1.streams.rewards import feedback_fact
from clawr1.streams.targets import Forward, Refusal, Target, TargetState, add_feedback, add_target
from tests.support.events import feedback

WINDOW = 60_000
FACT = feedback_fact(feedback("f1", "response", "resp-1", reward=1.0, at=100_000))
ORIGIN = {"topic": "raw.feedback", "partition": 0, "offset": 7, "key": None, "value": None, "timestamp_ms": 0}


def target(state: TargetState, step_id: str, trajectory: str, at: int, **kw: bool) -> tuple:
    return add_target(state, "resp-1", step_id, Target(trajectory, at, **kw), WINDOW)


def give(state: TargetState, fact: dict = FACT) -> tuple:
    return add_feedback(state, "resp-1", fact, ORIGIN, WINDOW)


def test_feedback_before_its_target_is_held_then_forwarded() -> None:
    state = TargetState()
    assert give(state) == (True, [], [])
    assert target(state, "s1", "T", 90_000) == (True, [Forward("T", "s1", FACT)], [])


def test_feedback_after_its_target_is_forwarded_at_once() -> None:
    state = TargetState()
    target(state, "s1", "T", 90_000)
    assert give(state) == (True, [Forward("T", "s1", FACT)], [])


def test_redelivery_repeats_the_outcome_without_changing_state() -> None:
    state = TargetState()
    target(state, "s1", "T", 90_000)
    give(state)
    assert give(state) == (False, [Forward("T", "s1", FACT)], [])
    assert target(state, "s1", "T", 90_000) == (False, [Forward("T", "s1", FACT)], [])
    assert TargetState.from_json(state.to_json()) == state


def test_a_reused_engine_id_resolves_by_time_window_or_is_refused_with_candidates() -> None:
    state = TargetState()
    target(state, "old", "T", 1_000)  # an unrelated call long ago drew the same id
    target(state, "new", "U", 95_000)
    assert give(state) == (True, [Forward("U", "new", FACT)], [])
    both_recent = TargetState()
    target(both_recent, "a", "T", 90_000)
    target(both_recent, "b", "U", 95_000)
    changed, forwards, refusals = give(both_recent)
    assert changed and forwards == [] and len(refusals) == 1
    assert refusals[0].origin == ORIGIN
    assert "ambiguous" in refusals[0].reason and "a (trajectory T" in refusals[0].reason
    assert "b (trajectory U" in refusals[0].reason


def test_a_step_arriving_after_resolution_gets_none_of_that_feedback() -> None:
    state = TargetState()
    target(state, "s1", "T", 90_000)
    give(state)
    assert target(state, "s2", "U", 99_000) == (True, [], [])


def test_the_bare_id_of_an_n_call_resolves_to_the_continued_choice() -> None:
    state = TargetState()
    target(state, "c:0", "T:0", 90_000, choice=True)
    target(state, "c:1", "T:1", 90_000, choice=True)
    target(state, "c:1", "T:1", 90_000, choice=True, continued=True)
    assert give(state) == (True, [Forward("T:1", "c:1", FACT)], [])


def test_the_bare_id_of_an_n_call_nobody_continued_is_refused() -> None:
    state = TargetState()
    target(state, "c:0", "T:0", 90_000, choice=True)
    target(state, "c:1", "T:1", 90_000, choice=True)
    _, forwards, refusals = give(state)
    assert forwards == [] and refusals == [Refusal(
        "resp-1 names a call with 2 choices ['c:0', 'c:1'], of which 0 were continued []; "
        "target one step id instead", ORIGIN)]
    assert give(state)[2] == refusals  # a re-delivery repeats the same dead letter
