"""Incremental prefix-tree merge per scope: changed rows, re-delivery, bounds, rebuild."""

from __future__ import annotations

import numpy as np
import pytest

from clawr1.prefix_tree import build_tree
from clawr1.streams import messages
from clawr1.streams.prefix_scope import (
    Bounds,
    ScopeState,
    ScopeStep,
    entry_tokens,
    merge_step,
    rebuild,
    token_entry,
)

BOUNDS = Bounds(max_steps=3, max_tokens=100)


def step(step_id: str, prompt: list[int], response: list[int], parent: str | None = None) -> ScopeStep:
    return ScopeStep("T", "trajectory", step_id, prompt, response, parent, 1_000 + len(prompt))


def test_merging_emits_only_changed_nodes_with_scope_figures() -> None:
    state, tree = ScopeState(), build_tree([])
    first = merge_step(state, tree, step("s1", [1, 2, 3], [4]), BOUNDS)
    assert first.outcome == "added"
    assert [(r["token_ids"].tolist(), r["step_ids"], r["version"]) for r in first.rows] \
        == [([1, 2, 3, 4], ["s1"], 1)]
    second = merge_step(state, tree, step("s2", [1, 2, 3, 4, 5], [6], parent="s1"), BOUNDS)
    rows = {tuple(r["token_ids"]): r for r in second.rows}
    assert set(rows) == {(5, 6)}  # s1's node is unchanged: s2 only hangs below it
    row = rows[(5, 6)]
    assert (row["depth_start"], row["version"], row["total_tokens"], row["tree_tokens"], row["forks"]) == (
        4,
        3,
        10,
        6,
        0,
    )
    assert row["parent_node_id"] == first.rows[0]["node_id"] and row["scope_kind"] == "trajectory"


def test_split_re_emits_the_shortened_node() -> None:
    state, tree = ScopeState(), build_tree([])
    merge_step(state, tree, step("a", [1, 2], [3, 4]), BOUNDS)
    rows = merge_step(state, tree, step("b", [1, 2], [3, 9]), BOUNDS).rows
    assert sorted((r["depth_start"], r["token_ids"].tolist()) for r in rows) \
        == [(0, [1, 2, 3]), (3, [4]), (3, [9])]


def test_redelivery_republishes_the_path_and_a_late_parent_counts() -> None:
    state, tree = ScopeState(), build_tree([])
    merge_step(state, tree, step("s1", [1], [2]), BOUNDS)
    merge_step(state, tree, step("s2", [9], [9]), BOUNDS)
    again = merge_step(state, tree, step("s2", [9], [9]), BOUNDS)
    assert again.outcome == "duplicate" and not again.state_changed
    assert [(r["token_ids"].tolist(), r["version"]) for r in again.rows] == [([9, 9], 2)]
    parent = merge_step(state, tree, step("s2", [9], [9], parent="s1"), BOUNDS)
    assert parent.outcome == "parent" and [(r["version"], r["forks"]) for r in parent.rows] == [(3, 1)]
    with pytest.raises(ValueError):
        merge_step(state, tree, step("s2", [9], [8]), BOUNDS)


def test_full_scope_skips_further_steps() -> None:
    state, tree = ScopeState(), build_tree([])
    for i in range(3):
        assert merge_step(state, tree, step(f"s{i}", [i], [i]), BOUNDS).outcome == "added"
    assert merge_step(state, tree, step("s3", [7], [7]), BOUNDS).outcome == "skipped"
    small = ScopeState()
    assert (
        merge_step(small, build_tree([]), step("big", list(range(99)), [1, 2]), BOUNDS).outcome == "skipped"
    )
    assert (state.skipped, small.skipped, len(state.steps)) == (1, 1, 3)


def test_rebuild_from_state_equals_the_incremental_tree() -> None:
    state, tree = ScopeState(), build_tree([])
    tokens = {"a": ([1, 2], [3]), "b": ([1, 2, 3, 4], [5]), "c": ([1, 7], [8])}
    for step_id, (prompt, response) in tokens.items():
        merge_step(
            state, tree, step(step_id, prompt, response, parent="a" if step_id == "b" else None), BOUNDS
        )
    restored = rebuild(ScopeState.from_json(state.to_json()), lambda step_id, _tree: tokens[step_id])
    assert restored.to_rows("T") == tree.to_rows("T") and restored.forks == tree.forks


def test_rebuild_drops_a_step_whose_tokens_were_lost_so_its_redelivery_merges_it() -> None:
    state, tree = ScopeState(), build_tree([])
    merge_step(state, tree, step("a", [1, 2], [3]), BOUNDS)
    merge_step(state, tree, step("b", [1, 2, 3, 4], [5], parent="a"), BOUNDS)
    stored = {"a": ([1, 2], [3])}  # b's tokens write did not survive the crash, its state write did
    restored_state = ScopeState.from_json(state.to_json())
    restored = rebuild(restored_state, lambda step_id, _tree: stored.get(step_id))
    assert restored_state.steps == ["a"] and "b" not in restored_state.parents and "b" not in restored
    again = merge_step(restored_state, restored, step("b", [1, 2, 3, 4], [5], parent="a"), BOUNDS)
    assert again.outcome == "added" and restored.to_rows("T") == tree.to_rows("T")
    assert restored_state.version == state.version


def test_a_scope_step_message_carries_ids_packed_and_an_older_workers_lists_still_read() -> None:
    sent = ScopeStep("g", "prompt_group", "s1", np.array([0, 7, 2**31 - 1], np.int32), [5, 6], "s0", 9)
    fields = sent.to_message()
    assert isinstance(fields["prompt_ids"], str) and isinstance(fields["response_ids"], str)
    [(key, body)] = messages.unpack(messages.pack([("g", messages.message(messages.SCOPE_STEP, **fields))]))
    got = ScopeStep.from_message({k: v for k, v in body.items() if k != "kind"})
    assert (key, got.prompt_ids.tolist(), got.response_ids.tolist()) == ("g", [0, 7, 2**31 - 1], [5, 6])
    assert (got.scope_id, got.scope_kind, got.step_id, got.parent_step_id, got.updated_at_ms) \
        == ("g", "prompt_group", "s1", "s0", 9)
    older = ScopeStep.from_message({**sent.__dict__, "prompt_ids": [0, 7, 2**31 - 1], "response_ids": [5, 6]})
    assert older.tokens().prompt_ids.tolist() == [0, 7, 2**31 - 1]
    with pytest.raises(ValueError):
        ScopeStep.from_message({**fields, "prompt_ids": "not hex!"})


def test_a_grpo_groups_tokens_are_kept_as_differences_and_rebuild_exactly() -> None:
    """8 rollouts x 4 turns, each turn's prompt the conversation so far: kept whole, every turn repeats
    the conversation and every sibling the task; kept as differences, each token id is stored about once."""
    bounds = Bounds(max_steps=64, max_tokens=1 << 20)
    rng = np.random.default_rng(7)
    task = rng.integers(0, 50_000, 600).tolist()
    state, tree = ScopeState(), build_tree([])
    entries: dict[str, object] = {}
    whole = 0
    for rollout in range(8):
        prompt, parent = list(task), None
        for turn in range(4):
            reply = rng.integers(0, 50_000, 100).tolist()
            scope_step = ScopeStep("G", "prompt_group", f"r{rollout}t{turn}", prompt, reply, parent, 1_000)
            assert merge_step(state, tree, scope_step, bounds).outcome == "added"
            base = parent if parent in tree else state.steps[0]
            entries[scope_step.step_id] = token_entry(tree, scope_step, base)
            whole += len(prompt) + len(reply)
            prompt, parent = prompt + reply + rng.integers(0, 50_000, 50).tolist(), scope_step.step_id
    kept = sum(len(e["p"]) // 8 + len(e["r"]) // 8 if isinstance(e, dict) else len(e[0]) + len(e[1])
               for e in entries.values())  # hex of int32: 8 characters a token
    assert kept < whole / 5
    restored = rebuild(ScopeState.from_json(state.to_json()),
                       lambda step_id, partial: entry_tokens(entries[step_id], partial))  # type: ignore[arg-type]
    assert restored.to_rows("G") == tree.to_rows("G")
    for step_id in state.steps:
        assert restored.rebuild(step_id).tolist() == tree.rebuild(step_id).tolist()
