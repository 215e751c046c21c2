"""How feedback facts fold into a reward: sources, provisional vs final, components, labels."""

from __future__ import annotations

import pytest

from clawr1.streams.rewards import distinct_facts, feedback_fact, fold_rewards, human_score, labels_of
from clawr1.streams.turns import InvalidEvent
from tests.support.events import feedback


def fact(feedback_id: str, **kw) -> dict:  # noqa: ANN003 - test shorthand
    return feedback_fact(feedback(feedback_id, "step", "s1", **kw))


def fold(*facts: dict):  # noqa: ANN201
    return fold_rewards(distinct_facts(facts))


def test_no_reward_is_pending() -> None:
    result = fold(fact("f1", label="good"))
    assert (result.value, result.status, result.sources, result.components) == (None, "pending", None, {})


def test_final_replaces_the_same_sources_provisional_in_any_order() -> None:
    provisional = fact("f1", reward=0.2, final=False, at=100)
    final = fact("f2", reward=0.9, final=True, at=200)
    for order in ((provisional, final), (final, provisional)):
        result = fold(*order)
        assert (result.value, result.status, result.sources) == (0.9, "final", "reward_model:rm-a")


def test_sources_add_up_and_all_must_be_final() -> None:
    rm = fact("f1", reward=0.5, components={"correct": 0.5})
    rule = fact(
        "f2",
        reward=None,
        components={"format": 0.1, "correct": 0.2},
        source="rule",
        source_name="",
        final=False,
    )
    result = fold(rm, rule)
    assert result.value == pytest.approx(0.8)
    assert result.components == pytest.approx({"correct": 0.7, "format": 0.1})
    assert (result.sources, result.status) == ("reward_model:rm-a,rule", "pending")


def test_labels_never_override_a_reward() -> None:
    result = fold(fact("f1", reward=1.0, at=100), fact("f2", label="verbose", at=300))
    assert (result.value, result.status) == (1.0, "final")


def test_reused_feedback_id_keeps_the_later_content() -> None:
    early, late = fact("f1", reward=0.1, at=100), fact("f1", reward=0.7, at=200)
    assert distinct_facts([late, early]) == [late]


def test_labels_and_human_score() -> None:
    facts = distinct_facts(
        [
            fact("f1", label="b", source="human", reward=0.3, at=1),
            fact("f2", label="a", source="human", reward=0.6, at=2),
            fact("f3", label="b"),
        ]
    )
    assert labels_of(facts) == ["a", "b"]
    assert human_score(facts) == 0.6


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"target_kind": "session"}, "target_kind must be one of"),
        ({"target_id": ""}, "target_id is empty"),
        ({"feedback_id": ""}, "feedback_id is empty"),
        ({"reward": float("inf")}, "finite"),
        ({"components": {"x": float("nan")}}, "finite"),
    ],
)
def test_invalid_feedback(changes: dict, reason: str) -> None:
    with pytest.raises(InvalidEvent, match=reason):
        feedback_fact({**feedback("f", "step", "s"), **changes})


def test_terminal_is_for_trajectories_and_kept_only_when_set() -> None:
    done = feedback_fact(feedback("t1", "trajectory", "T", terminal=True))
    assert done["terminal"] is True and "terminal" not in fact("f1", reward=1.0)
    with pytest.raises(InvalidEvent, match="terminal marks a trajectory complete"):
        feedback_fact(feedback("f2", "step", "s1", terminal=True))
