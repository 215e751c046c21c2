"""Reward functions the compat tests configure as ``CLAWR1_REWARD_FN`` (imported by the API process)."""

from __future__ import annotations

from typing import Any


def tokens_over_turns(prompt_ids: list[int], response_ids: list[int], num_turns: int,
                      extra_fields: dict[str, Any], dataset_fields: dict[str, Any]) -> dict[str, Any]:
    """A score the test can recompute from what it sent, plus extra info echoing the fields."""
    return {"score": len(response_ids) / num_turns, "prompt_tokens": len(prompt_ids),
            "ground_truth": dataset_fields.get("ground_truth"), "extra": extra_fields}
