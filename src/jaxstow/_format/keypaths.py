"""Pytrees as flat lists of ``(path, leaf)``, with paths as readable strings.

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

__all__ = ["flatten_with_paths", "key_to_str", "path_to_str"]


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
