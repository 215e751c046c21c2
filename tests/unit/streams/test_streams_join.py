"""The reward join: versions, order independence, trajectory rewards, parents found by index."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from clawr1.proxy.record import TRUNCATED_NOTE
from clawr1.streams.join import (
    StepState,
    TrajectoryState,
    apply_feedback,
    apply_step_fact,
    apply_supersede,
    build_step,
    displaced_terminals,
    mergeable,
    scope_of,
)
from clawr1.streams.linking import Assignment
from clawr1.streams.normalize import StepFact, step_from_whitebox, steps_from_turn
from clawr1.streams.readiness import ReadinessRule
from clawr1.streams.rewards import feedback_fact
from clawr1.streams.turns import turn_from_llm_call
from tests.support.events import feedback, llm_call, user, whitebox_step

RULE = ReadinessRule()


class Join:
    """The join agent's dispatch over the pure functions, for one trajectory, without Kafka."""

    def __init__(self) -> None:
        self.trajectory = TrajectoryState()
        self.steps: dict[str, StepState] = {}
        self.emitted: list[dict[str, Any]] = []

    def state(self, step_id: str) -> StepState:
        return self.steps.setdefault(step_id, StepState())

    def emit(self, step_id: str) -> None:
        record = build_step(self.state(step_id), self.trajectory, RULE)
        if record is not None:
            self.emitted.append(record)

    def apply(self, event: tuple[str, Any]) -> None:
        kind, payload = event
        if kind == "step":
            state = self.state(payload.step["step_id"])
            apply_step_fact(state, self.trajectory, payload)
            index = payload.step["step_index"]
            for step_id in [*displaced_terminals(self.trajectory, index), payload.step["step_id"],
                            *self.trajectory.at(index + 1)]:
                self.emit(step_id)
        elif kind == "feedback":
            step_id, fact = payload
            apply_feedback(self.state(step_id).feedback, fact)
            self.emit(step_id)
        elif kind in ("supersede", "unsupersede"):
            apply_supersede(self.state(payload), revive=kind == "unsupersede")
            self.emit(payload)
        else:
            apply_feedback(self.trajectory.feedback, payload)
            for step_id in self.trajectory.step_ids():
                self.emit(step_id)

    def latest(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for record in self.emitted:
            if record["step_id"] not in out or record["version"] >= out[record["step_id"]]["version"]:
                out[record["step_id"]] = record
        return out


def engine_step(step_id: str, index: int, parent: str | None) -> StepFact:
    record = llm_call(step_id, [user(step_id)], ["a"], prompt_ids=[1, 2], reply_ids=[[3]])
    (fact,) = steps_from_turn(turn_from_llm_call(record), [Assignment("T", index, parent)], None)
    return fact


def step_feedback(feedback_id: str, step_id: str, **kw: Any) -> tuple[str, Any]:
    return "feedback", (step_id, feedback_fact(feedback(feedback_id, "step", step_id, **kw)))


def trajectory_feedback(feedback_id: str, **kw: Any) -> tuple[str, Any]:
    return "trajectory", feedback_fact(feedback(feedback_id, "trajectory", "T", **kw))


def test_feedback_before_its_step_is_joined_when_the_step_arrives() -> None:
    join = Join()
    join.apply(step_feedback("f1", "s1", reward=1.0))
    assert join.emitted == []
    join.apply(("step", engine_step("s1", 0, None)))
    (record,) = join.emitted
    assert (record["version"], record["reward"], record["reward_status"], record["ready"]) == (
        2,
        1.0,
        "final",
        True,
    )


def test_each_change_is_a_new_version_and_duplicates_change_nothing() -> None:
    join = Join()
    step = ("step", engine_step("s1", 0, None))
    provisional = step_feedback("f1", "s1", reward=0.2, final=False, at=1)
    for event in (step, provisional, provisional, step, step_feedback("f2", "s1", reward=0.4, at=2)):
        join.apply(event)
    assert [(r["version"], r["reward"], r["reward_status"], r["ready"]) for r in join.emitted] == [
        (1, None, "pending", False),
        (2, 0.2, "pending", False),
        (2, 0.2, "pending", False),
        (2, 0.2, "pending", False),
        (3, 0.4, "final", True),
    ]


def test_trajectory_reward_reaches_every_step_without_changing_step_rewards() -> None:
    join = Join()
    join.apply(("step", engine_step("s1", 0, None)))
    join.apply(("step", engine_step("s2", 1, "s1")))
    join.apply(step_feedback("f1", "s2", reward=0.5))
    join.apply(trajectory_feedback("t1", reward=3.0, label="solved", source="human"))
    latest = join.latest()
    assert (latest["s1"]["reward"], latest["s1"]["trajectory_reward"]) == (None, 3.0)
    assert (latest["s2"]["reward"], latest["s2"]["trajectory_reward"]) == (0.5, 3.0)
    assert (
        latest["s1"]["quality_labels"] == ["solved"] and latest["s1"]["trajectory_reward_status"] == "final"
    )
    # Ready by the default rule's trajectory outcome; only s2 has a final reward of its own.
    assert latest["s1"]["ready"] and latest["s2"]["ready"]
    step_rewards_only = ReadinessRule.parse("tokens,final_reward")
    assert not step_rewards_only.is_ready(latest["s1"]) and step_rewards_only.is_ready(latest["s2"])


def test_a_superseded_step_gets_no_trajectory_reward_and_is_never_ready() -> None:
    join = Join()
    join.apply(("step", engine_step("s1", 0, None)))
    join.apply(step_feedback("f1", "s1", reward=1.0))
    join.apply(trajectory_feedback("t1", reward=3.0))
    before = join.latest()["s1"]
    assert before["ready"] and before["trajectory_reward"] == 3.0 and before["link_status"] == "linked"
    state = join.state("s1")
    assert apply_supersede(state) and not apply_supersede(state)  # once
    after = build_step(state, join.trajectory, RULE)
    assert after is not None and after["version"] == before["version"] + 1
    assert (after["link_status"], after["ready"], after["reward"]) == ("superseded", False, 1.0)
    assert (after["trajectory_reward"], after["trajectory_reward_status"]) == (None, "pending")


def test_a_revived_step_stands_again_whichever_decision_arrives_first() -> None:
    records = []
    for decisions in (["supersede", "unsupersede"], ["unsupersede", "supersede"]):
        join = Join()
        join.apply(("step", engine_step("s1", 0, None)))
        join.apply(trajectory_feedback("t1", reward=3.0))
        for kind in decisions:
            join.apply((kind, "s1"))
        join.apply((decisions[0], "s1"))  # a redelivery changes nothing
        versions = [r["version"] for r in join.emitted]
        assert versions == sorted(versions) and len(set(versions)) == 4
        records.append(join.latest()["s1"])
    assert records[0] == records[1]
    revived = records[0]
    assert (revived["link_status"], revived["ready"], revived["trajectory_reward"]) == ("linked", True, 3.0)


def test_parent_found_by_index_when_the_source_gave_none() -> None:
    join = Join()
    join.apply(("step", StepFact(step_from_whitebox(whitebox_step("w2", "T", 2), None).step)))
    join.apply(("step", StepFact(step_from_whitebox(whitebox_step("w1", "T", 1), None).step)))
    latest = join.latest()
    assert latest["w2"]["parent_step_id"] == "w1" and latest["w1"]["parent_step_id"] is None


def test_readiness_rule_is_configurable() -> None:
    join = Join()
    join.apply(("step", engine_step("s1", 0, None)))
    join.apply(trajectory_feedback("t1", reward=1.0))
    record = join.latest()["s1"]
    assert not ReadinessRule.parse("tokens,final_reward").is_ready(record)
    assert ReadinessRule.parse("engine_tokens,final_trajectory_reward").is_ready(record)
    assert ReadinessRule.parse("").is_ready({**record, "token_provenance": "none"})
    assert not ReadinessRule.parse("").is_ready({**record, "status": "failed"})


def _captured_step(step_id: str, **change: Any) -> StepFact:
    record = llm_call(step_id, [user(step_id)], ["no"], prompt_ids=[1, 2], reply_ids=[[3]])
    record["choices"][0].update(change.pop("choice", {}))
    (fact,) = steps_from_turn(turn_from_llm_call({**record, **change}), [Assignment("T", 0, None)], None)
    return fact


def test_a_refusal_is_training_data_a_cut_or_failed_call_never_is() -> None:
    facts = {"refused": _captured_step("s1", choice={"finish_reason": "refusal"}),
             "truncated": _captured_step("s2", capture_notes=[f"{TRUNCATED_NOTE}: no [DONE]"]),
             "failed": _captured_step("s3", error="client abort")}
    for status, fact in facts.items():
        join = Join()
        join.apply(("step", fact))
        join.apply(step_feedback("f", fact.step["step_id"], reward=0.0))
        record = join.latest()[fact.step["step_id"]]
        assert record["status"] == status
        trainable = status == "refused"
        assert (RULE.is_ready(record), ReadinessRule.parse("").is_ready(record)) == (trainable, trainable)
        assert mergeable(record) == (trainable and bool(record["prompt_token_ids"]))


def test_terminal_trajectory_feedback_marks_the_highest_index_step_whenever_it_arrives() -> None:
    join = Join()
    join.apply(("step", engine_step("s1", 0, None)))
    join.apply(trajectory_feedback("t1", reward=2.0, terminal=True, source="complete_trajectory"))
    assert join.latest()["s1"]["terminal"]  # the only step known so far
    join.apply(("step", engine_step("s2", 1, "s1")))  # delivered after the completion: it is the last
    latest = join.latest()
    assert (latest["s1"]["terminal"], latest["s2"]["terminal"]) == (False, True)
    assert latest["s1"]["version"] > [r for r in join.emitted if r["step_id"] == "s1"][0]["version"]
    assert [s["trajectory_reward"] for s in latest.values()] == [2.0, 2.0]
    join.apply(("step", engine_step("s2", 1, "s1")))  # a re-delivery publishes the displaced step again
    assert join.emitted[-2]["step_id"] == "s1" and not join.emitted[-2]["terminal"]


def test_without_terminal_feedback_no_step_is_made_terminal() -> None:
    join = Join()
    join.apply(("step", engine_step("s1", 0, None)))
    join.apply(trajectory_feedback("t1", reward=2.0))
    assert not join.latest()["s1"]["terminal"] and displaced_terminals(join.trajectory, 0) == []


def test_scope_is_the_group_else_the_trajectory() -> None:
    record = {"prompt_group_id": None, "trajectory_id": "T"}
    assert scope_of(record) == ("T", "trajectory")
    assert scope_of({**record, "prompt_group_id": "g"}) == ("g", "prompt_group")


EVENTS = [
    ("step", engine_step("s1", 0, None)),
    (
        "step",
        StepFact(
            step_from_whitebox(whitebox_step("w1", "T", 1, reward=0.1, final=False), None).step,
            step_from_whitebox(whitebox_step("w1", "T", 1, reward=0.1, final=False), None).feedback,
        ),
    ),
    ("step", engine_step("s2", 2, None)),
    step_feedback("f1", "s1", reward=0.2, final=False, at=1),
    step_feedback("f2", "s1", reward=0.9, at=2),
    step_feedback("f3", "w1", reward=0.5, source="rule", source_name="fmt"),
    step_feedback("f4", "s2", label="long", source="human", comment="too long", correction="shorter"),
    trajectory_feedback("t1", reward=1.0, final=False, at=1),
    trajectory_feedback("t2", reward=2.0, at=2),
    trajectory_feedback("t3", terminal=True, source="complete_trajectory", at=3),
    ("supersede", "w1"),
    ("supersede", "s2"),
    ("unsupersede", "s2"),  # the linker revisited: s2 was continued after all
]


@settings(max_examples=60, deadline=None)
@given(order=st.permutations(EVENTS + EVENTS[:3]))
def test_final_records_do_not_depend_on_arrival_order(order: list[tuple[str, Any]]) -> None:
    reference, shuffled = Join(), Join()
    for event in EVENTS:
        reference.apply(event)
    for event in order:
        shuffled.apply(event)
    assert shuffled.latest() == reference.latest()
    seen: dict[tuple[str, int], dict[str, Any]] = {}
    for record in shuffled.emitted:  # equal versions of a step always carry equal content
        assert seen.setdefault((record["step_id"], record["version"]), record) == record


def test_default_readiness_takes_a_final_step_or_trajectory_outcome() -> None:
    """Dense step rewards and sparse trajectory outcomes both make a step trainable by default."""
    rule = ReadinessRule()
    base = {"status": "ok", "link_status": "linked", "prompt_token_ids": [1], "response_token_ids": [2],
            "token_provenance": "engine", "reward": None, "reward_status": "pending",
            "trajectory_reward": None, "trajectory_reward_status": "pending"}
    assert not rule.is_ready(base)
    assert rule.is_ready({**base, "reward": 1.0, "reward_status": "final"})
    assert rule.is_ready({**base, "trajectory_reward": 0.5, "trajectory_reward_status": "final"})
    assert not rule.is_ready({**base, "trajectory_reward": 0.5})
    assert not rule.is_ready({**base, "reward": 1.0, "reward_status": "final", "link_status": "superseded"})
