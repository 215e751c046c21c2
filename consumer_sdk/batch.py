"""A polled batch of steps and its training-ready forms.

The batch keeps the pool's answer as one Arrow table: token columns stay flat Arrow lists, so
padding to NumPy is a handful of vectorized copies, not a Python loop over tokens. ``Step`` objects
are built only when the batch is iterated or indexed.

Padded layout (``to_numpy`` / ``to_torch``): row i is ``prompt + response`` right-padded with
``pad_id``. Masks and logprobs are aligned with token positions: ``loss_mask[i, t]`` is True when
token t is a response token, and ``old_logprobs[i, t]`` is the behaviour policy's logprob of token t.
A causal LM predicts token t from position t - 1, so a trainer shifts its logits (or these arrays)
by one, the usual convention.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from consumer_sdk.errors import DataError, MissingDependency, UsageError
from prefix_tree.packing import PackedTree, pack_tree
from prefix_tree.tree import StepTokens

__all__ = ["PaddedBatch", "Step", "StepBatch"]

_ATTRIBUTE_COLUMNS = frozenset({
    "step_id", "version", "trajectory_id", "step_index", "parent_step_id", "prompt_group_id",
    "prompt_token_ids", "response_token_ids", "response_logprobs", "reward", "policy_version",
})


@dataclass(frozen=True, slots=True, eq=False)
class Step:
    """One step as stored in the pool (the version the consumer was handed)."""

    step_id: str
    version: int
    trajectory_id: str
    step_index: int
    parent_step_id: str | None
    prompt_group_id: str | None
    prompt_token_ids: np.ndarray
    """uint32 token ids of the prompt (state)."""
    response_token_ids: np.ndarray
    """uint32 token ids of the response (action)."""
    response_logprobs: np.ndarray | None
    """float64 behaviour-policy logprobs, one per response token; None when not captured (stored empty)."""
    reward: float | None
    policy_version: int | None
    metadata: Mapping[str, Any]
    """Every other fetched column: provenance, reward status and components, quality, timestamps..."""


@dataclass(frozen=True, eq=False)
class PaddedBatch:
    """Right-padded NumPy arrays for a trainer; ``arrays()`` gives them by name."""

    input_ids: np.ndarray
    """int64 [B, L]: prompt, then response, then ``pad_id``."""
    attention_mask: np.ndarray
    """bool [B, L]: True on real tokens."""
    loss_mask: np.ndarray
    """bool [B, L]: True on response tokens (what the policy is trained on)."""
    old_logprobs: np.ndarray
    """float32 [B, L]: behaviour logprob at each response token; 0 elsewhere and for steps without them."""
    has_logprobs: np.ndarray
    """bool [B]: whether the step's logprobs were captured."""
    rewards: np.ndarray
    """float32 [B]: the step reward; NaN where the step has none."""
    prompt_lengths: np.ndarray
    """int64 [B]."""
    response_lengths: np.ndarray
    """int64 [B]."""
    group_index: np.ndarray
    """int64 [B]: index into ``group_ids`` of the step's prompt group; -1 without one."""
    group_ids: tuple[str, ...]
    step_ids: tuple[str, ...]

    def arrays(self) -> dict[str, np.ndarray]:
        return {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "loss_mask": self.loss_mask,
            "old_logprobs": self.old_logprobs,
            "has_logprobs": self.has_logprobs,
            "rewards": self.rewards,
            "prompt_lengths": self.prompt_lengths,
            "response_lengths": self.response_lengths,
            "group_index": self.group_index,
        }


@dataclass(frozen=True)
class _Lists:
    """A flattened list column: row i is ``values[offsets[i]:offsets[i + 1]]``; ``valid`` False if empty."""

    values: np.ndarray
    offsets: np.ndarray
    valid: np.ndarray

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def row(self, i: int) -> np.ndarray:
        return self.values[self.offsets[i] : self.offsets[i + 1]]


def _lists(table: pa.Table, name: str, dtype: np.dtype) -> _Lists:
    column = table.column(name).combine_chunks()
    lengths = pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False)
    offsets = np.zeros(len(column) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = column.flatten().to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    # The pool stores "no logprobs" as an empty array; a null list reads the same way.
    valid = column.is_valid().to_numpy(zero_copy_only=False).astype(bool, copy=False) & (lengths > 0)
    return _Lists(values=values, offsets=offsets, valid=valid)


def _python_values(column: pa.ChunkedArray) -> list[Any]:
    values = column.to_pylist()
    if pa.types.is_map(column.type):
        return [None if v is None else dict(v) for v in values]
    return values


class StepBatch(Sequence[Step]):
    """What ``poll()`` returns: a sized, indexable, iterable sequence of :class:`Step`."""

    def __init__(self, table: pa.Table) -> None:
        self._table = table

    def __len__(self) -> int:
        return self._table.num_rows

    @overload
    def __getitem__(self, index: int) -> Step: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Step]: ...

    def __getitem__(self, index: int | slice) -> Step | Sequence[Step]:
        return self._steps[index]

    def __iter__(self) -> Iterator[Step]:
        return iter(self._steps)

    def __repr__(self) -> str:
        return f"<StepBatch steps={len(self)} tokens={self.num_tokens}>"

    @cached_property
    def step_ids(self) -> tuple[str, ...]:
        return tuple(self._table.column("step_id").to_pylist())

    @cached_property
    def num_tokens(self) -> int:
        """Prompt plus response tokens over the batch."""
        return int(self._prompts.offsets[-1] + self._responses.offsets[-1])

    @cached_property
    def _prompts(self) -> _Lists:
        return _lists(self._table, "prompt_token_ids", np.dtype(np.uint32))

    @cached_property
    def _responses(self) -> _Lists:
        return _lists(self._table, "response_token_ids", np.dtype(np.uint32))

    @cached_property
    def _logprobs(self) -> _Lists:
        return _lists(self._table, "response_logprobs", np.dtype(np.float64))

    @cached_property
    def _steps(self) -> list[Step]:
        table = self._table
        cols = {name: _python_values(table.column(name)) for name in table.column_names
                if name not in ("prompt_token_ids", "response_token_ids", "response_logprobs")}
        meta_names = [name for name in table.column_names if name not in _ATTRIBUTE_COLUMNS]
        prompts, responses, logprobs = self._prompts, self._responses, self._logprobs
        return [
            Step(
                step_id=cols["step_id"][i],
                version=cols["version"][i],
                trajectory_id=cols["trajectory_id"][i],
                step_index=cols["step_index"][i],
                parent_step_id=cols["parent_step_id"][i],
                prompt_group_id=cols["prompt_group_id"][i],
                prompt_token_ids=prompts.row(i),
                response_token_ids=responses.row(i),
                response_logprobs=logprobs.row(i) if logprobs.valid[i] else None,
                reward=cols["reward"][i],
                policy_version=cols["policy_version"][i],
                metadata={name: cols[name][i] for name in meta_names},
            )
            for i in range(len(self))
        ]

    def to_arrow(self) -> pa.Table:
        """The batch as the pool returned it: one row per step, token ids as Arrow lists."""
        return self._table

    def to_numpy(self, pad_id: int = 0, pad_to_multiple: int | None = None) -> PaddedBatch:
        """Right-padded arrays (see the module docstring for the layout)."""
        if pad_to_multiple is not None and pad_to_multiple < 1:
            raise UsageError("pad_to_multiple must be >= 1")
        n = len(self)
        prompts, responses, logprobs = self._prompts, self._responses, self._logprobs
        p_len, r_len = prompts.lengths, responses.lengths
        bad = np.flatnonzero(logprobs.valid & (logprobs.lengths != r_len))
        if bad.size:
            i = int(bad[0])
            raise DataError(f"step {self.step_ids[i]!r} has {int(logprobs.lengths[i])} logprobs "
                            f"for {int(r_len[i])} response tokens")
        total = p_len + r_len
        width = int(total.max()) if n else 0
        if pad_to_multiple:
            width += -width % pad_to_multiple
        rows = np.arange(n)
        p_rows = np.repeat(rows, p_len)
        p_cols = np.arange(len(prompts.values)) - np.repeat(prompts.offsets[:-1], p_len)
        r_rows = np.repeat(rows, r_len)
        r_cols = (np.arange(len(responses.values)) - np.repeat(responses.offsets[:-1], r_len)
                  + np.repeat(p_len, r_len))

        input_ids = np.full((n, width), pad_id, dtype=np.int64)
        input_ids[p_rows, p_cols] = prompts.values
        input_ids[r_rows, r_cols] = responses.values
        positions = np.arange(width)[None, :]
        attention_mask = positions < total[:, None]
        loss_mask = (positions >= p_len[:, None]) & attention_mask
        old_logprobs = np.zeros((n, width), dtype=np.float32)
        with_lp = np.repeat(logprobs.valid, r_len)
        old_logprobs[r_rows[with_lp], r_cols[with_lp]] = logprobs.values

        group_of = self._table.column("prompt_group_id").to_pylist()
        group_ids = tuple(dict.fromkeys(g for g in group_of if g is not None))
        index = {g: k for k, g in enumerate(group_ids)}
        rewards = self._table.column("reward").to_numpy(zero_copy_only=False).astype(np.float32)
        return PaddedBatch(
            input_ids=input_ids,
            attention_mask=attention_mask,
            loss_mask=loss_mask,
            old_logprobs=old_logprobs,
            has_logprobs=logprobs.valid.copy(),
            rewards=rewards,
            prompt_lengths=p_len.astype(np.int64),
            response_lengths=r_len.astype(np.int64),
            group_index=np.array([index.get(g, -1) for g in group_of], dtype=np.int64),
            group_ids=group_ids,
            step_ids=self.step_ids,
        )

    def to_torch(
        self, device: Any = None, pad_id: int = 0, pad_to_multiple: int | None = None
    ) -> dict[str, Any]:
        """``to_numpy().arrays()`` as ``torch.Tensor`` on ``device``; needs PyTorch installed."""
        try:
            import torch
        except ImportError as exc:
            raise MissingDependency("StepBatch.to_torch needs PyTorch: install torch, or use to_numpy()") \
                from exc
        arrays = self.to_numpy(pad_id=pad_id, pad_to_multiple=pad_to_multiple).arrays()
        return {name: torch.from_numpy(array).to(device) for name, array in arrays.items()}

    def pack_tree(
        self,
        advantages: Sequence[float] | np.ndarray | None = None,
        pad_to_multiple: int | None = None,
        pad_id: int = 0,
    ) -> PackedTree:
        """The batch as one prefix-tree-packed sequence (``prefix_tree.packing.pack_tree``).

        Steps sharing prefixes (a GRPO group's prompt, a trajectory's earlier turns) are stored
        once; ``advantages`` holds one value per step in batch order; captured logprobs travel along.
        """
        steps = list(self)
        try:
            return pack_tree(
                [StepTokens(s.step_id, s.prompt_token_ids, s.response_token_ids, s.parent_step_id)
                 for s in steps],
                advantages=advantages,
                logprobs=[s.response_logprobs for s in steps],
                pad_to_multiple=pad_to_multiple,
                pad_id=pad_id,
            )
        except ValueError as exc:
            raise DataError(f"cannot pack this batch: {exc}") from exc
