"""Tree structures made only of dicts, lists, tuples and ``None``, the most common kind, built at once by jax.

A structure of such containers is turned into the containers themselves around placeholder leaves, and jax's own
flatten gives its tree structure in one call, instead of a node at a time.

>>> from jaxstow._format.plain_trees import plain_treedef
>>> plain_treedef({"dict": [["a", {"list": ["*", None]}], ["b", "*"]]}, 0)
PyTreeDef({'a': [*, None], 'b': *})
>>> plain_treedef({"dict": [["b", "*"], ["a", "*"]]}, 0) is None  # not in jax's order: for the node-by-node decoder
True
"""

from __future__ import annotations

from typing import Any

import jax
from jax.tree_util import PyTreeDef

from jaxstow._format.manifest import MAX_NESTING

__all__ = ["plain_treedef"]

_PLACEHOLDER = object()


def plain_treedef(data: Any, depth: int) -> PyTreeDef | None:
    """The tree structure of a well-formed encoded structure made only of plain containers.

    Well formed: dict keys plain strings or integers, sorted and unique as jax orders them, nesting within bounds
    (``depth`` JSON levels around it already). ``None`` otherwise, for the node-by-node decoder to build or to name what
    is wrong.
    """
    try:
        containers = _container(data, depth)
    except _NotPlain:
        return None
    return jax.tree.structure(containers, is_leaf=_is_placeholder)


def _is_placeholder(node: Any) -> bool:
    return node is _PLACEHOLDER


class _NotPlain(Exception):
    pass


def _container(data: Any, depth: int) -> Any:
    if data == "*":
        return _PLACEHOLDER
    if data is None:
        return None
    if depth > MAX_NESTING or type(data) is not dict or len(data) != 1:
        raise _NotPlain
    [(tag, items)] = data.items()
    if type(items) is not list:
        raise _NotPlain
    if tag == "dict":
        if not (set(map(type, items)) <= {list} and set(map(len, items)) <= {2}):
            raise _NotPlain
        keys = [pair[0] for pair in items]
        kinds = set(map(type, keys))
        if not (kinds <= {str} or kinds <= {int}) or keys != sorted(keys) or len(set(keys)) != len(keys):
            raise _NotPlain
        return {key: _PLACEHOLDER if child == "*" else _container(child, depth + 3) for key, child in items}
    if tag in ("list", "tuple"):
        children = [_PLACEHOLDER if child == "*" else _container(child, depth + 2) for child in items]
        return children if tag == "list" else tuple(children)
    raise _NotPlain
