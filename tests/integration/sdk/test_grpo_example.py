"""The documented GRPO example runs end to end on its own embedded pool and trains on whole groups."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_grpo_example_demo_trains_on_every_group_once() -> None:
    # Its own process: the example opens its own chDB path, and chDB allows one per process.
    result = subprocess.run(
        [sys.executable, "examples/grpo_trainer_loop.py", "--demo"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["groups"] == 24 and summary["steps"] == 96  # every group delivered whole, exactly once
    assert summary["updates"] == 6
    assert summary["tree_tokens"] < summary["tokens"]  # the shared group prompts are packed once
    assert summary["policy_mass_on_rewarded_tokens"] > 0.55  # the clipped GRPO update moved the policy


def test_grpo_loss_takes_token_ids_from_any_vocabulary() -> None:
    """Real engines' ids exceed the toy policy's vocabulary; the loss must still be computed."""
    sys.path.insert(0, str(REPO / "examples"))
    import numpy as np
    from grpo_trainer_loop import VOCAB, clipped_loss_and_grad

    from clawr1.consumer_sdk import PaddedBatch

    arrays = PaddedBatch(
        input_ids=np.array([[5, 151_000, 200, 7]]),
        attention_mask=np.ones((1, 4), bool),
        loss_mask=np.array([[False, False, True, True]]),
        prompt_lengths=np.array([2]),
        response_lengths=np.array([2]),
        rewards=np.array([1.0]),
        old_logprobs=np.zeros((1, 4)),
        has_logprobs=np.array([False]),
        group_index=np.array([0]),
        group_ids=("g",),
        step_ids=("s",),
    )
    loss, grad = clipped_loss_and_grad(np.zeros(VOCAB), arrays, np.array([1.0]))
    assert np.isfinite(loss) and grad.shape == (VOCAB,)
