"""Tree-packed training batches: one forward pass over a prefix tree instead of one per step.

The tree's tokens are laid out depth-first (children by first token) in one sequence.
Each token carries its depth as position id, and ``tout[k]``, the exclusive end of
token k's subtree in that layout. Token q may attend token k exactly when
``k <= q < tout[k]``, i.e. when k is q itself or an ancestor of q; together with
depth positions this makes every token see exactly what it saw in its own step, so
per-step logprobs equal those of running each step alone.

Labels cannot come from shifting ``input_ids`` (after a branch point the next packed
token belongs to another branch), so every training target carries ``pred_idx``: the
packed index of the token just before it on its step's path, whose logits predict it.
Targets are every response token of every step, in step order, not deduplicated:
two steps that share a response token each get their own target, with their own
advantage and old logprob.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from clawr1.prefix_tree.tree import TOKEN_DTYPE, StepTokens, build_tree

__all__ = ["PackedTree", "dense_mask", "flex_mask_mod", "pack_tree", "tree_mask_mod"]


@dataclass(frozen=True, eq=False)
class PackedTree:
    """A tree-packed batch as NumPy arrays a trainer can hand to its model as they are.

    Token arrays have length ``seq_len`` (``num_tokens`` real tokens, then padding);
    target arrays have length ``num_targets``. Padding tokens attend only themselves
    and nobody attends them, so attention rows stay finite and real tokens are unaffected.
    """

    input_ids: np.ndarray
    """int64 [seq_len]: node tokens in depth-first order, then ``pad_id``."""
    position_ids: np.ndarray
    """int64 [seq_len]: 0-based depth of each token in its step(s); 0 for padding."""
    tout: np.ndarray
    """int64 [seq_len]: exclusive end of each token's subtree; q sees k iff k <= q < tout[k]."""
    pred_idx: np.ndarray
    """int64 [num_targets]: packed index whose logits predict each target."""
    target_idx: np.ndarray
    """int64 [num_targets]: packed index of the target token itself."""
    labels: np.ndarray
    """int64 [num_targets]: the target token ids (each step's response, in order)."""
    target_step_index: np.ndarray
    """int64 [num_targets]: index into ``step_ids`` of each target's step."""
    target_offsets: np.ndarray
    """int64 [num_steps + 1]: step i's targets are ``[target_offsets[i], target_offsets[i + 1])``."""
    target_logprobs: np.ndarray | None
    """float32 [num_targets]: behaviour-policy logprobs; NaN for steps without them; None if none given."""
    target_advantages: np.ndarray | None
    """float32 [num_targets]: each step's advantage (or reward) on each of its targets; None if not given."""
    step_ids: tuple[str, ...]
    num_tokens: int
    total_tokens: int
    tree_tokens: int
    forks: int

    @property
    def seq_len(self) -> int:
        return len(self.input_ids)

    @property
    def num_targets(self) -> int:
        return len(self.labels)


def pack_tree(
    steps: Sequence[StepTokens],
    advantages: Sequence[float] | np.ndarray | None = None,
    logprobs: Sequence[np.ndarray | Sequence[float] | None] | None = None,
    pad_to_multiple: int | None = None,
    pad_id: int = 0,
) -> PackedTree:
    """Merge ``steps`` into one prefix tree and lay it out for a single forward pass.

    ``advantages`` holds one scalar per step; ``logprobs`` one array per step aligned
    with its response tokens (or None for a step without them). Steps may come from
    several scopes: the layout is a forest, so unrelated steps simply share nothing.
    ``pad_to_multiple`` pads the token arrays (e.g. to FlexAttention's block size);
    without it there is no padding.
    """
    steps = list(steps)
    step_ids = tuple(s.step_id for s in steps)
    if len(set(step_ids)) != len(step_ids):
        raise ValueError("pack_tree got the same step_id twice")
    if advantages is not None and len(advantages) != len(steps):
        raise ValueError(f"{len(advantages)} advantages for {len(steps)} steps")
    if logprobs is not None and len(logprobs) != len(steps):
        raise ValueError(f"{len(logprobs)} logprob arrays for {len(steps)} steps")
    if pad_to_multiple is not None and pad_to_multiple < 1:
        raise ValueError("pad_to_multiple must be >= 1")

    tree = build_tree(steps)
    nodes = tree.nodes
    index = {n.node_id: i for i, n in enumerate(nodes)}
    lens = np.fromiter((len(n.tokens) for n in nodes), dtype=np.int64, count=len(nodes))
    starts = np.fromiter((n.start_depth for n in nodes), dtype=np.int64, count=len(nodes))
    offsets = np.zeros(len(nodes), dtype=np.int64)
    np.cumsum(lens[:-1], out=offsets[1:])
    # Depth-first order puts a node's subtree right after it: size it bottom-up.
    subtree = lens.copy()
    for i in range(len(nodes) - 1, -1, -1):
        parent = nodes[i].parent_id
        if parent is not None:
            subtree[index[parent]] += subtree[i]

    num_tokens = int(lens.sum())
    input_ids = np.concatenate([n.tokens for n in nodes]) if nodes else np.empty(0, dtype=TOKEN_DTYPE)
    position_ids = np.arange(num_tokens, dtype=np.int64) - np.repeat(offsets - starts, lens)
    tout = np.repeat(offsets + subtree, lens)

    pred_parts: list[np.ndarray] = []
    resp_lens = np.fromiter((s.response_len for s in steps), dtype=np.int64, count=len(steps))
    for step in steps:
        if step.response_len:
            pred_parts.append(
                _path_indices(
                    tree.path(step.step_id), index, starts, lens, offsets, first_depth=step.prompt_len - 1
                )
            )
    # Each part spans depths prompt_len-1 .. len-1: predictors are all but its last entry,
    # targets all but its first.
    pred_idx = np.concatenate([p[:-1] for p in pred_parts]) if pred_parts else np.empty(0, np.int64)
    target_idx = np.concatenate([p[1:] for p in pred_parts]) if pred_parts else np.empty(0, np.int64)
    labels = (
        np.concatenate([s.response_ids for s in steps]) if steps else np.empty(0, dtype=TOKEN_DTYPE)
    ).astype(TOKEN_DTYPE, copy=False)
    target_step_index = np.repeat(np.arange(len(steps), dtype=np.int64), resp_lens)
    target_offsets = np.zeros(len(steps) + 1, dtype=np.int64)
    np.cumsum(resp_lens, out=target_offsets[1:])

    target_advantages = None
    if advantages is not None:
        target_advantages = np.repeat(np.asarray(advantages, dtype=np.float32), resp_lens)
    target_logprobs = None
    if logprobs is not None:
        target_logprobs = np.full(len(labels), np.nan, dtype=np.float32)
        for i, (step, lp) in enumerate(zip(steps, logprobs, strict=True)):
            if lp is None:
                continue
            arr = np.asarray(lp, dtype=np.float32)
            if arr.shape != (step.response_len,):
                raise ValueError(
                    f"step {step.step_id!r}: {arr.shape} logprobs for {step.response_len} response tokens"
                )
            target_logprobs[target_offsets[i] : target_offsets[i + 1]] = arr

    if pad_to_multiple:
        pad = -num_tokens % pad_to_multiple
        if pad:
            input_ids = np.concatenate([input_ids, np.full(pad, pad_id, dtype=TOKEN_DTYPE)])
            position_ids = np.concatenate([position_ids, np.zeros(pad, dtype=np.int64)])
            tout = np.concatenate([tout, np.arange(num_tokens + 1, num_tokens + pad + 1, dtype=np.int64)])

    return PackedTree(
        input_ids=input_ids,
        position_ids=position_ids,
        tout=tout,
        pred_idx=pred_idx,
        target_idx=target_idx,
        labels=labels,
        target_step_index=target_step_index,
        target_offsets=target_offsets,
        target_logprobs=target_logprobs,
        target_advantages=target_advantages,
        step_ids=step_ids,
        num_tokens=num_tokens,
        total_tokens=tree.total_tokens,
        tree_tokens=tree.tree_tokens,
        forks=tree.forks,
    )


def _path_indices(
    path: list[int],
    index: dict[int, int],
    starts: np.ndarray,
    lens: np.ndarray,
    offsets: np.ndarray,
    first_depth: int,
) -> np.ndarray:
    """Packed indices of depths ``first_depth .. end`` along a path, walking up only as far as needed."""
    parts = []
    for node_id in reversed(path):
        i = index[node_id]
        start = int(starts[i])
        lo = max(start, first_depth)
        base = int(offsets[i]) - start
        parts.append(np.arange(base + lo, base + start + int(lens[i]), dtype=np.int64))
        if start <= first_depth:
            break
    parts.reverse()
    return np.concatenate(parts)


def dense_mask(packed: PackedTree) -> np.ndarray:
    """bool [seq_len, seq_len], True where query q may attend key k (k <= q < tout[k]).

    Quadratic in memory: meant for small batches and checks; use ``flex_mask_mod`` at scale.
    """
    n = packed.seq_len
    q = np.arange(n)[:, None]
    k = np.arange(n)[None, :]
    return (k <= q) & (q < packed.tout[None, :])


MaskMod = Callable[[Any, Any, Any, Any], Any]


def tree_mask_mod(tout: Any) -> MaskMod:
    """A FlexAttention-style ``mask_mod(b, h, q_idx, kv_idx)`` over a ``tout`` array.

    Only elementwise comparisons and one gather, so it runs on torch tensors inside
    FlexAttention's vmap and on plain ints or NumPy arrays for checks.
    """

    def mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return (kv_idx <= q_idx) & (q_idx < tout[kv_idx])

    return mask_mod


def flex_mask_mod(packed: PackedTree, device: Any = None) -> MaskMod:
    """The tree ``mask_mod`` for ``torch.nn.attention.flex_attention``, with ``tout`` on ``device``.

    Typical use::

        mask_mod = flex_mask_mod(packed, device="cuda")
        block_mask = create_block_mask(mask_mod, None, None, packed.seq_len, packed.seq_len, device="cuda")
        out = flex_attention(q, k, v, block_mask=block_mask)  # q, k, v: [1, heads, seq_len, dim]

    torch is imported here, not at module import, so the package works without it.
    """
    try:
        import torch
    except ImportError as exc:
        raise ImportError("flex_mask_mod needs torch (FlexAttention: torch >= 2.5)") from exc
    return tree_mask_mod(torch.as_tensor(packed.tout, dtype=torch.int64, device=device))
