"""A GRPO-style trainer loop fed by the Claw-R1 consumer SDK (NumPy only, no GPU, no torch).

What it shows, end to end:

1. ``PoolConsumer(..., whole_groups=True)`` hands over complete prompt groups (every sample of a
   prompt present, terminal and rewarded), curated to final rewards and engine-exact tokens;
2. ``batch.to_numpy()`` gives padded ids, masks, rewards and the behaviour policy's logprobs;
3. group-normalized advantages ``(r - mean_group) / (std_group + eps)`` feed a PPO-clipped loss;
4. ``batch.pack_tree()`` shows how many tokens a tree-packed forward pass would compute instead;
5. ``report_policy_version`` + ``commit`` after each update: a crash redelivers only the groups
   whose update was lost.

The "policy" is a unigram softmax over the vocabulary, so the gradient fits in two lines; a real
trainer swaps in its model and keeps the loop as it is.

Run against a running stack:   python examples/grpo_trainer_loop.py --source http://127.0.0.1:8000
Run standalone (seeds a temporary embedded pool with synthetic groups):
                               python examples/grpo_trainer_loop.py --demo
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from clawr1.consumer_sdk import PaddedBatch, PoolConsumer

VOCAB = 32
CLIP = 0.2
LEARNING_RATE = 4.0


def group_advantages(rewards: np.ndarray, group_index: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """GRPO advantages: each reward standardized within its prompt group (ungrouped steps get 0)."""
    advantages = np.zeros_like(rewards, dtype=np.float64)
    for g in np.unique(group_index[group_index >= 0]):
        members = group_index == g
        r = rewards[members].astype(np.float64)
        advantages[members] = (r - r.mean()) / (r.std() + eps)
    return advantages


def clipped_loss_and_grad(
    theta: np.ndarray, arrays: PaddedBatch, advantages: np.ndarray
) -> tuple[float, np.ndarray]:
    """PPO-clipped surrogate over response tokens, and its gradient for a unigram softmax policy."""
    log_probs = theta - np.logaddexp.reduce(theta)
    # The toy policy has VOCAB outputs: real token ids (any vocabulary) fold into them.
    tokens = arrays.input_ids[arrays.loss_mask] % len(theta)
    new_lp = log_probs[tokens]
    old_lp = np.where(np.repeat(arrays.has_logprobs, arrays.response_lengths),
                      arrays.old_logprobs[arrays.loss_mask], new_lp)
    adv = np.repeat(advantages, arrays.response_lengths)
    ratio = np.exp(new_lp - old_lp)
    unclipped, clipped = ratio * adv, np.clip(ratio, 1 - CLIP, 1 + CLIP) * adv
    loss = -float(np.minimum(unclipped, clipped).mean())
    # d(surrogate)/d(new_lp) is ratio * adv where the unclipped branch is the minimum, else 0.
    dlp = np.where(unclipped <= clipped, ratio * adv, 0.0) / len(tokens)
    probs = np.exp(log_probs)
    grad = -(np.bincount(tokens, weights=dlp, minlength=len(theta)) - dlp.sum() * probs)
    return loss, grad


def train(source: str, group: str, iterations: int, max_steps: int, idle_timeout: float) -> dict[str, float]:
    theta = np.zeros(VOCAB)
    version = 0
    totals = {"updates": 0, "steps": 0, "groups": 0, "tokens": 0, "tree_tokens": 0}
    curation = {"reward_status": "final", "token_provenance": "engine"}
    with PoolConsumer(source, group, whole_groups=True, **curation) as consumer:
        consumer.report_policy_version(version)
        for _ in range(iterations):
            batch = consumer.poll(max_steps=max_steps, timeout=idle_timeout)
            if not batch:
                break
            arrays = batch.to_numpy()
            advantages = group_advantages(arrays.rewards, arrays.group_index)
            loss, grad = clipped_loss_and_grad(theta, arrays, advantages)
            theta -= LEARNING_RATE * grad
            packed = batch.pack_tree(advantages=advantages)
            version += 1
            consumer.report_policy_version(version)
            consumer.commit(batch)
            totals["updates"] += 1
            totals["steps"] += len(batch)
            totals["groups"] += len(arrays.group_ids)
            totals["tokens"] += packed.total_tokens
            totals["tree_tokens"] += packed.tree_tokens
            print(f"update {version}: {len(arrays.group_ids)} groups, {len(batch)} steps, loss {loss:+.4f}, "
                  f"mean reward {np.nanmean(arrays.rewards):.3f}, "
                  f"tree packing {packed.total_tokens}->{packed.tree_tokens} tokens")
    good_mass = float(np.exp(theta[: VOCAB // 2] - np.logaddexp.reduce(theta)).sum())
    return {**totals, "policy_mass_on_rewarded_tokens": good_mass}


def seed_demo_pool(dsn: str, groups: int = 24, group_size: int = 4, seed: int = 0) -> None:
    """Synthetic GRPO groups written straight into the pool: reward = share of 'good' (low-id) tokens."""
    from clawr1.pool.store import PoolStore

    rng = np.random.default_rng(seed)
    columns = ["step_id", "version", "trajectory_id", "step_index", "prompt_group_id", "prompt_group_size",
               "prompt_id", "response_id", "source_kind", "token_provenance", "prompt_token_ids",
               "response_token_ids", "response_logprobs", "reward", "reward_status", "terminal", "ready",
               "policy_version", "created_at_ms", "updated_at_ms"]
    rows = []
    for g in range(groups):
        prompt = rng.integers(0, VOCAB, size=int(rng.integers(8, 16))).tolist()
        for k in range(group_size):
            response = rng.integers(0, VOCAB, size=int(rng.integers(3, 9))).tolist()
            reward = float(np.mean(np.asarray(response) < VOCAB // 2))
            rows.append([f"demo-{g}-{k}", 1, f"traj-{g}-{k}", 0, f"group-{g}", group_size, f"prompt-{g}",
                         f"resp-{g}-{k}", "whitebox_agent", "engine", prompt, response,
                         [float(np.log(1 / VOCAB))] * len(response), reward, "final", 1, 1, 0,
                         1_760_000_000_000, 1_760_000_000_000])
    with PoolStore(dsn) as store:
        store.migrate()
        store.insert("step_versions", rows, columns)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", help="the stack's API URL or a ClickHouse DSN (see docs/consumer_sdk.md)")
    parser.add_argument("--group", default="grpo-example", help="consumer group (offsets live in the pool)")
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--max-steps", type=int, default=16, help="steps per batch (whole groups only)")
    parser.add_argument("--idle-timeout", type=float, default=2.0, help="stop after this long without data")
    parser.add_argument("--demo", action="store_true", help="seed and train on a temporary embedded pool")
    args = parser.parse_args(argv)
    if args.demo:
        with tempfile.TemporaryDirectory(prefix="clawr1-grpo-demo-") as tmp:
            dsn = f"chdb://{Path(tmp).resolve() / 'pool'}"
            seed_demo_pool(dsn)
            summary = train(dsn, args.group, args.iterations, args.max_steps, idle_timeout=0.0)
    elif args.source:
        summary = train(args.source, args.group, args.iterations, args.max_steps, args.idle_timeout)
    else:
        parser.error("give --source URL (a running stack) or --demo")
    print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
