"""Proof that one forward pass over a packed tree gives each step's own logprobs.

A tiny decoder-only transformer in NumPy (RMSNorm, multi-head attention with rotary
positions, SwiGLU MLP, random weights) scores the response tokens of every step two
ways: once per step alone (positions 0..L-1, causal mask) and once over the packed
tree (depth positions, ``tout`` mask, logits read at ``pred_idx``). They must agree to
rounding. Two negative controls show the test can fail: flat positions 0..N-1 or a
plain causal mask over the packed sequence change the logprobs by a lot.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clawr1.prefix_tree import PackedTree, StepTokens, dense_mask, pack_tree, tree_mask_mod

VOCAB = 23


@dataclass
class TinyTransformer:
    """Random-weight decoder; ``dtype`` sets the precision of every weight and activation."""

    dim: int = 32
    heads: int = 4
    layers: int = 2
    seed: int = 0
    dtype: type = np.float64

    def __post_init__(self) -> None:
        rng = np.random.default_rng(self.seed)

        def w(*shape: int, scale: float = 1.0) -> np.ndarray:
            return (rng.standard_normal(shape) * scale / np.sqrt(shape[0])).astype(self.dtype)

        d, hidden = self.dim, 2 * self.dim
        self.embed = rng.standard_normal((VOCAB, d)).astype(self.dtype)
        # Larger query/key scales make attention peaked, so positions and masks matter.
        self.blocks = [
            {
                "wq": w(d, d, scale=3.0),
                "wk": w(d, d, scale=3.0),
                "wv": w(d, d),
                "wo": w(d, d),
                "w1": w(d, hidden),
                "w3": w(d, hidden),
                "w2": w(hidden, d),
            }
            for _ in range(self.layers)
        ]
        self.unembed = w(d, VOCAB, scale=2.0)

    def _rope(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        half = x.shape[-1] // 2
        inv_freq = 10000.0 ** (-np.arange(half) / half)
        angles = positions[:, None].astype(np.float64) * inv_freq[None, :]
        cos, sin = np.cos(angles).astype(self.dtype), np.sin(angles).astype(self.dtype)
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)

    @staticmethod
    def _norm(x: np.ndarray) -> np.ndarray:
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)

    def logits(self, input_ids: np.ndarray, positions: np.ndarray, allowed: np.ndarray) -> np.ndarray:
        """[N, VOCAB] logits; ``allowed[q, k]`` says whether query q may attend key k."""
        n, hd = len(input_ids), self.dim // self.heads
        h = self.embed[input_ids]
        for blk in self.blocks:
            x = self._norm(h)
            q, k, v = (
                (x @ blk[name]).reshape(n, self.heads, hd).transpose(1, 0, 2) for name in ("wq", "wk", "wv")
            )
            q, k = self._rope(q, positions), self._rope(k, positions)
            scores = q @ k.transpose(0, 2, 1) / self.dtype(np.sqrt(hd))
            scores = np.where(allowed[None], scores, -np.inf)
            scores = scores - scores.max(-1, keepdims=True)
            p = np.exp(scores)
            p = p / p.sum(-1, keepdims=True)
            h = h + (p @ v).transpose(1, 0, 2).reshape(n, self.dim) @ blk["wo"]
            x = self._norm(h)
            gate = x @ blk["w1"]
            h = h + (gate / (1 + np.exp(-gate)) * (x @ blk["w3"])) @ blk["w2"]
        return self._norm(h) @ self.unembed


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def per_step_logprobs(model: TinyTransformer, steps: list[StepTokens]) -> np.ndarray:
    """Response-token logprobs from running every step alone, concatenated in step order."""
    out = []
    for s in steps:
        seq = s.sequence
        n = len(seq)
        causal = np.tril(np.ones((n, n), dtype=bool))
        lp = log_softmax(model.logits(seq, np.arange(n), causal))
        out.append(lp[np.arange(s.prompt_len - 1, n - 1), s.response_ids])
    return np.concatenate(out)


def packed_logprobs(
    model: TinyTransformer,
    packed: PackedTree,
    positions: np.ndarray | None = None,
    mask: np.ndarray | None = None,
) -> np.ndarray:
    """Response-token logprobs from ONE forward pass over the packed tree."""
    positions = packed.position_ids if positions is None else positions
    mask = dense_mask(packed) if mask is None else mask
    lp = log_softmax(model.logits(packed.input_ids, positions, mask))
    return lp[packed.pred_idx, packed.labels]


def agentic_steps() -> list[StepTokens]:
    """A GRPO group, a three-turn trajectory with a drifted turn, a duplicate, a prefix step."""
    rng = np.random.default_rng(1)

    def toks(n: int) -> list[int]:
        return rng.integers(0, VOCAB, n).tolist()

    prompt = toks(12)
    group = [StepTokens(f"g{i}", prompt, toks(int(rng.integers(1, 7)))) for i in range(4)]
    t1 = StepTokens("t1", prompt + toks(3), toks(5))
    t1_seq = t1.sequence.tolist()
    t2 = StepTokens("t2", t1_seq + toks(4), toks(4), parent_step_id="t1")
    t2_seq = t2.sequence.tolist()
    drifted = t2_seq[:]
    drifted[len(t1_seq) - 1] = (drifted[len(t1_seq) - 1] + 1) % VOCAB
    t3 = StepTokens("t3", drifted + toks(3), toks(6), parent_step_id="t2")
    dup = StepTokens("g0-again", group[0].prompt_ids, group[0].response_ids)
    prefix = StepTokens("t2-prefix", t2_seq[:20], t2_seq[20:24])
    one = StepTokens("one", prompt, toks(1))
    return [*group, t1, t2, t3, dup, prefix, one]


def test_fixture_has_the_shapes_it_claims() -> None:
    packed = pack_tree(agentic_steps())
    assert packed.forks == 1
    assert packed.tree_tokens < packed.total_tokens
    assert packed.num_targets == sum(s.response_len for s in agentic_steps())


@pytest.mark.parametrize(("dtype", "tol"), [(np.float64, 1e-10), (np.float32, 1e-5)])
def test_one_tree_pass_equals_per_step_runs(dtype: type, tol: float) -> None:
    steps = agentic_steps()
    model = TinyTransformer(dtype=dtype)
    packed = pack_tree(steps)
    reference = per_step_logprobs(model, steps)
    got = packed_logprobs(model, packed)
    assert got.dtype == dtype
    assert np.abs(got - reference).max() < tol
    # The mask_mod form of the rule drives the same pass to the same result.
    q, k = np.arange(packed.seq_len)[:, None], np.arange(packed.seq_len)[None, :]
    via_mod = packed_logprobs(model, packed, mask=tree_mask_mod(packed.tout)(0, 0, q, k))
    assert np.abs(via_mod - reference).max() < tol


def test_padding_leaves_logprobs_unchanged() -> None:
    steps = agentic_steps()
    model = TinyTransformer()
    padded = pack_tree(steps, pad_to_multiple=32)
    assert padded.seq_len % 32 == 0 and padded.seq_len > padded.num_tokens
    assert np.abs(packed_logprobs(model, padded) - per_step_logprobs(model, steps)).max() < 1e-10


def test_negative_control_flat_positions_fail() -> None:
    steps = agentic_steps()
    model = TinyTransformer()
    packed = pack_tree(steps)
    flat = np.arange(packed.seq_len)
    diff = np.abs(packed_logprobs(model, packed, positions=flat) - per_step_logprobs(model, steps))
    assert diff.max() > 0.1


def test_negative_control_causal_mask_fails() -> None:
    steps = agentic_steps()
    model = TinyTransformer()
    packed = pack_tree(steps)
    causal = np.tril(np.ones((packed.seq_len, packed.seq_len), dtype=bool))
    diff = np.abs(packed_logprobs(model, packed, mask=causal) - per_step_logprobs(model, steps))
    assert diff.max() > 0.1


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_random_trees_match_per_step_runs(seed: int) -> None:
    """Random groups and turn chains (with drift) of random sizes, one pass vs. per step."""
    rng = np.random.default_rng(seed)
    steps: list[StepTokens] = []
    for i in range(int(rng.integers(1, 9))):
        if steps and rng.random() < 0.7:
            base = steps[int(rng.integers(len(steps)))]
            if rng.random() < 0.5:  # a sibling sample of the same prompt
                prompt = base.prompt_ids.tolist()
            else:  # the next turn, sometimes with a drifted token at the boundary
                prompt = base.sequence.tolist() + rng.integers(0, VOCAB, int(rng.integers(0, 4))).tolist()
                if rng.random() < 0.3:
                    at = len(base.sequence) - 1
                    prompt[at] = (prompt[at] + 1) % VOCAB
        else:
            prompt = rng.integers(0, 3, int(rng.integers(1, 6))).tolist()
        steps.append(StepTokens(f"s{i}", prompt, rng.integers(0, VOCAB, int(rng.integers(0, 6)))))
    model = TinyTransformer(seed=seed % 7)
    packed = pack_tree(steps)
    diff = np.abs(packed_logprobs(model, packed) - per_step_logprobs(model, steps))
    assert diff.max(initial=0.0) < 1e-10
