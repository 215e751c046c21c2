"""Feedback held by target id until the target's trajectory is known, then forwarded."""

from __future__ import annotations

from streams.rewards import feedback_fact
from streams.targets import Forward, TargetState, add_feedback, add_target
from tests.integration.streams.events import feedback

FACT = feedback_fact(feedback("f1", "response", "resp-1", reward=1.0))


def test_feedback_before_its_target_is_held_then_forwarded() -> None:
    state = TargetState()
    assert add_feedback(state, FACT) == (True, [])
    assert add_target(state, "T", "s1") == (True, [Forward("T", "s1", FACT)])


def test_feedback_after_its_target_is_forwarded_at_once() -> None:
    state = TargetState()
    add_target(state, "T", "s1")
    assert add_feedback(state, FACT) == (True, [Forward("T", "s1", FACT)])


def test_redelivery_forwards_again_without_changing_state() -> None:
    state = TargetState()
    add_target(state, "T", "s1")
    add_feedback(state, FACT)
    assert add_feedback(state, FACT) == (False, [Forward("T", "s1", FACT)])
    assert add_target(state, "T", "s1") == (False, [Forward("T", "s1", FACT)])
    assert TargetState.from_json(state.to_json()) == state


def test_a_target_naming_several_steps_gets_all_feedback() -> None:
    state = TargetState()
    add_feedback(state, FACT)
    add_target(state, "T", "s1")
    changed, forwards = add_target(state, "U", "s9")
    assert changed and forwards == [Forward("U", "s9", FACT)]
    other = feedback_fact(feedback("f2", "response", "resp-1", label="x"))
    assert add_feedback(state, other)[1] == [Forward("T", "s1", other), Forward("U", "s9", other)]
