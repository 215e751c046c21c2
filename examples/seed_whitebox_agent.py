"""A white-box agent written for the seed Claw-R1 gateway, unchanged, against the compat port.

The seed's pattern (``claw_r1/agent_flow``): the agent holds token ids itself.

1. ``POST /generate`` with the token-id context gives the engine's reply ids and logprobs (here
   exactly the engine's ids: nothing is re-encoded from text);
2. the environment appends its observation ids and the agent generates again;
3. ``POST /compute_reward`` scores the episode with the stack's reward function;
4. ``POST /submit_steps?channel=train`` stores every step (``is_last`` on the final one).

Run against a stack with an upstream engine, e.g. ``clawr1 up --demo`` then
``python examples/seed_whitebox_agent.py --gateway http://127.0.0.1:8100``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import httpx


def run_episode(gateway: str, prompt_ids: list[int], *, trajectory_uid: str, prompt_uid: str,
                observation_ids: list[int], turns: int = 2, policy_version: int = 0, channel: str = "train",
                dataset_fields: dict[str, Any] | None = None,
                api_key: str | None = None) -> list[dict[str, Any]]:
    """Generate ``turns`` steps, score the last one, submit them all; returns the submitted steps."""
    auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    steps: list[dict[str, Any]] = []
    context = list(prompt_ids)
    with httpx.Client(base_url=gateway, headers=auth, timeout=120) as http:
        for index in range(turns):
            sampling = {"temperature": 1.0, "max_tokens": 24, "logprobs": True}
            reply = http.post("/generate", json={"prompt_ids": context, "sampling_params": sampling})
            reply.raise_for_status()
            generated = reply.json()
            steps.append({
                "prompt_ids": context, "response_ids": generated["token_ids"],
                "rollout_log_probs": generated["log_probs"], "trajectory_uid": trajectory_uid,
                "prompt_uid": prompt_uid, "step_index": index, "policy_version": policy_version,
                "is_last": index == turns - 1, "metadata": {"stop_reason": generated["stop_reason"]},
            })
            context = context + generated["token_ids"] + observation_ids

        scored = http.post("/compute_reward", json={
            "prompt_ids": steps[-1]["prompt_ids"], "response_ids": steps[-1]["response_ids"],
            "num_turns": turns, "dataset_fields": dataset_fields or {},
        })
        scored.raise_for_status()
        steps[-1]["reward"] = scored.json()["reward_score"]
        http.post("/submit_steps", params={"channel": channel}, json={"steps": steps}).raise_for_status()
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--gateway", default="http://127.0.0.1:8100", help="the compat port's URL")
    parser.add_argument("--api-key", default=None)
    args = parser.parse_args()
    steps = run_episode(args.gateway, [256, 260, *b"count to three", 258, 261], trajectory_uid="wb-demo",
                        prompt_uid="count", observation_ids=[258, 262, *b"ok", 258, 261],
                        api_key=args.api_key)
    print(json.dumps([{k: s[k] for k in ("step_index", "response_ids", "reward") if k in s} for s in steps]))


if __name__ == "__main__":
    main()
