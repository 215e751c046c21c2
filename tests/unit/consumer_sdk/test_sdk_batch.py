"""StepBatch: Step objects, padded NumPy arrays, tree packing, and the torch guard."""

from __future__ import annotations

import sys

import numpy as np
import pyarrow as pa
import pytest

from clawr1.consumer_sdk import DataError, MissingDependency, StepBatch, UsageError
from clawr1.prefix_tree.packing import dense_mask

TOKENS = pa.list_(pa.uint32())


def make_table(rows: list[dict]) -> pa.Table:
    """A table shaped like the pool's answer (same Arrow types as the steps view)."""
    schema = pa.schema([
        ("step_id", pa.string()),
        ("version", pa.int64()),
        ("trajectory_id", pa.string()),
        ("step_index", pa.int32()),
        ("parent_step_id", pa.string()),
        ("prompt_group_id", pa.string()),
        ("prompt_token_ids", TOKENS),
        ("response_token_ids", TOKENS),
        ("response_logprobs", pa.list_(pa.float64())),
        ("reward", pa.float64()),
        ("policy_version", pa.int64()),
        ("reward_components", pa.map_(pa.string(), pa.float64())),
        ("token_provenance", pa.string()),
    ])
    full = [
        {"version": 1, "step_index": 0, "parent_step_id": None, "prompt_group_id": None,
         "response_logprobs": [], "reward": None, "policy_version": None, "reward_components": [],
         "token_provenance": "engine", **row}
        for row in rows
    ]
    return pa.Table.from_pylist(full, schema=schema)


ROWS = [
    {"step_id": "a", "trajectory_id": "t1", "prompt_group_id": "g", "prompt_token_ids": [5, 6, 7],
     "response_token_ids": [8, 9], "response_logprobs": [-0.5, -0.25], "reward": 1.0, "policy_version": 4,
     "reward_components": [("pass", 1.0)]},
    {"step_id": "b", "trajectory_id": "t2", "prompt_group_id": "g", "prompt_token_ids": [5, 6, 7],
     "response_token_ids": [10], "reward": 0.0},
    {"step_id": "c", "trajectory_id": "t3", "prompt_token_ids": [1], "response_token_ids": [2, 3, 4],
     "response_logprobs": [-1.0, -2.0, -3.0]},
]


def test_steps_carry_tokens_rewards_and_metadata() -> None:
    batch = StepBatch(make_table(ROWS))
    assert len(batch) == 3
    assert batch.step_ids == ("a", "b", "c")
    assert batch.num_tokens == 5 + 4 + 4
    a, b, c = batch
    assert a.prompt_token_ids.tolist() == [5, 6, 7] and a.prompt_token_ids.dtype == np.uint32
    assert a.response_logprobs is not None and a.response_logprobs.tolist() == [-0.5, -0.25]
    assert a.reward == 1.0 and a.policy_version == 4 and a.prompt_group_id == "g"
    assert a.metadata == {"reward_components": {"pass": 1.0}, "token_provenance": "engine"}
    assert b.response_logprobs is None and b.reward == 0.0
    assert c.prompt_group_id is None and c.reward is None
    assert batch[-1].step_id == "c"
    assert [s.step_id for s in batch[:2]] == ["a", "b"]
    assert batch.to_arrow().num_rows == 3


def test_padded_arrays_put_response_after_prompt() -> None:
    padded = StepBatch(make_table(ROWS)).to_numpy(pad_id=0, pad_to_multiple=8)
    assert padded.input_ids.shape == (3, 8) and padded.input_ids.dtype == np.int64
    assert padded.input_ids[0].tolist() == [5, 6, 7, 8, 9, 0, 0, 0]
    assert padded.input_ids[2].tolist() == [1, 2, 3, 4, 0, 0, 0, 0]
    assert padded.attention_mask.sum(axis=1).tolist() == [5, 4, 4]
    assert padded.loss_mask[0].tolist() == [False, False, False, True, True, False, False, False]
    assert padded.loss_mask[1].tolist() == [False, False, False, True, False, False, False, False]
    assert padded.old_logprobs[0, 3:5].tolist() == [-0.5, -0.25]
    assert padded.old_logprobs[1].tolist() == [0.0] * 8
    assert padded.old_logprobs[2, 1:4].tolist() == [-1.0, -2.0, -3.0]
    assert padded.has_logprobs.tolist() == [True, False, True]
    assert padded.rewards[:2].tolist() == [1.0, 0.0] and np.isnan(padded.rewards[2])
    assert padded.group_ids == ("g",) and padded.group_index.tolist() == [0, 0, -1]
    assert padded.prompt_lengths.tolist() == [3, 3, 1] and padded.response_lengths.tolist() == [2, 1, 3]
    assert set(padded.arrays()) >= {"input_ids", "attention_mask", "loss_mask", "old_logprobs", "rewards"}


def test_empty_batch_converts_to_empty_arrays() -> None:
    padded = StepBatch(make_table([])).to_numpy()
    assert padded.input_ids.shape == (0, 0)
    assert padded.step_ids == () and padded.group_ids == ()


def test_logprob_count_mismatch_is_a_data_error() -> None:
    rows = [{**ROWS[0], "response_logprobs": [-0.5]}]
    with pytest.raises(DataError, match="'a' has 1 logprobs for 2 response tokens"):
        StepBatch(make_table(rows)).to_numpy()


def test_bad_padding_multiple_is_refused() -> None:
    with pytest.raises(UsageError):
        StepBatch(make_table(ROWS)).to_numpy(pad_to_multiple=0)


def test_pack_tree_shares_the_group_prompt() -> None:
    batch = StepBatch(make_table(ROWS))
    packed = batch.pack_tree(advantages=[1.0, -1.0, 0.5])
    assert packed.step_ids == ("a", "b", "c")
    assert packed.total_tokens == 13
    assert packed.tree_tokens == 10  # the shared prompt [5, 6, 7] is stored once
    assert packed.labels.tolist() == [8, 9, 10, 2, 3, 4]
    assert packed.target_advantages is not None
    assert packed.target_advantages.tolist() == [1.0, 1.0, -1.0, 0.5, 0.5, 0.5]
    assert packed.target_logprobs is not None
    assert np.isnan(packed.target_logprobs[2]) and packed.target_logprobs[:2].tolist() == [-0.5, -0.25]
    # Each target's predictor sees exactly its own step's prefix.
    mask = dense_mask(packed)
    for pred, target in zip(packed.pred_idx, packed.target_idx, strict=True):
        assert mask[target, pred]


def test_pack_tree_reports_unpackable_steps() -> None:
    rows = [{**ROWS[2], "prompt_token_ids": []}]
    with pytest.raises(DataError, match="prompt_ids is empty"):
        StepBatch(make_table(rows)).pack_tree()


def test_to_torch_without_torch_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # what an environment without torch sees
    with pytest.raises(MissingDependency, match="needs PyTorch"):
        StepBatch(make_table(ROWS)).to_torch()
