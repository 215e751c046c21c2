"""A trajectory belongs to the source of its first step: steps of another source never join it, and its
feedback counts only from its owner or a privileged key (``clawr1.streams.ownership``). What is refused
is a dead letter saying ``not_owner``, carrying what was refused."""

from __future__ import annotations

from typing import Any

import orjson

from clawr1.core.routing import routable_id
from clawr1.streams.ownership import counts, may_write
from clawr1.streams.trajectory_record import TrajectoryRecord
from tests.integration.streams.events import feedback, whitebox_step
from tests.unit.streams.test_streams_processor import Harness


def _step(trajectory: str, index: int, source: str, **fields: Any) -> dict[str, Any]:
    record = whitebox_step(routable_id(trajectory, f"{trajectory}/{index}/{source}".encode()), trajectory,
                           index, prompt_ids=[1, 2, 3 + index], response_ids=[7, index], **fields)
    return {**record, "source_name": source}


def _not_owner(harness: Harness) -> list[dict[str, Any]]:
    return [d for d in harness.dead_letters if d["reason"].startswith("not_owner")]


def test_the_rule() -> None:
    assert may_write(None, "mallory") and may_write("alice", "alice")
    assert not may_write("alice", "mallory")
    assert may_write("anonymous", "proxy-1") and may_write("proxy-1", "anonymous")  # keyless, as always
    fact = {"source_name": "mallory"}
    assert not counts("alice", fact) and counts("alice", {**fact, "privileged": True})


def test_a_terminal_step_of_another_source_never_joins_the_trajectory() -> None:
    """The finding: a key extended another key's trajectory with a terminal step and its own metadata."""
    harness = Harness()
    harness.whitebox(_step("t-own", 0, "alice"))
    harness.checkpoint()
    forged = _step("t-own", 1, "mallory", terminal=True)
    harness.whitebox(forged)
    harness.checkpoint()
    assert [s["source_name"] for s in harness.steps.values()] == ["alice"]
    assert not any(s["terminal"] for s in harness.steps.values())
    (letter,) = _not_owner(harness)
    assert "'mallory'" in letter["reason"] and "belongs to source 'alice'" in letter["reason"]
    assert orjson.loads(letter["original_value"])["step"]["step_id"] == forged["step_id"]  # nothing lost
    assert letter["source_topic"] == harness.config.topics.raw_steps
    harness.whitebox(_step("t-own", 1, "alice"))  # the owner goes on as before
    harness.checkpoint()
    assert sorted(s["source_name"] for s in harness.steps.values()) == ["alice", "alice"]


def test_feedback_of_another_source_counts_only_when_privileged() -> None:
    """The finding: a key with no kinds set another key's trajectory reward to -5."""
    harness = Harness()
    first = _step("t-fb", 0, "alice")
    harness.whitebox(first)
    harness.checkpoint()
    harness.feedback(feedback("fb-forged", "trajectory", "t-fb", reward=-5.0, source_name="mallory",
                              privileged=False))
    harness.feedback(feedback("fb-forged-step", "step", first["step_id"], reward=-5.0, source_name="mallory",
                              privileged=False))
    harness.checkpoint()
    step = harness.steps[first["step_id"]]
    assert step["trajectory_reward"] is None and step["reward"] is None
    assert len(_not_owner(harness)) == 2
    harness.feedback(feedback("fb-own", "trajectory", "t-fb", reward=0.5, source_name="alice",
                              privileged=False))
    harness.feedback(feedback("fb-rm", "step", first["step_id"], reward=0.25, source_name="rm-a"))
    harness.checkpoint()
    step = harness.steps[first["step_id"]]
    assert (step["trajectory_reward"], step["reward"]) == (0.5, 0.25)
    assert len(_not_owner(harness)) == 2


def test_feedback_before_the_first_step_waits_for_the_owner() -> None:
    harness = Harness()
    first = _step("t-early", 0, "alice")
    harness.feedback(feedback("fb-forged", "trajectory", "t-early", reward=-5.0, source_name="mallory",
                              privileged=False))
    harness.feedback(feedback("fb-own", "trajectory", "t-early", reward=1.0, source_name="alice",
                              privileged=False))
    harness.feedback(feedback("fb-step", "step", first["step_id"], reward=-5.0, source_name="mallory",
                              privileged=False))
    harness.checkpoint()
    assert not _not_owner(harness)  # no owner yet: nothing to tell
    harness.whitebox(first)
    harness.checkpoint()
    step = harness.steps[first["step_id"]]
    assert (step["trajectory_reward"], step["reward"]) == (1.0, None)
    refused = sorted(orjson.loads(d["original_value"])["feedback_id"] for d in _not_owner(harness))
    assert refused == ["fb-forged", "fb-step"]


def test_without_keys_everyone_writes_as_before() -> None:
    harness = Harness()
    harness.whitebox(_step("t-keyless", 0, "anonymous"))
    harness.whitebox(_step("t-keyless", 1, "host:8080"))  # the keyless proxy's identity
    harness.feedback(feedback("fb", "trajectory", "t-keyless", reward=1.0, source_name="anonymous",
                              privileged=False))
    harness.checkpoint()
    assert len(harness.steps) == 2 and not _not_owner(harness)
    assert {s["trajectory_reward"] for s in harness.steps.values()} == {1.0}


def test_the_owner_is_kept_and_state_without_one_still_reads() -> None:
    record = TrajectoryRecord(owner="alice")
    assert TrajectoryRecord.from_json(record.to_json()).owner == "alice"
    legacy = TrajectoryRecord().to_json()
    assert "owner" not in legacy and TrajectoryRecord.from_json(legacy).owner is None
