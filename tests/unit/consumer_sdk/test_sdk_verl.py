"""``StepBatch.to_verl``: veRL's rollout layout, checked row by row against its conventions."""

from __future__ import annotations

import json
import sys

import numpy as np
import pyarrow as pa
import pytest

from clawr1.consumer_sdk import DataError, MissingDependency, StepBatch

TOKENS = pa.list_(pa.uint32())
SCHEMA = pa.schema([
    ("step_id", pa.string()), ("version", pa.int64()), ("trajectory_id", pa.string()),
    ("step_index", pa.int32()), ("parent_step_id", pa.string()), ("prompt_group_id", pa.string()),
    ("prompt_token_ids", TOKENS), ("response_token_ids", TOKENS),
    ("response_logprobs", pa.list_(pa.float64())),
    ("reward", pa.float64()), ("policy_version", pa.int64()), ("trajectory_reward", pa.float64()),
    ("terminal", pa.uint8()), ("metadata_json", pa.string()),
])


def batch_of(rows: list[dict]) -> StepBatch:
    defaults = {"version": 1, "step_index": 0, "parent_step_id": None, "prompt_group_id": None,
                "response_logprobs": [], "reward": None, "policy_version": None, "trajectory_reward": None,
                "terminal": 1, "metadata_json": "{}"}
    return StepBatch(pa.Table.from_pylist([{**defaults, **row} for row in rows], schema=SCHEMA))


ROWS = [
    # a two-step trajectory: step reward 0.25 on the first, trajectory reward 1.0 on the terminal one
    {"step_id": "a0", "trajectory_id": "ta", "prompt_group_id": "g1", "prompt_token_ids": [11, 12],
     "response_token_ids": [13, 14, 15], "response_logprobs": [-0.1, -0.2, -0.3], "reward": 0.25,
     "terminal": 0, "metadata_json": json.dumps({"ground_truth": "42", "data_source": "gsm8k"})},
    {"step_id": "a1", "trajectory_id": "ta", "step_index": 1, "prompt_group_id": "g1",
     "prompt_token_ids": [11, 12, 13, 14, 15, 16], "response_token_ids": [17], "response_logprobs": [-0.4],
     "trajectory_reward": 1.0, "metadata_json": json.dumps({"ground_truth": "42", "uid": "shadowed"})},
    {"step_id": "b0", "trajectory_id": "tb", "prompt_token_ids": [21], "response_token_ids": [22, 23],
     "response_logprobs": [-0.5, -0.6], "reward": -1.0},
]


def reference_row(prompt: list[int], response: list[int], p_width: int, r_width: int, pad: int) -> dict:
    """One row the way the seed trainer's backend builds it: a tokenizer's left pad for the prompt,
    right pad for the response, and veRL's compute_position_id_with_mask."""
    left, right = p_width - len(prompt), r_width - len(response)
    prompts = [pad] * left + prompt
    responses = response + [pad] * right
    mask = [0] * left + [1] * len(prompt) + [1] * len(response) + [0] * right
    positions, seen = [], 0
    for m in mask:
        seen += m
        positions.append(max(seen - 1, 0))
    return {"prompts": prompts, "responses": responses, "input_ids": prompts + responses,
            "attention_mask": mask, "position_ids": positions,
            "response_mask": [1] * len(response) + [0] * right}


def test_numpy_layout_matches_verl_conventions_row_by_row() -> None:
    out = batch_of(ROWS).to_verl(pad_id=0, as_dataproto=False)
    assert out["prompts"].shape == (3, 6) and out["responses"].shape == (3, 3)
    for i, row in enumerate(ROWS):
        want = reference_row(row["prompt_token_ids"], row["response_token_ids"], 6, 3, 0)
        for key, values in want.items():
            assert out[key][i].tolist() == values, (key, i)
    for key in ("prompts", "responses", "input_ids", "attention_mask", "position_ids", "response_mask"):
        assert out[key].dtype == np.int64, key
    assert out["input_ids"].shape == out["attention_mask"].shape == out["position_ids"].shape == (3, 9)


def test_scores_sit_on_the_last_response_token_and_sum_to_the_trajectory_outcome() -> None:
    out = batch_of(ROWS).to_verl(as_dataproto=False)
    scores = out["token_level_scores"]
    assert scores.dtype == np.float32
    assert scores.tolist() == [[0, 0, 0.25], [1.0, 0, 0], [0, -1.0, 0]]
    assert np.array_equal(out["rm_scores"], scores)
    assert scores[:2].sum() == pytest.approx(1.25)  # trajectory ta: its step reward plus its outcome


def test_rollout_log_probs_are_right_padded_and_all_or_nothing() -> None:
    out = batch_of(ROWS).to_verl(as_dataproto=False)
    assert out["rollout_log_probs"].dtype == np.float32
    want = np.array([[-0.1, -0.2, -0.3], [-0.4, 0, 0], [-0.5, -0.6, 0]], dtype=np.float32)
    assert np.array_equal(out["rollout_log_probs"], want)
    partial = batch_of([*ROWS, {"step_id": "c0", "trajectory_id": "tc", "prompt_token_ids": [1],
                                "response_token_ids": [2]}]).to_verl(as_dataproto=False)
    assert "rollout_log_probs" not in partial


def test_non_tensor_batch_carries_uids_and_metadata() -> None:
    out = batch_of(ROWS).to_verl(as_dataproto=False, meta_info={"global_steps": 7})
    nt = out["non_tensor_batch"]
    assert nt["uid"].tolist() == ["g1", "g1", "tb"]  # GRPO groups by uid; a lone step is its own group
    assert nt["prompt_uids"].tolist() == ["g1", "g1", None]
    assert nt["trajectory_uids"].tolist() == ["ta", "ta", "tb"]
    assert nt["step_indices"].tolist() == [0, 1, 0] and nt["step_indices"].dtype == np.int32
    assert nt["step_ids"].tolist() == ["a0", "a1", "b0"]
    assert nt["ground_truth"].tolist() == ["42", "42", None]
    assert nt["data_source"].tolist() == ["gsm8k", None, None]
    assert all(array.dtype == object for key, array in nt.items() if key != "step_indices")
    assert out["meta_info"] == {"global_steps": 7}


def test_fixed_lengths_pad_further_and_refuse_to_truncate() -> None:
    out = batch_of(ROWS).to_verl(pad_id=99, prompt_length=8, response_length=4, as_dataproto=False)
    assert out["prompts"][2].tolist() == [99] * 7 + [21]
    assert out["responses"][2].tolist() == [22, 23, 99, 99]
    assert out["position_ids"][2].tolist() == [0] * 8 + [1, 2, 2, 2]
    with pytest.raises(DataError, match="a1.*6 prompt tokens, more than prompt_length=5"):
        batch_of(ROWS).to_verl(prompt_length=5, as_dataproto=False)


def test_without_verl_the_default_is_the_numpy_dict_and_asking_for_dataproto_is_clear(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "verl", None)  # as on a trainer without verl: import fails
    out = batch_of(ROWS).to_verl()
    assert isinstance(out, dict) and "non_tensor_batch" in out
    with pytest.raises(MissingDependency, match="verl"):
        batch_of(ROWS).to_verl(as_dataproto=True)


def test_an_empty_batch_has_every_key() -> None:
    out = batch_of([]).to_verl(as_dataproto=False)
    assert out["prompts"].shape == (0, 0) and out["token_level_scores"].shape == (0, 0)
    assert out["non_tensor_batch"]["uid"].shape == (0,)
