"""The documented GRPO example runs end to end on its own embedded pool and trains on whole groups."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_grpo_example_demo_trains_on_every_group_once() -> None:
    # Its own process: the example opens its own chDB path, and chDB allows one per process.
    result = subprocess.run([sys.executable, "examples/grpo_trainer_loop.py", "--demo"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["groups"] == 24 and summary["steps"] == 96  # every group delivered whole, exactly once
    assert summary["updates"] == 6
    assert summary["tree_tokens"] < summary["tokens"]  # the shared group prompts are packed once
    assert summary["policy_mass_on_rewarded_tokens"] > 0.55  # the clipped GRPO update moved the policy
