"""Pytrees as flat lists of ``(path, leaf)``, with paths as readable strings; the leaf paths of a saved structure.

A path joins the keys from the root with ``/``: dict keys, sequence indices, attribute and field names.

>>> import jax.numpy as jnp
>>> from jaxstow._format.keypaths import flatten_with_paths
>>> paths, leaves, treedef = flatten_with_paths({"dense": {"kernel": jnp.ones(2), "bias": 0.0}, "layers": [1, 2]})
>>> paths
['dense/bias', 'dense/kernel', 'layers/0', 'layers/1']
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
from jax.tree_util import DictKey, FlattenedIndexKey, GetAttrKey, PyTreeDef, SequenceKey

JSON = Any

__all__ = ["container_paths", "flatten_with_paths", "key_to_str", "path_to_str"]


def key_to_str(key: Any) -> str:
    """One key of a jax key path as text: ``'kernel'``, ``'0'``."""
    if isinstance(key, DictKey):
        return str(key.key)
    if isinstance(key, SequenceKey):
        return str(key.idx)
    if isinstance(key, GetAttrKey):
        return str(key.name)
    if isinstance(key, FlattenedIndexKey):
        return str(key.key)
    name = getattr(key, "name", None)
    return str(name) if name is not None else str(getattr(key, "key", key))


def path_to_str(path: Sequence[Any]) -> str:
    """A jax key path as text: ``(DictKey('dense'), DictKey('kernel'))`` -> ``'dense/kernel'``."""
    return "/".join([str(key.key) if type(key) is DictKey else key_to_str(key) for key in path])


def flatten_with_paths(tree: Any) -> tuple[list[str], list[Any], PyTreeDef]:
    """Flatten ``tree`` into its leaf paths, its leaves and its structure, in jax's leaf order."""
    with_paths, treedef = jax.tree_util.tree_flatten_with_path(tree)
    return [path_to_str(path) for path, _ in with_paths], [leaf for _, leaf in with_paths], treedef


def container_paths(structure: JSON) -> list[str] | None:
    """The leaf paths of an encoded structure made only of dicts with plain keys, lists, tuples and ``None``.

    Paths as :func:`path_to_str` writes them; ``None`` for a structure with other nodes, whose children jax names.

    >>> from jaxstow._format.skeleton import encode_treedef
    >>> container_paths(encode_treedef(jax.tree_util.tree_structure({"a": [1, None, {"b": 2}], "c": 3})))
    ['a/0', 'a/2/b', 'c']
    >>> container_paths("*")
    ['']
    """
    paths: list[str] = []
    return paths if _collect_paths(structure, None, paths) else None


def _collect_paths(node: JSON, path: str | None, paths: list[str]) -> bool:
    """Append the leaf paths under ``node`` (at ``path``, ``None`` at the root) to ``paths``, in leaf order.

    ``False`` for a node that is not a container :func:`container_paths` can name. The root is told apart from a
    node under an empty key, as jax does: ``{"": {"c": x}}`` names its leaf ``/c``.
    """
    if node == "*":
        paths.append(path or "")
        return True
    if node is None:
        return True
    if not isinstance(node, dict) or len(node) != 1:
        return False
    [(tag, children)] = node.items()
    if tag == "dict":
        named = children
        if any(isinstance(name, dict) for name, _ in named):  # keys tagged as floats, tuples, ...
            return False
    elif tag in ("list", "tuple"):
        named = enumerate(children)
    else:
        return False
    prefix = "" if path is None else f"{path}/"
    for name, child in named:
        if child == "*":  # most children are leaves: answered here, without a call
            paths.append(f"{prefix}{name}")
        elif not _collect_paths(child, f"{prefix}{name}", paths):
            return False
    return True
