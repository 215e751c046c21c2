"""A prompt group belongs to the source of the first step that named it: a step of another source naming
it joins a group of its own (``<group>@<source>``), never the owner's, in the pool or in the group's
prefix tree; a dead letter saying ``not_owner`` when that group too is another's
(``clawr1.streams.ownership``)."""

from __future__ import annotations

from typing import Any

import orjson

from clawr1.core.routing import home_partition, routable_id
from clawr1.streams import expiry, messages
from clawr1.streams.group_record import GroupRecord
from clawr1.streams.namespaces import Namespace
from clawr1.streams.ownership import group_refusal, own_group
from tests.support.events import whitebox_step
from tests.support.stream_harness import PARTITIONS, Harness, decoded_state


def _rollout(trajectory: str, source: str, group: str, index: int = 0, **fields: Any) -> dict[str, Any]:
    tokens = {"prompt_ids": [1, 2, 3, 4 + index], "response_ids": [len(trajectory), index]}
    record = whitebox_step(routable_id(trajectory, f"{trajectory}/{index}".encode()), trajectory, index,
                           group=(group, 4), **(fields or tokens))
    return {**record, "source_name": source}


def _groups(harness: Harness) -> dict[str, str]:
    """Each published step's trajectory -> its prompt group."""
    return {s["trajectory_id"]: s["prompt_group_id"] for s in harness.steps.values()}


def _merged(harness: Harness, scope: str) -> set[str]:
    """The steps in a prompt group's prefix tree."""
    return {step for row in harness.nodes if row["scope_id"] == scope for step in row["step_ids"]}


def _owner(harness: Harness, group: str) -> str | None:
    data = decoded_state(harness, f"{Namespace.GROUP}/".encode()).get(f"{Namespace.GROUP}/{group}".encode())
    return GroupRecord.from_json(data).owner


def _not_owner(harness: Harness) -> list[dict[str, Any]]:
    return [d for d in harness.dead_letters if d["reason"].startswith("not_owner")]


def test_the_rule() -> None:
    assert own_group("gsm8k-17", "mallory") == "gsm8k-17@mallory"
    reason = group_refusal("s1", "mallory", ("g", "alice"), ("g@mallory", "carol"))
    assert reason.startswith("not_owner:") and "'alice'" in reason and "'carol'" in reason


def test_a_rollout_of_another_source_never_joins_the_group() -> None:
    """The finding: a key added its rollouts to another key's prompt group (its advantages, its merges)."""
    harness = Harness()
    harness.whitebox(_rollout("t-alice-0", "alice", "g-owned"))
    harness.checkpoint()
    harness.whitebox(_rollout("t-mallory-0", "mallory", "g-owned"))
    harness.whitebox(_rollout("t-mallory-1", "mallory", "g-owned"))
    harness.whitebox(_rollout("t-alice-1", "alice", "g-owned"))
    harness.checkpoint()
    assert _groups(harness) == {"t-alice-0": "g-owned", "t-alice-1": "g-owned",
                                "t-mallory-0": "g-owned@mallory", "t-mallory-1": "g-owned@mallory"}
    steps = {s["trajectory_id"]: s["step_id"] for s in harness.steps.values()}
    assert _merged(harness, "g-owned") == {steps["t-alice-0"], steps["t-alice-1"]}
    assert _merged(harness, "g-owned@mallory") == {steps["t-mallory-0"], steps["t-mallory-1"]}
    assert (_owner(harness, "g-owned"), _owner(harness, "g-owned@mallory")) == ("alice", "mallory")
    assert not harness.dead_letters  # nothing lost: the other source trains on a whole group of its own


def test_a_group_of_its_own_already_taken_is_a_dead_letter_keeping_the_step() -> None:
    harness = Harness()
    harness.whitebox(_rollout("t-alice", "alice", "g-taken"))
    harness.whitebox(_rollout("t-carol", "carol", "g-taken@mallory"))  # named on purpose, first
    harness.checkpoint()
    forged = _rollout("t-mallory", "mallory", "g-taken")
    harness.whitebox(forged)
    harness.checkpoint()
    assert _groups(harness) == {"t-alice": "g-taken", "t-carol": "g-taken@mallory"}
    (letter,) = _not_owner(harness)
    assert "'mallory'" in letter["reason"] and "'alice'" in letter["reason"] and "'carol'" in letter["reason"]
    kept = orjson.loads(letter["original_value"])["step"]
    assert (kept["step_id"], kept["prompt_group_id"]) == (forged["step_id"], "g-taken")  # as it came
    assert letter["source_topic"] == harness.config.topics.raw_steps


def test_the_owner_goes_on_in_its_group_at_one_group_write_per_half_ttl() -> None:
    """Steps without token ids merge nothing: naming the group again writes it only to keep it alive."""
    harness = Harness()
    harness.whitebox(_rollout("t-own", "alice", "g-quiet", messages=[{"role": "user", "content": "q"}],
                              text="a"))
    harness.checkpoint()
    part = home_partition("g-quiet", PARTITIONS)
    written = harness.partitions[part][b"G/g-quiet"]
    harness.now_ms += 1_000
    harness.whitebox(_rollout("t-own", "alice", "g-quiet", 1, messages=[{"role": "user", "content": "r"}],
                              text="b"))
    harness.checkpoint()
    assert harness.partitions[part][b"G/g-quiet"] is written  # not rewritten
    harness.now_ms += harness.config.state_ttl_s * 1000 // 2
    harness.whitebox(_rollout("t-own-2", "alice", "g-quiet"))
    harness.checkpoint()
    assert orjson.loads(harness.partitions[part][b"G/g-quiet"])["touched_ms"] == harness.now_ms
    assert set(_groups(harness).values()) == {"g-quiet"}


def test_without_keys_steps_join_as_before_and_leave_no_owner() -> None:
    harness = Harness()
    harness.whitebox(_rollout("t-one", "anonymous", "g-keyless"))
    harness.whitebox(_rollout("t-two", "anonymous", "g-keyless"))
    harness.checkpoint()
    assert set(_groups(harness).values()) == {"g-keyless"} and not harness.dead_letters
    assert _owner(harness, "g-keyless") is None


def test_the_owner_expires_with_the_group_and_a_late_step_names_it_again() -> None:
    """As a trajectory's: the late step's source owns the group's new state, which no prefix tree takes."""
    harness = Harness()
    harness.whitebox(_rollout("t-early", "alice", "g-expiring"))
    harness.checkpoint()
    harness.now_ms += harness.config.state_ttl_s * 1000 + 2 * harness.processor.clock.bucket_ms
    for partition in range(PARTITIONS):
        harness.processor.on_work("", messages.message(expiry.TICK), harness.origin_at(partition))
    harness.checkpoint()
    assert _owner(harness, "g-expiring") is None  # gone with the group
    late = _rollout("t-late", "mallory", "g-expiring")
    harness.whitebox(late)
    harness.checkpoint()
    assert harness.steps[late["step_id"]]["prompt_group_id"] == "g-expiring"
    assert late["step_id"] not in _merged(harness, "g-expiring")
    assert _owner(harness, "g-expiring") == "mallory"
    harness.whitebox(_rollout("t-later", "alice", "g-expiring"))
    harness.checkpoint()
    assert _groups(harness)["t-later"] == "g-expiring@alice"


def test_the_owner_is_kept_and_group_state_without_one_still_reads() -> None:
    record = GroupRecord(scope=None, where={"s": 0}, chunks=1, touched_ms=5, owner="alice")
    assert GroupRecord.from_json(orjson.loads(orjson.dumps(record.to_json()))) == record
    previous: dict[str, Any] = {"scope": None, "where": {}, "chunks": 0, "touched_ms": 5}  # no owner, no "v"
    assert GroupRecord.from_json(previous) == GroupRecord(touched_ms=5)
    harness = Harness()
    part = home_partition("g-old", PARTITIONS)
    harness.partitions[part][b"G/g-old"] = orjson.dumps({**previous, "touched_ms": harness.now_ms})
    harness.whitebox(_rollout("t-after-upgrade", "alice", "g-old"))
    harness.checkpoint()
    assert _owner(harness, "g-old") == "alice" and _groups(harness) == {"t-after-upgrade": "g-old"}
