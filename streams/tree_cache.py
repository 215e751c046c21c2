"""Prefix trees kept built between checkpoints, so that a merge scope's next step does not rebuild its
tree from the stored state: the least recently merged scope is let go first (``tree_cache_size``)."""

from __future__ import annotations

from cachetools import LRUCache

from clawr1.prefix_tree import PrefixTree
from clawr1.streams.prefix_scope import ScopeState, TokensOf, rebuild


class TreeCache:
    """A scope's tree with the scope version it was built for; a tree that does not match the stored
    state (a merge that failed half-way, state that moved on in another worker) is rebuilt from it."""

    def __init__(self, size: int) -> None:
        self._trees: LRUCache[str, tuple[int, PrefixTree]] = LRUCache(maxsize=size)

    def take(self, scope_id: str, state: ScopeState, tokens_of: TokensOf) -> PrefixTree:
        """The scope's tree, out of the cache: ``keep`` puts it back after a successful merge only."""
        cached = self._trees.pop(scope_id, None)
        if cached is not None and cached[0] == state.version and len(cached[1]) == len(state.steps):
            return cached[1]
        return rebuild(state, tokens_of)

    def keep(self, scope_id: str, state: ScopeState, tree: PrefixTree) -> None:
        self._trees[scope_id] = (state.version, tree)

    def forget(self, scope_id: str) -> None:
        """The scope's state expired: its tree goes too."""
        self._trees.pop(scope_id, None)
