"""GRPO whole-group delivery over the real pool: only complete prompt groups, never split."""

from __future__ import annotations

import time
from typing import Any

from clawr1.consumer_sdk import PoolConsumer
from tests.support.pool import Pool, step


def grouped(group: str, trajectory: str, index: int, size: int | None = 2, **fields: Any) -> dict[str, Any]:
    fields.setdefault("token_provenance", "engine")
    return step(f"{group}-{trajectory}-{index}", trajectory_id=f"{group}-{trajectory}", step_index=index,
                prompt_group_id=group, prompt_group_size=size, **fields)


def groups_of(batch: Any) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for s in batch:
        out.setdefault(s.prompt_group_id, set()).add(s.step_id)
    return out


def test_only_complete_groups_are_delivered_and_late_completion_counts(pool: Pool, source: str) -> None:
    pool.write(
        # complete: two trajectories, both terminal, contiguous steps, all ready
        grouped("G1", "a", 0), grouped("G1", "a", 1, terminal=True), grouped("G1", "b", 0, terminal=True),
        # one trajectory of two missing
        grouped("G2", "a", 0, terminal=True),
        # a trajectory that has not ended
        grouped("G3", "a", 0, terminal=True), grouped("G3", "b", 0),
        # a step still waiting for its reward
        grouped("G4", "a", 0, terminal=True), grouped("G4", "b", 0, terminal=True, ready=False),
        # a step missing in the middle of a trajectory
        grouped("G5", "a", 0), grouped("G5", "a", 2, terminal=True), grouped("G5", "b", 0, terminal=True),
        # a step outside the consumer's curation
        grouped("G6", "a", 0, terminal=True), grouped("G6", "b", 0, terminal=True, token_provenance="none"),
        # not part of any group
        step("loose", terminal=True),
    )
    with PoolConsumer(source, "grpo", whole_groups=True, token_provenance=["engine", "retokenized"]) as c:
        first = c.poll(max_steps=2)  # a group larger than the budget still comes whole
        assert groups_of(first) == {"G1": {"G1-a-0", "G1-a-1", "G1-b-0"}}
        assert not c.poll()
        c.commit()
        pool.write(grouped("G2", "b", 0, terminal=True), grouped("G3", "b", 1, terminal=True),
                   grouped("G4", "b", 0, version=2, terminal=True, ready=True))
        assert set(groups_of(c.poll(max_steps=100))) == {"G2", "G3", "G4"}
    with PoolConsumer(source, "grpo-all", whole_groups=True) as every:
        assert set(groups_of(every.poll(max_steps=100))) == {"G1", "G2", "G3", "G4", "G6"}


def test_batches_hold_whole_groups_within_budgets(pool: Pool, source: str) -> None:
    for g in range(4):
        pool.write(*(grouped(f"P{g}", t, 0, size=3, terminal=True) for t in "abc"))
    with PoolConsumer(source, "budgeted", whole_groups=True) as c:
        one = c.poll(max_steps=100, max_groups=1)
        assert len(groups_of(one)) == 1 and len(one) == 3
        two = c.poll(max_steps=7)  # 3 + 3 fit, a third group would not
        assert len(groups_of(two)) == 2 and len(two) == 6
        rest = c.poll(max_steps=100, max_tokens=5)  # 15 tokens per group: still one whole group
        assert len(groups_of(rest)) == 1
        assert not c.poll()
        seen = set(groups_of(one)) | set(groups_of(two)) | set(groups_of(rest))
        assert seen == {"P0", "P1", "P2", "P3"}


def test_members_never_split_a_group(pool: Pool, source: str) -> None:
    for g in range(12):
        pool.write(*(grouped(f"M{g}", t, 0, terminal=True) for t in "ab"))
    parts = []
    for member in range(2):
        with PoolConsumer(source, "grpo-split", whole_groups=True, member=member, members=2) as c:
            parts.append(groups_of(c.poll(max_steps=100)))
    assert not set(parts[0]) & set(parts[1])
    assert set(parts[0]) | set(parts[1]) == {f"M{g}" for g in range(12)}
    assert all(len(steps) == 2 for part in parts for steps in part.values())


def inferred(group: str, trajectory: str, index: int, closes_in_s: float, **fields: Any) -> dict[str, Any]:
    """A step of a group the linker inferred (no declared size), closing ``closes_in_s`` from now."""
    closes = int(time.time() * 1000 + closes_in_s * 1000)
    return grouped(group, trajectory, index, size=None, prompt_group_inferred=True,
                   prompt_group_closes_at_ms=closes, **fields)


def test_an_inferred_group_is_whole_once_its_window_closed_and_retries_thrown_away_do_not_count(
        pool: Pool, source: str) -> None:
    pool.write(
        # closed: three rollouts, one with a retry the agent threw away at index 1 (superseded)
        inferred("I1", "a", 0, -60), inferred("I1", "a", 1, -60, terminal=True),
        step("I1-a-1-thrown", trajectory_id="I1-a", step_index=1, prompt_group_id="I1",
             prompt_group_inferred=True, link_status="superseded", ready=False, token_provenance="engine"),
        inferred("I1", "b", 0, -60, terminal=True), inferred("I1", "c", 0, -60, terminal=True),
        # still open: another rollout may join it
        inferred("I2", "a", 0, 600, terminal=True), inferred("I2", "b", 0, 600, terminal=True),
        # a declared group with a thrown-away retry is whole too
        grouped("G", "a", 0, terminal=True), grouped("G", "b", 0, terminal=True),
        step("G-b-0-thrown", trajectory_id="G-b", prompt_group_id="G", prompt_group_size=2,
             link_status="superseded", ready=False, token_provenance="engine"),
    )
    with PoolConsumer(source, "inferred", whole_groups=True) as c:
        assert groups_of(c.poll(max_steps=100)) == {"I1": {"I1-a-0", "I1-a-1", "I1-b-0", "I1-c-0"},
                                                    "G": {"G-a-0", "G-b-0"}}
        assert not c.poll()
    with PoolConsumer(source, "inferred-fetch") as c:  # fetch_batch: every trajectory of a closed group
        assert list(c.fetch_batch(2, timeout=5).step_ids) == ["G-a-0", "G-b-0", "I1-a-0", "I1-a-1", "I1-b-0",
                                                              "I1-c-0"]
        assert not c.fetch_batch(1, timeout=0.3)  # I2 stays open
        assert len(c.fetch_batch(1, n_rollouts=2, timeout=5)) == 2  # asked for a count, it need not close
