"""A white-box agent that holds its own token ids and submits its rollouts to Claw-R1.

Runs a toy GRPO-style rollout (no model needed: token ids and logprobs are made up), sends every
step through the gateway in batches, then reports a final reward per trajectory as feedback.

    .venv/bin/python examples/whitebox_agent.py --api http://127.0.0.1:8000 [--api-key KEY]
"""

from __future__ import annotations

import argparse
import random
import uuid

from clawr1.gateway.client import GatewayClient


def rollout(group_id: str, group_size: int, turns: int, rng: random.Random) -> list[dict[str, object]]:
    """One trajectory: each turn's prompt is the previous prompt + response + a new user turn."""
    trajectory_id = f"traj-{uuid.uuid4().hex[:12]}"
    prompt = [1, *(rng.randrange(100, 32_000) for _ in range(12))]
    steps: list[dict[str, object]] = []
    for index in range(turns):
        response = [rng.randrange(100, 32_000) for _ in range(rng.randrange(4, 16))] + [2]
        steps.append({
            "trajectory_id": trajectory_id,
            "step_index": index,
            "prompt_group_id": group_id,
            "prompt_group_size": group_size,
            "prompt_token_ids": prompt,
            "response_token_ids": response,
            "response_logprobs": [round(-rng.random() * 3, 4) for _ in response],
            "policy_version": 1,
            "model": "toy-policy",
            "agent": "examples/whitebox_agent",
            "terminal": index == turns - 1,
            "metadata": {"env": "toy-math"},
        })
        prompt = prompt + response + [rng.randrange(100, 32_000) for _ in range(6)]
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api", required=True, help="gateway URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--api-key", default=None, help="a key from CLAWR1_API_KEYS, when keys are set")
    parser.add_argument("--group-size", type=int, default=4, help="samples of the same prompt (GRPO group)")
    parser.add_argument("--turns", type=int, default=3, help="steps per trajectory")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    rng = random.Random(args.seed)
    group_id = f"group-{uuid.uuid4().hex[:8]}"
    trajectories = [rollout(group_id, args.group_size, args.turns, rng) for _ in range(args.group_size)]
    with GatewayClient(args.api, args.api_key, batch_size=50) as client:
        for steps in trajectories:
            step_ids = client.submit_steps(steps)
            reward = float(rng.random() > 0.5)
            client.submit_feedback({"trajectory_id": steps[0]["trajectory_id"], "reward": reward,
                                    "source": "rule", "label": "solved" if reward else "unsolved"})
            print(f"{steps[0]['trajectory_id']}: {len(step_ids)} steps, reward {reward} "
                  f"(last step {step_ids[-1]})")
        print(f"group {group_id}: {sum(len(t) for t in trajectories)} steps accepted")


if __name__ == "__main__":
    main()
