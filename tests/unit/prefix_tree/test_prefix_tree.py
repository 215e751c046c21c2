"""Prefix tree and tree packing: exact rebuild, exact token counts, packing invariants.

The property tests draw step sets shaped like agentic data (GRPO siblings, append-only
turn chains, forks from re-tokenization drift, duplicates, one-token responses, steps
that are prefixes of others) over a tiny vocabulary, so that accidental shared prefixes
and branch points are common, and check every claim against a naive computation.
"""

from __future__ import annotations

import importlib.util
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clawr1.prefix_tree import (
    PrefixTree,
    StepTokens,
    build_tree,
    dense_mask,
    flex_mask_mod,
    pack_tree,
    tree_mask_mod,
)

KINDS = ("root", "sibling", "chain", "fork", "duplicate", "prefix", "one_token")


def seq_of(step: StepTokens) -> list[int]:
    return [*step.prompt_ids.tolist(), *step.response_ids.tolist()]


@st.composite
def step_sets(draw: st.DrawFn, max_steps: int = 12) -> list[StepTokens]:
    """Random steps built from earlier ones the way agents and GRPO groups produce them."""
    vocab = draw(st.integers(2, 6))
    tok = st.integers(0, vocab - 1)
    steps: list[StepTokens] = []
    for i in range(draw(st.integers(1, max_steps))):
        kind = draw(st.sampled_from(KINDS)) if steps else "root"
        base = draw(st.sampled_from(steps)) if steps else None
        parent: str | None = None
        if kind == "root" or base is None:
            prompt = draw(st.lists(tok, min_size=1, max_size=10))
            response = draw(st.lists(tok, max_size=8))
        elif kind in ("sibling", "one_token"):
            prompt = base.prompt_ids.tolist()
            size = 1 if kind == "one_token" else draw(st.integers(0, 8))
            response = draw(st.lists(tok, min_size=size, max_size=size))
            parent = base.parent_step_id
        elif kind in ("chain", "fork"):
            prompt = seq_of(base) + draw(st.lists(tok, max_size=5))
            response = draw(st.lists(tok, max_size=6))
            parent = base.step_id
            if kind == "fork":
                # Drift at the turn boundary: one token near the end of the earlier step.
                boundary = len(seq_of(base))
                at = draw(st.integers(max(0, boundary - 2), min(len(prompt), boundary + 1) - 1))
                prompt[at] = (prompt[at] + draw(st.integers(1, vocab - 1))) % vocab
        elif kind == "duplicate":
            prompt, response = base.prompt_ids.tolist(), base.response_ids.tolist()
            parent = base.parent_step_id
        else:  # "prefix": a step that is a prefix of an earlier one
            full = seq_of(base)
            cut = draw(st.integers(1, len(full)))
            split = draw(st.integers(1, cut))
            prompt, response = full[:split], full[split:cut]
        steps.append(StepTokens(f"s{i}", prompt, response, parent))
    return steps


def naive_distinct_prefixes(steps: list[StepTokens]) -> int:
    prefixes = set()
    for s in steps:
        seq = tuple(seq_of(s))
        prefixes.update(seq[:k] for k in range(1, len(seq) + 1))
    return len(prefixes)


def naive_forks(steps: list[StepTokens]) -> list[str]:
    by_id = {s.step_id: s for s in steps}
    out = []
    for s in steps:
        parent = by_id.get(s.parent_step_id) if s.parent_step_id else None
        if parent is not None:
            p, c = seq_of(parent), seq_of(s)
            if c[: len(p)] != p:
                out.append(s.step_id)
    return sorted(out)


# ---------------------------------------------------------------------- tree properties
@settings(max_examples=300, deadline=None)
@given(step_sets())
def test_tree_rebuilds_every_step_and_counts_exactly(steps: list[StepTokens]) -> None:
    tree = build_tree(steps)
    for s in steps:
        assert tree.rebuild(s.step_id).tolist() == seq_of(s)
    assert tree.tree_tokens == naive_distinct_prefixes(steps)
    assert tree.total_tokens == sum(len(seq_of(s)) for s in steps)
    assert tree.fork_step_ids == naive_forks(steps)
    assert tree.forks == len(naive_forks(steps))
    nodes = tree.nodes
    assert len(nodes) == tree.num_nodes
    assert sum(len(n.tokens) for n in nodes) == tree.tree_tokens
    by_id = {n.node_id: n for n in nodes}
    assert len(by_id) == len(nodes)
    for n in nodes:
        assert len(n.tokens) > 0
        parent = by_id.get(n.parent_id) if n.parent_id is not None else None
        assert n.start_depth == (parent.end_depth if parent else 0)
    for s in steps:
        end = by_id[tree.path(s.step_id)[-1]]
        assert s.step_id in end.step_ids
        assert end.end_depth == len(seq_of(s))
    # Node boundaries fall only at step ends and branch points (the canonical radix tree).
    children: dict[int | None, int] = {}
    for n in nodes:
        children[n.parent_id] = children.get(n.parent_id, 0) + 1
    for n in nodes:
        assert n.step_ids or children.get(n.node_id, 0) >= 2


@settings(max_examples=150, deadline=None)
@given(step_sets(), st.randoms(use_true_random=False))
def test_tree_is_independent_of_insertion_order(steps: list[StepTokens], rnd: random.Random) -> None:
    shuffled = steps[:]
    rnd.shuffle(shuffled)
    a, b = build_tree(steps), build_tree(shuffled)
    assert a.tree_tokens == b.tree_tokens
    assert a.fork_step_ids == b.fork_step_ids == naive_forks(steps)  # children before their parents too

    def canon(tree: PrefixTree) -> list[tuple]:
        return [
            (r["node_id"], r["parent_node_id"], r["depth_start"], r["token_ids"], sorted(r["step_ids"]))
            for r in tree.to_rows("scope")
        ]

    assert canon(a) == canon(b)
    for s in steps:
        assert a.path(s.step_id) == b.path(s.step_id)
    pa, pb = pack_tree(steps), pack_tree(shuffled)
    for field in ("input_ids", "position_ids", "tout"):
        assert np.array_equal(getattr(pa, field), getattr(pb, field))


# ---------------------------------------------------------------------- packing properties
def check_packing(steps: list[StepTokens], packed, advantages, logprobs) -> None:
    n = packed.num_tokens
    tout, pos, ids = packed.tout[:n], packed.position_ids[:n], packed.input_ids[:n]
    assert n == packed.tree_tokens == naive_distinct_prefixes(steps)
    # tout describes depth-first subtrees: inside (k, tout[k]) every token is deeper than k,
    # and the token right after the subtree is not.
    for k in range(n):
        assert k < tout[k] <= n
        assert (pos[k + 1 : tout[k]] > pos[k]).all()
        if tout[k] < n:
            assert pos[tout[k]] <= pos[k]
    mask = dense_mask(packed)[:n, :n]
    # Each token sees exactly its ancestors and itself: one token at every depth 0..pos.
    for q in range(n):
        seen = np.flatnonzero(mask[q])
        assert sorted(pos[seen].tolist()) == list(range(pos[q] + 1))
    assert packed.step_ids == tuple(s.step_id for s in steps)
    for i, s in enumerate(steps):
        lo, hi = packed.target_offsets[i], packed.target_offsets[i + 1]
        assert hi - lo == s.response_len
        assert packed.labels[lo:hi].tolist() == s.response_ids.tolist()
        assert (packed.target_step_index[lo:hi] == i).all()
        tgt, pred = packed.target_idx[lo:hi], packed.pred_idx[lo:hi]
        assert ids[tgt].tolist() == s.response_ids.tolist()
        assert pos[tgt].tolist() == list(range(s.prompt_len, s.prompt_len + s.response_len))
        if s.response_len:
            assert ids[pred[0]] == s.prompt_ids[-1]
            assert (pred[1:] == tgt[:-1]).all()
            assert (pos[tgt] == pos[pred] + 1).all()
            # The whole step is visible from its last token and is exactly its sequence.
            path = np.flatnonzero(mask[tgt[-1]])
            assert ids[path].tolist() == seq_of(s)
            # Each predictor is an ancestor of its target.
            assert mask[tgt, pred].all()
        if advantages is not None:
            assert (packed.target_advantages[lo:hi] == np.float32(advantages[i])).all()
        if logprobs is not None:
            got = packed.target_logprobs[lo:hi]
            if logprobs[i] is None:
                assert np.isnan(got).all()
            else:
                assert np.array_equal(got, np.asarray(logprobs[i], dtype=np.float32))


@settings(max_examples=200, deadline=None)
@given(step_sets(), st.sampled_from([None, 1, 8, 16]), st.data())
def test_pack_invariants(steps: list[StepTokens], multiple: int | None, data: st.DataObject) -> None:
    advantages = data.draw(st.lists(st.floats(-3, 3), min_size=len(steps), max_size=len(steps)))
    logprobs = [
        None if data.draw(st.booleans()) else -np.arange(s.response_len, dtype=np.float32) / 7 for s in steps
    ]
    packed = pack_tree(steps, advantages=advantages, logprobs=logprobs, pad_to_multiple=multiple)
    check_packing(steps, packed, advantages, logprobs)
    assert packed.total_tokens == sum(len(seq_of(s)) for s in steps)
    assert packed.forks == len(naive_forks(steps))
    if multiple:
        assert packed.seq_len % multiple == 0
        assert packed.seq_len - packed.num_tokens < multiple
    else:
        assert packed.seq_len == packed.num_tokens
    # The mask_mod gives the dense mask's answers, on plain ints and on broadcast arrays.
    mask = dense_mask(packed)
    mod = tree_mask_mod(packed.tout)
    q = np.arange(packed.seq_len)[:, None]
    k = np.arange(packed.seq_len)[None, :]
    assert np.array_equal(mod(0, 0, q, k), mask)
    for qi in range(0, packed.seq_len, 3):
        for ki in range(packed.seq_len):
            assert bool(mod(0, 0, qi, ki)) == mask[qi, ki]


# ---------------------------------------------------------------------- examples
def test_step_that_is_a_prefix_of_another_splits_the_node() -> None:
    long = StepTokens("long", [1, 2, 3], [4, 5, 6])
    short = StepTokens("short", [1, 2], [3, 4])
    tree = build_tree([long, short])
    assert [len(n.tokens) for n in tree.nodes] == [4, 2]
    assert tree.nodes[0].step_ids == ("short",)
    assert tree.path("long") == [tree.nodes[0].node_id, tree.nodes[1].node_id]
    assert tree.tree_tokens == 6
    assert tree.total_tokens == 10
    assert tree.savings_ratio == pytest.approx(10 / 6)


def test_node_keeps_its_id_when_a_later_step_splits_it() -> None:
    tree = PrefixTree()
    tree.add(StepTokens("a", [5, 6, 7], [8]))
    (only,) = tree.nodes
    tree.add(StepTokens("b", [5, 6], [9]))
    ids = {n.node_id: n for n in tree.nodes}
    assert only.node_id in ids
    assert ids[only.node_id].tokens.tolist() == [7, 8]
    assert ids[only.node_id].start_depth == 2


def test_grpo_group_counts() -> None:
    prompt = np.arange(100, 400)
    rng = np.random.default_rng(0)
    steps = [StepTokens(f"g{i}", prompt, rng.integers(1000, 2000, 50)) for i in range(8)]
    tree = build_tree(steps)
    assert tree.total_tokens == 8 * 350
    assert tree.tree_tokens == 300 + 8 * 50
    assert tree.forks == 0
    summary = tree.summary()
    assert summary["num_steps"] == 8
    assert summary["num_nodes"] == 9
    assert summary["savings_ratio"] == pytest.approx(2800 / 700)


def test_forks_count_drifted_turns_and_late_parents() -> None:
    turn1 = StepTokens("t1", [1, 2, 3], [4, 5])
    turn2 = StepTokens("t2", [1, 2, 3, 4, 5, 6], [7], parent_step_id="t1")
    drift = StepTokens("t3", [1, 2, 3, 4, 9, 6, 7, 8], [2], parent_step_id="t2")
    tree = PrefixTree()
    tree.add(drift)
    assert tree.forks == 0  # the parent has not arrived: nothing to judge yet
    tree.add(turn2)
    tree.add(turn1)
    assert tree.fork_step_ids == ["t3"]
    for s in (turn1, turn2, drift):
        assert tree.rebuild(s.step_id).tolist() == seq_of(s)


@settings(max_examples=150, deadline=None)
@given(step_sets(), st.randoms(use_true_random=False))
def test_forks_follow_parents_named_on_redelivery(steps: list[StepTokens], rnd: random.Random) -> None:
    """A step first merged without its parent (or with another) takes the one a re-delivery names:
    its verdict is judged again, and a parent it waited for under its old name no longer counts."""
    tree = PrefixTree()
    order = steps[:]
    rnd.shuffle(order)
    parents: dict[str, str | None] = {}
    for s in order:
        parents[s.step_id] = rnd.choice([None, *(t.step_id for t in steps)])
        tree.add(StepTokens(s.step_id, s.prompt_ids, s.response_ids, parents[s.step_id]))
    for s in order:
        if s.parent_step_id is not None:
            tree.add(s)
            parents[s.step_id] = s.parent_step_id
    final = [StepTokens(s.step_id, s.prompt_ids, s.response_ids, parents[s.step_id]) for s in steps]
    assert tree.fork_step_ids == naive_forks(final)


def test_redelivery_is_a_no_op_and_conflicts_are_refused() -> None:
    tree = PrefixTree()
    step = StepTokens("a", [1, 2], [3])
    tree.add(step)
    tree.add(StepTokens("a", [1, 2], [3], parent_step_id="p"))
    assert tree.total_tokens == 3
    assert len(tree) == 1
    assert "a" in tree
    with pytest.raises(ValueError, match="other tokens"):
        tree.add(StepTokens("a", [1, 2], [4]))
    with pytest.raises(ValueError, match="other tokens"):
        tree.add(StepTokens("a", [1, 2, 3], [4]))


def test_to_rows_are_plain_values() -> None:
    tree = build_tree([StepTokens("a", [1, 2], [3]), StepTokens("b", [1, 2], [4])])
    rows = tree.to_rows("group-1")
    assert [r["token_ids"] for r in rows] == [[1, 2], [3], [4]]
    assert rows[0]["parent_node_id"] is None
    assert rows[1]["parent_node_id"] == rows[0]["node_id"] == rows[2]["parent_node_id"]
    assert [r["step_ids"] for r in rows] == [[], ["a"], ["b"]]
    assert [r["depth_start"] for r in rows] == [0, 2, 2]
    for r in rows:
        assert r["scope_id"] == "group-1"
        assert type(r["node_id"]) is int and 0 <= r["node_id"] < 2**63
        assert all(type(t) is int for t in r["token_ids"])


def test_nodes_are_read_only_snapshots() -> None:
    tree = build_tree([StepTokens("a", [1, 2], [3])])
    with pytest.raises(ValueError):
        tree.nodes[0].tokens[0] = 7
    assert tree.rebuild("a").tolist() == [1, 2, 3]


def test_step_tokens_validation() -> None:
    with pytest.raises(ValueError, match="empty"):
        StepTokens("a", [], [1])
    with pytest.raises(ValueError, match="negative"):
        StepTokens("a", [1, -1], [1])
    with pytest.raises(ValueError, match="1-D"):
        StepTokens("a", [[1, 2]], [1])
    with pytest.raises(ValueError, match="integer"):
        StepTokens("a", [1.5], [1])
    s = StepTokens("a", np.array([3, 4], dtype=np.int32), [])
    assert s.prompt_ids.dtype == np.int64 and s.response_len == 0 and s.prompt_len == 2
    with pytest.raises(KeyError, match="unknown step"):
        PrefixTree().path("nope")


def test_empty_tree_and_empty_pack() -> None:
    tree = PrefixTree()
    assert (tree.total_tokens, tree.tree_tokens, tree.forks, tree.savings_ratio) == (0, 0, 0, 1.0)
    assert tree.nodes == [] and tree.to_rows("x") == []
    packed = pack_tree([])
    assert packed.seq_len == 0 and packed.num_targets == 0
    assert packed.target_offsets.tolist() == [0]


def test_pack_argument_checks() -> None:
    steps = [StepTokens("a", [1], [2, 3])]
    with pytest.raises(ValueError, match="twice"):
        pack_tree(steps * 2)
    with pytest.raises(ValueError, match="advantages"):
        pack_tree(steps, advantages=[1.0, 2.0])
    with pytest.raises(ValueError, match="logprob arrays"):
        pack_tree(steps, logprobs=[])
    with pytest.raises(ValueError, match="response tokens"):
        pack_tree(steps, logprobs=[[0.1]])
    with pytest.raises(ValueError, match="pad_to_multiple"):
        pack_tree(steps, pad_to_multiple=0)


def test_branch_point_labels_do_not_come_from_shifting() -> None:
    # Two samples of one prompt: the second sample's first token is predicted from the
    # prompt's last token, not from the packed token before it (the first sample's end).
    packed = pack_tree([StepTokens("a", [7, 8], [1, 2]), StepTokens("b", [7, 8], [3, 4])])
    assert packed.input_ids.tolist() == [7, 8, 1, 2, 3, 4]
    assert packed.position_ids.tolist() == [0, 1, 2, 3, 2, 3]
    assert packed.tout.tolist() == [6, 6, 4, 4, 6, 6]
    assert packed.pred_idx.tolist() == [1, 2, 1, 4]
    assert packed.labels.tolist() == [1, 2, 3, 4]
    assert packed.target_step_index.tolist() == [0, 0, 1, 1]
    assert packed.target_logprobs is None and packed.target_advantages is None


def test_padding_attends_only_itself() -> None:
    packed = pack_tree([StepTokens("a", [7, 8], [1])], pad_to_multiple=8, pad_id=99)
    assert packed.seq_len == 8 and packed.num_tokens == 3
    assert packed.input_ids[3:].tolist() == [99] * 5
    mask = dense_mask(packed)
    assert np.array_equal(mask[3:, 3:], np.eye(5, dtype=bool))
    assert not mask[:3, 3:].any() and not mask[3:, :3].any()


def test_flex_mask_mod_matches_dense_mask_or_says_torch_is_needed() -> None:
    """Without torch the factory must say what is missing; with torch it must agree with the dense mask."""
    packed = pack_tree(
        [StepTokens("a", [1, 2, 3], [4, 5]), StepTokens("b", [1, 2, 3], [6]), StepTokens("c", [1, 9], [2])],
        pad_to_multiple=4,
    )
    if importlib.util.find_spec("torch") is None:
        with pytest.raises(ImportError, match="needs torch"):
            flex_mask_mod(packed)
        return
    import torch

    mod = flex_mask_mod(packed)
    q = torch.arange(packed.seq_len)[:, None]
    k = torch.arange(packed.seq_len)[None, :]
    assert np.array_equal(mod(0, 0, q, k).numpy(), dense_mask(packed))


@given(step_sets())
def test_add_reports_exactly_the_nodes_whose_snapshot_changed(steps: list[StepTokens]) -> None:
    """What incremental merges publish: the ids ``add`` returns are the whole-tree diff, in DFS order."""
    tree = PrefixTree()

    def signature() -> dict[int, tuple[object, ...]]:
        return {n.node_id: (n.parent_id, n.start_depth, len(n.tokens), n.step_ids) for n in tree.nodes}

    for step in steps:
        before = signature()
        changed = tree.add(step)
        after = signature()
        assert changed == {i for i, sig in after.items() if before.get(i) != sig}
        expected = [(n.node_id, n.step_ids) for n in tree.nodes if n.node_id in changed]
        assert [(n.node_id, n.step_ids) for n in tree.nodes_by_id(changed)] == expected
        path = set(tree.path(step.step_id))
        in_dfs_order = [n.node_id for n in tree.nodes if n.node_id in path]
        assert [n.node_id for n in tree.nodes_by_id(path)] == in_dfs_order
        assert tree.add(step) == set()  # a re-delivery changes nothing
