"""Incremental prefix-tree merge of one scope (a prompt group, else a trajectory).

The tree itself is ``prefix_tree.PrefixTree``; this module keeps what rebuilds it after a restart
(the merged steps' ids and parents; their tokens live in a second table, one entry per step, so a
table update stays small) and turns each merge into the node rows that changed.

Bound per scope: at most ``max_steps`` steps and ``max_tokens`` tokens (sum of the steps'
sequence lengths) are merged; later steps of a full scope are counted in ``skipped`` and not
merged, so state and the cost of a rebuild stay bounded.

Versions: ``len(steps) + len(parents)``, which grows with every change and ends the same in any
arrival order. A row carries the version at which its node last changed, plus the scope-wide
figures at that version: the pool takes the scope's figures from its highest-version row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from clawr1.prefix_tree import PrefixTree, StepTokens
from clawr1.schemas.batch import pack_ints, unpack_int_array
from clawr1.streams.turns import TokenIds


@dataclass(frozen=True)
class ScopeStep:
    """A tokenized step sent to its merge scope (the message on the internal scopes topic)."""

    scope_id: str
    scope_kind: str
    step_id: str
    prompt_ids: TokenIds
    response_ids: TokenIds
    parent_step_id: str | None
    updated_at_ms: int

    def tokens(self) -> StepTokens:
        return StepTokens(self.step_id, self.prompt_ids, self.response_ids, self.parent_step_id)

    def to_message(self) -> dict[str, Any]:
        """The fields as a ``scope_step`` work message carries them: token ids as hex of packed int32.
        Reading a GRPO rollout's 2,048 ids back into the tree's arrays took 3.2x as long from JSON lists
        as from hex, which costs ~10 us more to write; base64, a third smaller, decodes at half hex's
        speed."""
        return {**self.__dict__, "prompt_ids": _packed(self.prompt_ids),
                "response_ids": _packed(self.response_ids)}

    @classmethod
    def from_message(cls, fields: dict[str, Any]) -> ScopeStep:
        """A ``scope_step`` message's step; token ids as lists (older workers' messages) are read too."""
        return cls(**{**fields, "prompt_ids": _unpacked(fields["prompt_ids"]),
                      "response_ids": _unpacked(fields["response_ids"])})


def _packed(ids: TokenIds) -> str:
    return pack_ints(ids).hex()


def _unpacked(ids: str | list[int]) -> TokenIds:
    return unpack_int_array(bytes.fromhex(ids)) if isinstance(ids, str) else ids


@dataclass
class ScopeState:
    kind: str = ""
    steps: list[str] = field(default_factory=list)
    parents: dict[str, str] = field(default_factory=dict)
    skipped: int = 0
    updated_at_ms: int = 0

    @property
    def version(self) -> int:
        return len(self.steps) + len(self.parents)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> ScopeState:
        return cls(**data) if data else cls()


@dataclass(frozen=True)
class Bounds:
    max_steps: int
    max_tokens: int


@dataclass(frozen=True)
class Merge:
    outcome: str  # added | parent | duplicate | skipped
    rows: list[dict[str, Any]]

    @property
    def state_changed(self) -> bool:
        return self.outcome != "duplicate"


TokensOf = Callable[[str, PrefixTree], tuple[TokenIds, TokenIds] | None]


def rebuild(state: ScopeState, tokens_of: TokensOf) -> PrefixTree:
    """The scope's tree from its state and the stored tokens (``tokens_of(step_id, tree so far)``: a
    step's tokens may be kept as a difference to a step merged before it, ``token_entry``).

    The state and the tokens are two table writes; a crash can keep the first and lose the
    second. A step without tokens is then dropped from ``state`` (mutated), so its re-delivery,
    which the crash guarantees, merges it again.
    """
    tree = PrefixTree()
    for step_id in list(state.steps):
        tokens = tokens_of(step_id, tree)
        if tokens is None:
            state.steps.remove(step_id)
            state.parents.pop(step_id, None)
            continue
        tree.add(StepTokens(step_id, tokens[0], tokens[1], state.parents.get(step_id)))
    return tree


# A step kept as a difference to its base saves at least this many token ids, or is kept whole.
MIN_SHARED = 32


def token_entry(tree: PrefixTree, step: ScopeStep, base: str | None) -> list[Any] | dict[str, Any]:
    """How a merged step's tokens are kept for rebuilding its scope's tree: as the part of its prompt
    that goes beyond what it shares with ``base`` (a step merged before it: its parent, or the scope's
    first step, whose prompt GRPO siblings repeat), plus its reply. Kept whole, every turn of a rollout
    stored the whole conversation again, and every sibling the shared prompt again.
    ``{"b": base, "n": shared prefix length, "p": the rest of the prompt, "r": the reply}`` (packed
    hex), or ``[prompt, reply]`` whole."""
    prompt = np.asarray(step.prompt_ids)
    if base is not None and base != step.step_id and base in tree:
        shared = shared_prefix(tree.rebuild(base), prompt)
        if shared >= MIN_SHARED:
            return {"b": base, "n": shared, "p": _packed(prompt[shared:]), "r": _packed(step.response_ids)}
    return [step.prompt_ids, step.response_ids]


def entry_tokens(entry: list[Any] | dict[str, Any], tree: PrefixTree) -> tuple[TokenIds, TokenIds] | None:
    """The tokens ``token_entry`` kept, read against the tree being rebuilt (which holds the base, merged
    before the step); None when the base is not there (dropped as ``rebuild`` says)."""
    if isinstance(entry, list):
        return entry[0], entry[1]
    if entry["b"] not in tree:
        return None
    prefix = tree.rebuild(entry["b"])[: entry["n"]]
    return np.concatenate([prefix, unpack_hex(entry["p"])]), unpack_hex(entry["r"])


def shared_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading token ids ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def unpack_hex(ids: str) -> np.ndarray:
    """Token ids packed as int32 and written as hex (``_packed``)."""
    return np.asarray(unpack_int_array(bytes.fromhex(ids)), dtype=np.int32)


def _rows(scope_id: str, state: ScopeState, tree: PrefixTree, node_ids: set[int]) -> list[dict[str, Any]]:
    return [
        {
            "scope_id": scope_id,
            "scope_kind": state.kind,
            "node_id": str(n.node_id),
            "parent_node_id": None if n.parent_id is None else str(n.parent_id),
            "depth_start": n.start_depth,
            "token_ids": n.tokens,  # packed from the array (``schemas.batch``): no list on the way
            "step_ids": list(n.step_ids),
            "version": state.version,
            "total_tokens": tree.total_tokens,
            "tree_tokens": tree.tree_tokens,
            "forks": tree.forks,
            "updated_at_ms": state.updated_at_ms,
        }
        for n in tree.nodes_by_id(node_ids)
    ]


def merge_step(state: ScopeState, tree: PrefixTree, step: ScopeStep, bounds: Bounds) -> Merge:
    """Merge ``step`` into ``tree``/``state`` (both mutated) and return the rows to publish.

    A step merged before (a re-delivery) changes nothing and re-publishes its path's rows, which
    repairs rows lost in a crash; the same step id with other tokens raises ``ValueError``.
    """
    state.kind = step.scope_kind
    sequence = len(step.prompt_ids) + len(step.response_ids)
    if step.step_id in tree:
        tree.add(step.tokens())  # raises on other tokens
        if step.parent_step_id is None or state.parents.get(step.step_id) == step.parent_step_id:
            return Merge("duplicate", _rows(step.scope_id, state, tree, set(tree.path(step.step_id))))
        state.parents[step.step_id] = step.parent_step_id
        state.updated_at_ms = max(state.updated_at_ms, step.updated_at_ms)
        return Merge("parent", _rows(step.scope_id, state, tree, set(tree.path(step.step_id))))
    if len(state.steps) >= bounds.max_steps or tree.total_tokens + sequence > bounds.max_tokens:
        state.skipped += 1
        return Merge("skipped", [])
    changed = tree.add(step.tokens())
    state.steps.append(step.step_id)
    if step.parent_step_id is not None:
        state.parents[step.step_id] = step.parent_step_id
    state.updated_at_ms = max(state.updated_at_ms, step.updated_at_ms)
    return Merge("added", _rows(step.scope_id, state, tree, changed))
