"""The benchmarks' white-box step, which the gateway's fast-path test also checks."""

from __future__ import annotations

from typing import Any

PROMPT_TOKENS, RESPONSE_TOKENS = 512, 128


def make_step(n: int) -> dict[str, Any]:
    """A realistic step: a 512-token prompt, a 128-token response with logprobs."""
    return {
        "trajectory_id": f"bench-{n // 8}", "step_index": n % 8, "prompt_group_id": f"g-{n // 64}",
        "prompt_group_size": 8, "prompt_token_ids": [(n * 7 + i) % 32_000 for i in range(PROMPT_TOKENS)],
        "response_token_ids": [(n * 13 + i) % 32_000 for i in range(RESPONSE_TOKENS)],
        "response_logprobs": [-0.01 * (i % 50) for i in range(RESPONSE_TOKENS)],
        "reward": 1.0, "policy_version": 3, "model": "bench-model", "metadata": {"n": n},
    }
