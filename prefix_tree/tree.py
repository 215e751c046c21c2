"""Radix tree over token ids: the prefix-tree merge of the steps of one scope.

A scope is a GRPO prompt group when the steps have one, otherwise a trajectory. Its
steps share long token prefixes (every sample of a group starts with the same prompt,
every turn of a trajectory repeats the earlier turns), so the tree stores and a trainer
computes each distinct prefix once.

Shape of the tree:

* a node is a span of token ids below its parent; the root is implicit (depth 0, no
  tokens), so the nodes directly under it have ``parent_id`` None;
* a step is the root-to-node path that spells ``prompt_ids + response_ids``; nodes are
  split where a step ends, so every step ends exactly at a node's last token, even when
  it is a prefix of another step;
* node boundaries fall only where a step ends or where sequences branch, so the tree is
  the same whatever order the steps arrive in;
* rewards, advantages and logprobs are never stored here: they stay on steps.

Node ids are content ids, not insertion counters: the 63-bit BLAKE2b digest of the
full token prefix that ends at the node's last token. The same steps therefore give
the same ids in any insertion order, a node keeps its id when a later step splits it
(the split creates the upper half), and the ids fit both Int64 and UInt64 columns.

Comparisons run on numpy spans (one vectorized compare per node visited), never on
one Python object per token, so merging costs about one memory pass over the tokens.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Node", "PrefixTree", "StepTokens", "build_tree"]

TOKEN_DTYPE = np.dtype("<i8")
"""Every token array is little-endian int64: one canonical byte form for the node-id hash."""


def _as_token_array(ids: np.ndarray | Sequence[int], name: str) -> np.ndarray:
    """Return ``ids`` as a 1-D int64 array, rejecting shapes and values no tokenizer makes."""
    arr = np.asarray(ids)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        return np.empty(0, dtype=TOKEN_DTYPE)
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must hold integer token ids, got dtype {arr.dtype}")
    if arr.min() < 0:
        raise ValueError(f"{name} holds a negative token id")
    return np.ascontiguousarray(arr, dtype=TOKEN_DTYPE)


@dataclass(frozen=True, eq=False)
class StepTokens:
    """The token view of one step: what the tree merges and what packing trains on.

    ``parent_step_id`` names the earlier step of the same trajectory; it is used only to
    count forks (a later prompt that does not extend the earlier step token-for-token,
    e.g. after re-tokenization drift). The prompt must hold at least one token, since
    the first response token is predicted from the last prompt token.
    """

    step_id: str
    prompt_ids: np.ndarray | Sequence[int]
    response_ids: np.ndarray | Sequence[int]
    parent_step_id: str | None = None

    def __post_init__(self) -> None:
        prompt = _as_token_array(self.prompt_ids, "prompt_ids")
        if prompt.size == 0:
            raise ValueError(f"step {self.step_id!r}: prompt_ids is empty")
        object.__setattr__(self, "prompt_ids", prompt)
        object.__setattr__(self, "response_ids", _as_token_array(self.response_ids, "response_ids"))

    @property
    def sequence(self) -> np.ndarray:
        """``prompt_ids + response_ids`` (a new array each call: steps keep no second copy)."""
        return np.concatenate([self.prompt_ids, self.response_ids])

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def response_len(self) -> int:
        return len(self.response_ids)


@dataclass(frozen=True, eq=False)
class Node:
    """A read-only snapshot of one tree node.

    ``tokens`` covers depths ``[start_depth, start_depth + len(tokens))`` of every step
    below it; ``step_ids`` are the steps whose sequence ends at its last token.
    """

    node_id: int
    parent_id: int | None
    start_depth: int
    tokens: np.ndarray
    step_ids: tuple[str, ...]

    @property
    def end_depth(self) -> int:
        return self.start_depth + len(self.tokens)


class _TreeNode:
    """Mutable node; ``hasher`` holds the digest state of the prefix ending at this node."""

    __slots__ = ("node_id", "parent", "start_depth", "tokens", "children", "step_ids", "hasher")

    def __init__(
        self,
        parent: _TreeNode | None,
        start_depth: int,
        tokens: np.ndarray,
        hasher: Any,
    ) -> None:
        self.parent = parent
        self.start_depth = start_depth
        self.tokens = tokens
        self.children: dict[int, _TreeNode] = {}
        self.step_ids: list[str] = []
        self.hasher = hasher
        self.node_id = int.from_bytes(hasher.digest(), "big") >> 1

    @property
    def end_depth(self) -> int:
        return self.start_depth + len(self.tokens)


@dataclass
class _StepEntry:
    node: _TreeNode
    length: int
    parent_step_id: str | None


def _new_hasher() -> Any:
    return hashlib.blake2b(digest_size=8, person=b"clawr1-ptree")


def _extend(hasher: Any, tokens: np.ndarray) -> Any:
    out = hasher.copy()
    out.update(tokens.data)
    return out


def _first_mismatch(a: np.ndarray, b: np.ndarray) -> int:
    """Index of the first differing token of two equal-length spans, or their length."""
    neq = a != b
    i = int(neq.argmax())
    return i if neq[i] else len(a)


class PrefixTree:
    """Incremental radix tree of the steps of one merge scope.

    Streams call ``add`` as steps arrive. A step delivered again with the same tokens is
    a no-op (at-least-once delivery), except that a newly known ``parent_step_id`` is
    taken; a known step id with different tokens is refused.
    """

    def __init__(self) -> None:
        self._root = _TreeNode(None, 0, np.empty(0, dtype=TOKEN_DTYPE), _new_hasher())
        self._steps: dict[str, _StepEntry] = {}
        self._by_id: dict[int, _TreeNode] = {}
        self._total_tokens = 0
        self._tree_tokens = 0
        self._num_nodes = 0
        # Forks are judged as steps arrive, not recounted per read: a merge publishes ``forks`` on every
        # row it changes, and a recount walks every step of the scope (quadratic in a long trajectory).
        self._forks: set[str] = set()
        self._awaiting: dict[str, list[str]] = {}  # parent step id -> steps naming it that came first

    # ------------------------------------------------------------------ building
    def add(self, step: StepTokens) -> set[int]:
        """Insert one step, splitting nodes at branch points and at the step's end.

        Returns the ids of the nodes whose snapshot changed (new, split, or now ending the step), so
        an incremental merge publishes those without diffing whole trees; empty for a known step.
        """
        seq = step.sequence
        known = self._steps.get(step.step_id)
        if known is not None:
            if known.length != len(seq) or not np.array_equal(self.rebuild(step.step_id), seq):
                raise ValueError(f"step {step.step_id!r} was already added with other tokens")
            if step.parent_step_id is not None and step.parent_step_id != known.parent_step_id:
                known.parent_step_id = step.parent_step_id
                self._judge(step.step_id)
            return set()
        changed: set[int] = set()
        node, depth, length = self._continued(step.parent_step_id, seq)
        while depth < length:
            child = node.children.get(int(seq[depth]))
            if child is None:
                tokens = seq[depth:].copy()
                leaf = _TreeNode(node, depth, tokens, _extend(node.hasher, tokens))
                node.children[int(tokens[0])] = leaf
                self._by_id[leaf.node_id] = leaf
                self._tree_tokens += len(tokens)
                self._num_nodes += 1
                node, depth = leaf, length
                break
            span = child.tokens
            m = min(len(span), length - depth)
            j = _first_mismatch(span[:m], seq[depth : depth + m])
            if j < len(span):
                changed.add(child.node_id)  # the lower half: same id, new start and parent
                child = self._split(child, j)
                changed.add(child.node_id)
            node, depth = child, depth + j
        node.step_ids.append(step.step_id)
        changed.add(node.node_id)
        self._steps[step.step_id] = _StepEntry(node, length, step.parent_step_id)
        self._total_tokens += length
        self._judge(step.step_id)
        for waiting in self._awaiting.pop(step.step_id, ()):
            self._judge(waiting)  # by the parent it names now, whichever that is
        return changed

    def _continued(self, parent_step_id: str | None, seq: np.ndarray) -> tuple[_TreeNode, int, int]:
        """Where a walk down for ``seq`` starts: below its parent step when that step's sequence is its
        prefix (the usual next turn: one compare instead of a node-by-node walk as deep as the
        trajectory), else at the root. Both walks end alike: the parent's path has nothing to split."""
        if parent_step_id is None or (parent := self._steps.get(parent_step_id)) is None:
            return self._root, 0, len(seq)
        if parent.length <= len(seq) and np.array_equal(self.rebuild(parent_step_id), seq[:parent.length]):
            return parent.node, parent.length, len(seq)
        return self._root, 0, len(seq)

    def _judge(self, step_id: str) -> None:
        """Whether the step is a fork, once its parent is here (else it waits for it). A step's verdict
        never changes after that: tokens are fixed, and a split keeps every node's ancestors."""
        entry = self._steps[step_id]
        self._forks.discard(step_id)
        if entry.parent_step_id is None:
            return
        parent = self._steps.get(entry.parent_step_id)
        if parent is None:
            self._awaiting.setdefault(entry.parent_step_id, []).append(step_id)
        elif not self._is_on_path(parent.node, entry.node):
            self._forks.add(step_id)

    def _split(self, node: _TreeNode, offset: int) -> _TreeNode:
        """Cut ``node`` after ``offset`` tokens; return the new upper half.

        The lower half keeps the node object, its id and the steps ending there, since
        its prefix still ends at the same depth.
        """
        parent = node.parent
        assert parent is not None  # the root is never split: it has no tokens
        head = node.tokens[:offset]
        upper = _TreeNode(parent, node.start_depth, head, _extend(parent.hasher, head))
        self._by_id[upper.node_id] = upper
        parent.children[int(head[0])] = upper
        node.tokens = node.tokens[offset:]
        node.start_depth += offset
        node.parent = upper
        upper.children[int(node.tokens[0])] = node
        self._num_nodes += 1
        return upper

    # ------------------------------------------------------------------ reading
    def __len__(self) -> int:
        return len(self._steps)

    def __contains__(self, step_id: object) -> bool:
        return step_id in self._steps

    @property
    def step_ids(self) -> list[str]:
        """Step ids in insertion order."""
        return list(self._steps)

    def _entry(self, step_id: str) -> _StepEntry:
        try:
            return self._steps[step_id]
        except KeyError:
            raise KeyError(f"unknown step {step_id!r}") from None

    def _path_nodes(self, step_id: str) -> list[_TreeNode]:
        out: list[_TreeNode] = []
        node: _TreeNode | None = self._entry(step_id).node
        while node is not None and node is not self._root:
            out.append(node)
            node = node.parent
        out.reverse()
        return out

    def path(self, step_id: str) -> list[int]:
        """Node ids from the root's child down to the node where the step ends."""
        return [n.node_id for n in self._path_nodes(step_id)]

    def rebuild(self, step_id: str) -> np.ndarray:
        """The step's ``prompt_ids + response_ids``, read back from the tree alone."""
        parts = [n.tokens for n in self._path_nodes(step_id)]
        return np.concatenate(parts) if parts else np.empty(0, dtype=TOKEN_DTYPE)

    def _dfs(self) -> list[_TreeNode]:
        """Nodes in depth-first order, children by first token: independent of insertion order."""
        out: list[_TreeNode] = []
        stack = [self._root.children[t] for t in sorted(self._root.children, reverse=True)]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children[t] for t in sorted(node.children, reverse=True))
        return out

    @property
    def nodes(self) -> list[Node]:
        """Snapshots of all nodes in depth-first order (children sorted by first token)."""
        return [self._snapshot(n) for n in self._dfs()]

    def nodes_by_id(self, node_ids: set[int]) -> list[Node]:
        """Snapshots of these nodes, without walking the tree; in depth-first order when they are what
        one ``add`` changed or one step's path (all on one path, plus a split's lower half)."""
        picked = [self._by_id[i] for i in node_ids]
        picked.sort(key=lambda n: (n.start_depth, int(n.tokens[0])))
        return [self._snapshot(n) for n in picked]

    def _snapshot(self, n: _TreeNode) -> Node:
        tokens = n.tokens.view()
        tokens.flags.writeable = False
        parent_id = None if n.parent is self._root or n.parent is None else n.parent.node_id
        return Node(n.node_id, parent_id, n.start_depth, tokens, tuple(n.step_ids))

    @property
    def num_nodes(self) -> int:
        return self._num_nodes

    @property
    def total_tokens(self) -> int:
        """Sum of the steps' full sequence lengths: what running each step alone costs."""
        return self._total_tokens

    @property
    def tree_tokens(self) -> int:
        """Tokens held by the tree: the number of distinct non-empty prefixes of the steps."""
        return self._tree_tokens

    @property
    def savings_ratio(self) -> float:
        """``total_tokens / tree_tokens`` (4.0: the tree computes a quarter); 1.0 when empty."""
        return self._total_tokens / self._tree_tokens if self._tree_tokens else 1.0

    @property
    def fork_step_ids(self) -> list[str]:
        """Steps whose parent step (present in this tree) is not a prefix of their sequence.

        A parent that has not arrived yet, or lives in another scope, is not judged, so
        the count can grow as late steps come in.
        """
        return sorted(self._forks)

    @property
    def forks(self) -> int:
        return len(self._forks)

    @staticmethod
    def _is_on_path(ancestor: _TreeNode, node: _TreeNode) -> bool:
        """Whether ``ancestor`` is ``node`` or one of its ancestors (prefix test without tokens)."""
        end = ancestor.end_depth
        cur: _TreeNode | None = node
        while cur is not None and cur.end_depth >= end:
            if cur is ancestor:
                return True
            cur = cur.parent
        return False

    def summary(self) -> dict[str, float | int]:
        """The merge figures the pool records per scope."""
        return {
            "num_steps": len(self._steps),
            "num_nodes": self._num_nodes,
            "total_tokens": self._total_tokens,
            "tree_tokens": self._tree_tokens,
            "savings_ratio": self.savings_ratio,
            "forks": self.forks,
        }

    def to_rows(self, scope_id: str) -> list[dict[str, Any]]:
        """One plain dict per node, depth-first, for the pool writer.

        ``parent_node_id`` is None for nodes directly under the root.
        """
        return [
            {
                "scope_id": scope_id,
                "node_id": n.node_id,
                "parent_node_id": n.parent_id,
                "depth_start": n.start_depth,
                "token_ids": n.tokens.tolist(),
                "step_ids": list(n.step_ids),
            }
            for n in self.nodes
        ]


def build_tree(steps: Iterable[StepTokens]) -> PrefixTree:
    """Merge ``steps`` into a fresh tree (the batch form of repeated ``add``)."""
    tree = PrefixTree()
    for step in steps:
        tree.add(step)
    return tree
