"""Prefix-tree merge: shared token prefixes of a scope's steps stored and trained once.

``tree`` builds the radix tree and its merge figures (what the pool records);
``packing`` lays a tree out as one training sequence with its attention rule.
"""

from clawr1.prefix_tree.packing import PackedTree, dense_mask, flex_mask_mod, pack_tree, tree_mask_mod
from clawr1.prefix_tree.tree import Node, PrefixTree, StepTokens, build_tree

__all__ = [
    "Node",
    "PackedTree",
    "PrefixTree",
    "StepTokens",
    "build_tree",
    "dense_mask",
    "flex_mask_mod",
    "pack_tree",
    "tree_mask_mod",
]
