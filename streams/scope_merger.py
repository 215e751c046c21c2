"""Published steps merged into the prefix tree of their merge scope (``clawr1.streams.prefix_scope``).

A trajectory's scope lives in its record; a prompt group's in ``Namespace.GROUP`` (the scope, where
each step's tokens are) and ``Namespace.GROUP_CHUNK`` (the tokens, a chunk per checkpoint that added
some). Trees stay built between checkpoints (``clawr1.streams.tree_cache``); the merge's rows go to the
outbox. Scopes whose state expired take no more steps: the pool holds the tree of the state that
expired, and a new one would contradict it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from clawr1.core.routing import home_partition
from clawr1.prefix_tree import PrefixTree
from clawr1.streams import expiry
from clawr1.streams.expiring import DeadLetter, Expiring
from clawr1.streams.group_record import GroupRecord
from clawr1.streams.namespaces import Namespace, chunk_name
from clawr1.streams.origin import Origin
from clawr1.streams.outbox import Outbox
from clawr1.streams.prefix_scope import (
    Bounds,
    Merge,
    ScopeState,
    ScopeStep,
    entry_tokens,
    merge_step,
    token_entry,
)
from clawr1.streams.store import Store
from clawr1.streams.trajectory_record import Trajectory
from clawr1.streams.tree_cache import TreeCache
from clawr1.streams.turns import TokenIds

log = logging.getLogger(__name__)


@dataclass
class ScopeMerger:
    """Merges steps into their scope's tree; ``write_back`` stores the prompt groups a checkpoint changed."""

    store: Store
    partitions: int
    outbox: Outbox
    expiring: Expiring
    trees: TreeCache
    bounds: Bounds
    dead_letter: DeadLetter
    # scope id -> record: the prompt groups this checkpoint read (merged into, or named by a step)
    _groups: dict[str, GroupRecord] = field(default_factory=dict, init=False)
    _changed: set[str] = field(default_factory=set, init=False)  # those it writes back
    _open_groups: dict[str, int] = field(default_factory=dict, init=False)  # scope id -> chunk adding tokens

    def merge_trajectory(self, trajectory: Trajectory, step: ScopeStep, origin: Origin) -> None:
        """A failed merge is the prefix stage's dead letter, citing ``origin`` (the step was published)."""
        if trajectory.record.after_expiry:
            return
        try:
            record = trajectory.record
            state = record.scope or ScopeState()
            tree = self.trees.take(step.scope_id, state, lambda step_id, _tree: trajectory.tokens_of(step_id))
            merge = merge_step(state, tree, step, self.bounds)
            record.scope = state
            self._merged(step.scope_id, state, tree, merge)
        except Exception as exc:  # noqa: BLE001 - the step itself was published; only its merge failed
            log.exception("prefix merge of %s failed", step.step_id)
            self.dead_letter("prefix", f"{type(exc).__name__}: {exc}", origin)

    def group(self, scope_id: str) -> GroupRecord:
        """The prompt group's record, read once per checkpoint."""
        group = self._groups.get(scope_id)
        if group is None:
            part = home_partition(scope_id, self.partitions)
            data = self.store.get(part, Namespace.GROUP, scope_id)
            group = GroupRecord.from_json(data)
            if data is None and self.expiring.expired_here(part, scope_id):
                group.after_expiry = True
            self._groups[scope_id] = group
        return group

    def claim(self, scope_id: str, source: str, now: int) -> str:
        """The group's owner once ``source`` has named it: the source of the first step that did (since
        its state began: an owner expires with the group, ``clawr1.streams.ownership``). A group named
        again is written back only when its last write is half a TTL old: it lives while it is named,
        at most one write per group and half TTL for steps that merge nothing (no token ids)."""
        group = self.group(scope_id)
        if group.owner is None:
            group.owner = source
            self._changed.add(scope_id)
        elif now - (group.touched_ms or 0) >= self.expiring.clock.ttl_ms // 2:
            self._changed.add(scope_id)
        return group.owner

    def merge_group(self, step: ScopeStep) -> None:
        part = home_partition(step.scope_id, self.partitions)
        group = self.group(step.scope_id)
        self._changed.add(step.scope_id)
        if group.after_expiry:
            return
        state = ScopeState.from_json(group.scope)

        def chunk_of(n: int) -> str:
            return chunk_name(step.scope_id, n)

        def tokens_of(step_id: str, tree: PrefixTree) -> tuple[TokenIds, TokenIds] | None:
            n = group.where.get(step_id)
            chunk = None if n is None else self.store.get(part, Namespace.GROUP_CHUNK, chunk_of(n))
            entry = None if chunk is None else chunk.get(step_id)
            return None if entry is None else entry_tokens(entry, tree)

        tree = self.trees.take(step.scope_id, state, tokens_of)
        merge = merge_step(state, tree, step, self.bounds)
        if merge.outcome == "added":
            n = self._open_groups.get(step.scope_id)
            if n is None:
                n = self._open_groups[step.scope_id] = group.chunks
                group.chunks += 1
                self.store.put(part, Namespace.GROUP_CHUNK, chunk_of(n), {})
            base = step.parent_step_id if step.parent_step_id in tree else state.steps[0]
            chunk = self.store.get(part, Namespace.GROUP_CHUNK, chunk_of(n))
            chunk[step.step_id] = token_entry(tree, step, base)
            group.where[step.step_id] = n
        group.scope = state.to_json()
        self._merged(step.scope_id, state, tree, merge)

    def write_back(self, now: int) -> expiry.Checks:
        """Store the prompt groups this checkpoint changed, stamped ``now``; their expiry checks."""
        checks: expiry.Checks = []
        for scope_id in sorted(self._changed):
            group = self._groups[scope_id]
            part = home_partition(scope_id, self.partitions)
            group.touched_ms = now
            self.store.put(part, Namespace.GROUP, scope_id, group.to_json())
            checks.append((part, (expiry.GROUP, scope_id)))
        return checks

    def discard(self) -> None:
        self._groups.clear()
        self._changed.clear()
        self._open_groups.clear()

    def _merged(self, scope_id: str, state: ScopeState, tree: PrefixTree, merge: Merge) -> None:
        self.trees.keep(scope_id, state, tree)
        for row in merge.rows:
            self.outbox.prefix_node(row)
