"""A tree restored in part (``select=``) without the leaves it did not restore: dropped from dicts (those in lists
and tuples too), ``None`` elsewhere; a node left with none of its leaves goes as a whole.

>>> from jaxstow._read.pruning import SKIPPED, prune
>>> prune({"layers": [{"w": 1, "b": SKIPPED}, {"w": SKIPPED, "b": SKIPPED}], "opt": {"mu": SKIPPED, "count": None}})
{'layers': [{'w': 1}, None]}
>>> prune({"params": {"w": 1, "frozen": None}, "ema": None, "step": SKIPPED})   # what was chosen, whole
{'params': {'w': 1, 'frozen': None}}
"""

from __future__ import annotations

from typing import Any

import jax

__all__ = ["SKIPPED", "prune"]


class _Skipped:
    """Stands for a leaf that was not restored, while the tree is rebuilt and pruned."""

    def __repr__(self) -> str:
        return "<not restored>"


#: The leaf of a tree that was not restored.
SKIPPED = _Skipped()


def prune(tree: Any) -> Any:
    """``tree`` without the leaves not restored: dropped from dicts (those in lists too), ``None`` elsewhere; a node
    left with none of its leaves is dropped as a whole, with its children that hold none (``None``, ``{}``)."""
    if tree is SKIPPED:
        return SKIPPED
    if type(tree) in (dict, list, tuple):
        pruned = {key: prune(child) for key, child in (tree.items() if type(tree) is dict else enumerate(tree))}
        if any(child is SKIPPED for child in pruned.values()) and not any(
            child is not SKIPPED and jax.tree.leaves(child) for child in pruned.values()
        ):
            return SKIPPED
        if type(tree) is dict:  # where the selection left keys out, it leaves out those that hold no leaf too
            cut = any(child is SKIPPED for child in pruned.values())
            return {key: child for key, child in pruned.items() if child is not SKIPPED and not (cut and _empty(child))}
        return type(tree)(None if child is SKIPPED else child for child in pruned.values())
    leaves = jax.tree.leaves(tree)
    if leaves and all(leaf is SKIPPED for leaf in leaves):
        return SKIPPED
    return jax.tree.map(lambda leaf: None if leaf is SKIPPED else leaf, tree)


def _empty(tree: Any) -> bool:
    """Whether ``tree`` holds no leaf (``None``, ``{}``, ``()``)."""
    return not jax.tree.leaves(tree)
