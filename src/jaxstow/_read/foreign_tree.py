"""A tree read from another library's file (a PyTorch state dict, a flax msgpack file) made what jax holds: plain
dicts with keys that sort, lists and tuples, nested no deeper than a jaxstow file holds.

>>> from collections import OrderedDict
>>> from jaxstow._read.foreign_tree import plain_tree
>>> plain_tree(OrderedDict(b=[1, (2,)], a=3), "state.pt")
{'b': [1, (2,)], 'a': 3}
>>> deep = [0]
>>> for _ in range(500):
...     deep = [deep]
>>> plain_tree({"x": deep}, "deep.pt")
Traceback (most recent call last):
...
jaxstow.errors.FormatError: leaf 'x/0/0/...' of deep.pt: nests dicts and lists more than 400 levels deep, past what jaxstow holds
"""

from __future__ import annotations

from typing import Any

from jaxstow._format.json_values import MAX_NESTING
from jaxstow.errors import FormatError

__all__ = ["plain_tree", "within_nesting"]


def plain_tree(tree: Any, name: str, path: str = "", depth: int = 0) -> Any:
    """OrderedDicts as dicts, all the way down (torch's state dicts are OrderedDicts); a dict whose keys do not sort
    (``"weight"`` beside ``0``), which jax cannot hold, is a :class:`FormatError` naming its path in the file, as is a
    tree nested past what a jaxstow file holds (:func:`within_nesting`)."""
    if isinstance(tree, dict):
        within_nesting(depth, name, path)
        try:
            sorted(tree)
        except TypeError:
            kinds = sorted({type(key).__name__ for key in tree})
            raise FormatError(
                f"a dict whose keys are of types {kinds}, which do not sort, so jax cannot hold it",
                file=name,
                path=path,
            ) from None
        return {key: plain_tree(value, name, f"{path}/{key}".lstrip("/"), depth + 1) for key, value in tree.items()}
    if type(tree) in (list, tuple):
        within_nesting(depth, name, path)
        return type(tree)(
            plain_tree(value, name, f"{path}/{index}".lstrip("/"), depth + 1) for index, value in enumerate(tree)
        )
    return tree


def within_nesting(depth: int, name: str, path: str) -> None:
    """Refuse a dict or list ``depth`` containers deep past :data:`MAX_NESTING`, what a jaxstow file holds, before
    Python's recursion would run out (a torch or msgpack file nests as deep as it likes)."""
    if depth > MAX_NESTING:
        raise FormatError(
            f"nests dicts and lists more than {MAX_NESTING} levels deep, past what jaxstow holds",
            file=name,
            path=path or None,
        )
