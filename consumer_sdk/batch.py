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

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from clawr1.consumer_sdk.errors import DataError, MissingDependency, UsageError
from clawr1.prefix_tree.packing import PackedTree, pack_tree
from clawr1.prefix_tree.tree import StepTokens

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
    values: list[Any] = column.to_pylist()
    if pa.types.is_map(column.type):
        return [None if v is None else dict(v) for v in values]
    return values


def _width(what: str, lengths: np.ndarray, fixed: int | None, step_ids: tuple[str, ...]) -> int:
    longest = int(lengths.max()) if len(lengths) else 0
    if fixed is None:
        return longest
    if fixed < 0:
        raise UsageError(f"{what}_length must be >= 0, got {fixed}")
    if longest > fixed:
        i = int(np.argmax(lengths))
        raise DataError(f"step {step_ids[i]!r} has {longest} {what} tokens, more than {what}_length={fixed}")
    return fixed


def _metadata_of(step: Step) -> dict[str, Any]:
    """The step's own metadata object (``metadata_json``), where dataset fields travel."""
    try:
        value = json.loads(step.metadata.get("metadata_json") or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class StepBatch(Sequence[Step]):
    """What ``poll()`` returns: a sized, indexable, iterable sequence of :class:`Step`."""

    def __init__(self, table: pa.Table) -> None:
        self._table = table

    def __len__(self) -> int:
        return int(self._table.num_rows)

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

    def to_hf(self) -> Any:
        """The batch as a Hugging Face ``datasets.Dataset`` (the same columns as ``to_arrow``, no copy);
        needs the ``datasets`` package."""
        try:
            from datasets import Dataset
        except ImportError as exc:
            raise MissingDependency("to_hf needs Hugging Face datasets (pip install datasets)") from exc
        return Dataset(self._table)

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

    def to_verl(
        self,
        pad_id: int = 0,
        prompt_length: int | None = None,
        response_length: int | None = None,
        meta_info: Mapping[str, Any] | None = None,
        as_dataproto: bool | None = None,
    ) -> Any:
        """The batch in veRL's rollout layout, as the seed system's trainer received it.

        Tensors (``B`` rows, ``P`` = ``prompt_length``, ``R`` = ``response_length``, both defaulting to
        the batch's longest; a longer step raises :class:`DataError` rather than being truncated):
        ``prompts`` int64 [B, P] left-padded with ``pad_id``; ``responses`` int64 [B, R] right-padded;
        ``input_ids`` = prompts ‖ responses; ``attention_mask`` int64 [B, P+R], 1 on real tokens;
        ``position_ids`` = cumsum(attention_mask) - 1 clipped at 0 (veRL's
        ``compute_position_id_with_mask``); ``response_mask`` int64 [B, R]; ``token_level_scores``
        float32 [B, R] holding, on each step's last response token, its step reward plus (on the
        terminal step) the trajectory reward, so a trajectory's scores sum to its outcome; the same
        tensor as ``rm_scores``, the key the seed trainer reads; ``rollout_log_probs`` float32 [B, R]
        only when every step captured them (veRL treats the key as all-or-nothing).

        ``non_tensor_batch`` (object arrays): ``uid`` (the prompt group veRL's GRPO groups by; the
        trajectory id for steps without a group), ``prompt_uids``, ``trajectory_uids``,
        ``step_indices`` (int32), ``step_ids``, then every key of the steps' metadata (``None`` where a
        step lacks it) unless it would shadow one of those.

        Returns a ``verl.DataProto`` when verl is importable (``as_dataproto`` None or True), otherwise
        (or with ``as_dataproto=False``) a dict of those NumPy arrays plus ``non_tensor_batch`` and
        ``meta_info``.
        """
        arrays, non_tensors = self._verl_arrays(pad_id, prompt_length, response_length)
        meta = dict(meta_info or {})
        if as_dataproto is False:
            return {**arrays, "non_tensor_batch": non_tensors, "meta_info": meta}
        try:
            import torch
            from verl import DataProto
        except ImportError as exc:
            if as_dataproto:
                raise MissingDependency("to_verl(as_dataproto=True) needs verl (and torch) installed") \
                    from exc
            return {**arrays, "non_tensor_batch": non_tensors, "meta_info": meta}
        tensors = {name: torch.from_numpy(array) for name, array in arrays.items()}
        return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta)

    def _verl_arrays(
        self, pad_id: int, prompt_length: int | None, response_length: int | None
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        n = len(self)
        prompts, responses, logprobs = self._prompts, self._responses, self._logprobs
        p_len, r_len = prompts.lengths, responses.lengths
        width_p = _width("prompt", p_len, prompt_length, self.step_ids)
        width_r = _width("response", r_len, response_length, self.step_ids)
        rows = np.arange(n)
        # Prompt token j of row i sits at column width_p - p_len[i] + j (left padding).
        p_rows = np.repeat(rows, p_len)
        p_cols = (np.arange(len(prompts.values)) - np.repeat(prompts.offsets[:-1], p_len)
                  + np.repeat(width_p - p_len, p_len))
        r_rows = np.repeat(rows, r_len)
        r_cols = np.arange(len(responses.values)) - np.repeat(responses.offsets[:-1], r_len)

        prompt_ids = np.full((n, width_p), pad_id, dtype=np.int64)
        prompt_ids[p_rows, p_cols] = prompts.values
        response_ids = np.full((n, width_r), pad_id, dtype=np.int64)
        response_ids[r_rows, r_cols] = responses.values
        prompt_mask = (np.arange(width_p)[None, :] >= (width_p - p_len)[:, None]).astype(np.int64)
        response_mask = (np.arange(width_r)[None, :] < r_len[:, None]).astype(np.int64)
        attention_mask = np.concatenate([prompt_mask, response_mask], axis=1)
        scores = np.zeros((n, width_r), dtype=np.float32)
        has_response = r_len > 0
        scores[rows[has_response], r_len[has_response] - 1] = self._outcome_rewards()[has_response]
        arrays = {
            "prompts": prompt_ids,
            "responses": response_ids,
            "input_ids": np.concatenate([prompt_ids, response_ids], axis=1),
            "attention_mask": attention_mask,
            "position_ids": np.clip(np.cumsum(attention_mask, axis=1) - 1, 0, None),
            "response_mask": response_mask,
            "token_level_scores": scores,
            "rm_scores": scores.copy(),
        }
        if n and bool(logprobs.valid.all()):
            if not np.array_equal(logprobs.lengths, r_len):
                i = int(np.flatnonzero(logprobs.lengths != r_len)[0])
                raise DataError(f"step {self.step_ids[i]!r} has {int(logprobs.lengths[i])} logprobs "
                                f"for {int(r_len[i])} response tokens")
            rollout = np.zeros((n, width_r), dtype=np.float32)
            rollout[r_rows, r_cols] = logprobs.values
            arrays["rollout_log_probs"] = rollout
        return arrays, self._verl_non_tensors()

    def _outcome_rewards(self) -> np.ndarray:
        """Per step: its reward, plus the trajectory reward on the terminal step (missing counts 0)."""
        table = self._table
        step = table.column("reward").to_numpy(zero_copy_only=False).astype(np.float64)
        out = np.nan_to_num(step, nan=0.0)
        if "trajectory_reward" in table.column_names and "terminal" in table.column_names:
            trajectory = np.nan_to_num(
                table.column("trajectory_reward").to_numpy(zero_copy_only=False).astype(np.float64), nan=0.0)
            terminal = table.column("terminal").to_numpy(zero_copy_only=False).astype(bool)
            out = out + np.where(terminal, trajectory, 0.0)
        result: np.ndarray = out.astype(np.float32)
        return result

    def _verl_non_tensors(self) -> dict[str, np.ndarray]:
        steps = list(self)
        groups = [s.prompt_group_id for s in steps]

        def objects(values: list[Any]) -> np.ndarray:
            out = np.empty(len(values), dtype=object)
            out[:] = values
            return out

        non_tensors = {
            "uid": objects([s.prompt_group_id or s.trajectory_id for s in steps]),
            "prompt_uids": objects(groups),
            "trajectory_uids": objects([s.trajectory_id for s in steps]),
            "step_indices": np.array([s.step_index for s in steps], dtype=np.int32),
            "step_ids": objects([s.step_id for s in steps]),
        }
        metadata = [_metadata_of(s) for s in steps]
        for key in sorted({k for m in metadata for k in m} - set(non_tensors)):
            non_tensors[key] = objects([m.get(key) for m in metadata])
        return non_tensors

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
        """The batch as one prefix-tree-packed sequence (``clawr1.prefix_tree.packing.pack_tree``).

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
