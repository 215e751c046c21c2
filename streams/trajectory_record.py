"""A trajectory's state in the worker: what the join knows of its steps, and its prefix-tree scope.

The join's facts (``clawr1.streams.join``) are split by how they change: each step's small part
(digests, feedback, whether superseded) lives in the trajectory's record, rewritten when anything in the
trajectory changes; a step's fact itself (prompt, reply, token ids: most of the bytes) is kept too, as
it rebuilds the trajectory's prefix tree after a restart. The latest facts ride in the record's *tail*
while it holds at most ``TAIL_TOKENS`` token ids, so a short trajectory (a black-box call, a few
white-box steps) is one state key and one changelog record per checkpoint; a tail that would grow
past that is *sealed* into a *chunk* of its own key, written once and never rewritten, as is a fact too
big for the tail. So a checkpoint writes one record per trajectory it touched, plus a chunk when a
tail sealed, and the bytes rewritten with a record stay bounded by the tail's size.

Records are kept by the hash of the trajectory id (``clawr1.core.routing.key_hash``), a white-box step's
id carries that hash, so feedback naming the step finds its trajectory from the id alone; a black-box
conversation's only trajectory is kept with its link state instead (``clawr1.streams.home_record``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from clawr1.schemas.batch import pack_ints
from clawr1.streams import state_codec
from clawr1.streams.join import StepState, TrajectoryState
from clawr1.streams.prefix_scope import MIN_SHARED, ScopeState, shared_prefix, unpack_hex
from clawr1.streams.turns import TokenIds

# A chunk is closed once it holds this many token ids (its changelog record stays well under a MB).
CHUNK_TOKENS = 40_000
# The record's tail holds at most this many token ids of facts: what a record rewrite may carry along.
TAIL_TOKENS = 8_192
TAIL = -1  # a ``StepEntry.chunk`` that says the fact is in the record's tail

Chunk = dict[str, dict[str, Any]]  # step id -> the step's fact (step.avsc fields of the source)


def _tokens(base: dict[str, Any]) -> int:
    """Token ids a kept fact holds (a prompt kept as a difference counts its own part)."""
    prompt = base["prompt_token_ids"]
    held = len(prompt["p"]) // 8 if isinstance(prompt, dict) else len(prompt)
    return held + len(base["response_token_ids"]) + 1


@dataclass
class StepEntry:
    """A step's part of the record; its fact is in chunk ``chunk``, in the tail (``TAIL``), or not
    arrived yet (None)."""

    chunk: int | None = None
    base_digest: str = ""
    base_digests: list[str] = field(default_factory=list)
    feedback: list[dict[str, Any]] = field(default_factory=list)
    superseded: bool = False
    revived: bool = False

    def to_json(self) -> dict[str, Any]:
        return state_codec.encode(self)

    @classmethod
    def from_json(cls, data: list[Any] | dict[str, Any]) -> StepEntry:
        return state_codec.decode(cls, data)


@dataclass
class TrajectoryRecord:
    trajectory: TrajectoryState = field(default_factory=TrajectoryState)
    steps: dict[str, StepEntry] = field(default_factory=dict)
    scope: ScopeState | None = None
    chunks: int = 0  # chunks written so far; the next one is numbered this
    tail: Chunk = field(default_factory=dict)  # the facts not in a chunk (yet)
    tail_tokens: int = 0
    touched_ms: int | None = None  # when a checkpoint last wrote it (``clawr1.streams.expiry``)
    # Started again after its earlier state expired: not merged into a prefix tree (the pool holds the
    # tree of the expired state, which a new one would contradict).
    after_expiry: bool = False
    # The source of its first step, whose trajectory it is (``clawr1.streams.ownership``); None before
    # any step, and in state written before owners were kept.
    owner: str | None = None
    open_chunk: int | None = None  # the chunk this checkpoint adds big facts to (never stored)
    open_tokens: int = 0

    def to_json(self) -> dict[str, Any]:
        data = {"v": state_codec.STATE_VERSION, "entries": self.trajectory.entries,
                "feedback": self.trajectory.feedback,
                "steps": {s: e.to_json() for s, e in self.steps.items()},
                "scope": None if self.scope is None else self.scope.to_json(), "chunks": self.chunks,
                "tail": self.tail, "tail_tokens": self.tail_tokens, "touched_ms": self.touched_ms}
        if self.after_expiry:
            data["after_expiry"] = True
        if self.owner is not None:
            data["owner"] = self.owner
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> TrajectoryRecord:
        if not data:
            return cls()
        # Records written before tails existed have none: all their facts are in chunks.
        return cls(TrajectoryState(data["entries"], data["feedback"]),
                   {s: StepEntry.from_json(e) for s, e in data["steps"].items()},
                   None if data["scope"] is None else ScopeState.from_json(data["scope"]), data["chunks"],
                   data.get("tail", {}), data.get("tail_tokens", 0), data.get("touched_ms"),
                   data.get("after_expiry", False), data.get("owner"))

    def waiting_feedback(self) -> list[tuple[str | None, dict[str, Any]]]:
        """Feedback that never met its step: (step id, fact) for steps whose fact never arrived, and
        (None, fact) for the trajectory's own feedback when none of its steps arrived."""
        waiting: list[tuple[str | None, dict[str, Any]]] = [
            (step_id, fact) for step_id, entry in self.steps.items() if entry.chunk is None
            for fact in entry.feedback]
        if not any(entry.chunk is not None for entry in self.steps.values()):
            waiting += [(None, fact) for fact in self.trajectory.feedback]
        return waiting


class Trajectory:
    """A record plus access to its chunks, for one checkpoint (``load_chunk``/``new_chunk`` give the
    checkpoint's decoded chunk dicts, which the caller writes back)."""

    def __init__(self, trajectory_id: str, record: TrajectoryRecord,
                 load_chunk: Callable[[int], Chunk | None], new_chunk: Callable[[int], Chunk]) -> None:
        self.id = trajectory_id
        self.record = record
        self._load = load_chunk
        self._new = new_chunk
        self._full: dict[str, dict[str, Any]] = {}  # facts read back whole in this checkpoint

    def _kept(self, step_id: str) -> dict[str, Any] | None:
        """The fact as kept: its prompt may be a difference (``_compact``)."""
        entry = self.record.steps.get(step_id)
        if entry is None or entry.chunk is None:
            return None
        if entry.chunk == TAIL:
            return self.record.tail.get(step_id)
        chunk = self._load(entry.chunk)
        return None if chunk is None else chunk.get(step_id)

    @property
    def state(self) -> TrajectoryState:
        return self.record.trajectory

    def base(self, step_id: str) -> dict[str, Any] | None:
        """The step's fact, whole."""
        full = self._full.get(step_id)
        if full is not None:
            return full
        kept = self._kept(step_id)
        if kept is None or not isinstance(kept["prompt_token_ids"], dict):
            return kept
        ref = kept["prompt_token_ids"]
        sequence = self._sequence(ref["b"])
        if sequence is None:  # kept with its base, which always comes first: a broken record
            raise ValueError(f"step {step_id} of {self.id} is kept against {ref['b']}, which is missing")
        full = {**kept, "prompt_token_ids": np.concatenate([sequence[: ref["n"]], unpack_hex(ref["p"])])}
        self._full[step_id] = full
        return full

    def _sequence(self, step_id: str) -> np.ndarray | None:
        base = self.base(step_id)
        if base is None:
            return None
        return np.concatenate([np.asarray(base["prompt_token_ids"], dtype=np.int32),
                               np.asarray(base["response_token_ids"], dtype=np.int32)])

    def _compact(self, step_id: str, base: dict[str, Any]) -> dict[str, Any]:
        """The fact to keep: a prompt that starts with what a step at the index before it sent and
        received (the conversation so far) is kept as the part beyond that, so a trajectory keeps each
        token id about once instead of once per later turn."""
        prompt = np.asarray(base["prompt_token_ids"], dtype=np.int32)
        for candidate in sorted(self.state.at(base["step_index"] - 1)):
            sequence = self._sequence(candidate) if candidate != step_id else None
            if sequence is None:
                continue
            shared = shared_prefix(sequence, prompt)
            if shared >= MIN_SHARED:
                return {**base, "prompt_token_ids": {"b": candidate, "n": shared,
                                                     "p": pack_ints(prompt[shared:]).hex()}}
        return base

    def _keep_whole(self, step_id: str) -> None:
        """Steps kept against ``step_id``, whose fact is about to change, are kept whole first."""
        base = self.base(step_id)
        if base is None:
            return
        for later in self.state.at(base["step_index"] + 1):
            kept = self._kept(later)
            if kept is not None and isinstance(kept["prompt_token_ids"], dict) \
                    and kept["prompt_token_ids"]["b"] == step_id:
                whole = self.base(later)
                assert whole is not None
                self.record.steps[later].chunk = self._place(later, whole)

    def step_state(self, step_id: str) -> StepState:
        entry = self.record.steps.get(step_id)
        if entry is None:
            return StepState()
        return StepState(self.base(step_id), entry.base_digest, entry.base_digests, entry.feedback,
                         entry.superseded, entry.revived)

    def store(self, step_id: str, state: StepState, base_changed: bool) -> None:
        """Keep ``state`` (after the join changed it); its fact goes into the tail (or a chunk) when new."""
        entry = self.record.steps.setdefault(step_id, StepEntry())
        entry.base_digest, entry.base_digests = state.base_digest, state.base_digests
        entry.feedback, entry.superseded, entry.revived = state.feedback, state.superseded, state.revived
        if base_changed and state.base is not None:
            if entry.chunk is not None:
                self._keep_whole(step_id)
            self._full.pop(step_id, None)
            entry.chunk = self._place(step_id, self._compact(step_id, state.base))

    def _place(self, step_id: str, base: dict[str, Any]) -> int:
        """Keep a fact in the tail, or in a chunk; where it went."""
        record = self.record
        replaced = record.tail.pop(step_id, None)
        if replaced is not None:
            record.tail_tokens -= _tokens(replaced)
        tokens = _tokens(base)
        if tokens > TAIL_TOKENS:
            return self._add_to_chunk(step_id, base, tokens)
        if record.tail_tokens + tokens > TAIL_TOKENS:
            self._seal_tail()
        record.tail[step_id] = base
        record.tail_tokens += tokens
        return TAIL

    def _seal_tail(self) -> None:
        """Move the tail's facts into a chunk of their own, written once."""
        record = self.record
        if record.tail:
            sealed, chunk = self._next_chunk()
            chunk.update(record.tail)
            for step_id in record.tail:
                record.steps[step_id].chunk = sealed
        record.tail, record.tail_tokens = {}, 0

    def _add_to_chunk(self, step_id: str, base: dict[str, Any], tokens: int) -> int:
        record = self.record
        if record.open_chunk is None or record.open_tokens + tokens > CHUNK_TOKENS:
            record.open_chunk, _ = self._next_chunk()
            record.open_tokens = 0
        record.open_tokens += tokens
        chunk = self._load(record.open_chunk)
        assert chunk is not None  # created just above, or earlier in this checkpoint
        chunk[step_id] = base
        return record.open_chunk

    def _next_chunk(self) -> tuple[int, Chunk]:
        """A new, empty chunk under the next free number."""
        number = self.record.chunks
        self.record.chunks += 1
        return number, self._new(number)

    def tokens_of(self, step_id: str) -> tuple[TokenIds, TokenIds] | None:
        base = self.base(step_id)
        return None if base is None else (base["prompt_token_ids"], base["response_token_ids"])
