"""A tree taken apart for a save: its leaves, its structure encoded as the file holds it, and each leaf's path.

The structure is encoded when the save is asked for, whatever runs later: a background save then writes the static
data (hyperparameters, a class's static fields) as they were at the call, however the caller changes its objects
after ``save`` returns, and never rebuilds the caller's classes around the host copies of their arrays.

>>> import jax.numpy as jnp
>>> from jaxstow._write.taken_apart import take_apart
>>> sizes = [16, 16]
>>> parts = take_apart({"sizes": sizes, "w": jnp.ones(2)}, file="model.jxs")
>>> sizes.append(99)
>>> parts.paths, parts.structure == take_apart({"sizes": [16, 16], "w": jnp.ones(2)}, file="").structure
(['sizes/0', 'sizes/1', 'w'], True)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, TypeVar

import jax

from jaxstow._format.keypaths import flatten_with_paths
from jaxstow._format.manifest import container_paths
from jaxstow._format.skeleton import encode_treedef
from jaxstow._write.flarejax_modules import refuse_unrebuildable_modules
from jaxstow._write.flattening import cycle_error, flatten
from jaxstow.errors import FormatError

__all__ = ["TakenApart", "check_unique_paths", "take_apart"]

T = TypeVar("T")


@dataclass(frozen=True)
class TakenApart:
    """A tree's leaves (in jax's order), its encoded structure (JSON of its own) and each leaf's path."""

    leaves: list[Any]
    structure: Any
    paths: list[str]

    def with_leaves(self, leaves: list[Any]) -> TakenApart:
        """The same tree with other leaves in their places (held on the host, say)."""
        return TakenApart(leaves, self.structure, self.paths)

    def computed(self) -> TakenApart:
        """The same, once every array of it is computed: the wait for them, done before the collector is paused
        (:mod:`jaxstow._util.gc_pause` pauses it around jaxstow's own objects only)."""
        for leaf in self.leaves:
            if isinstance(leaf, jax.Array) and not leaf.is_deleted():
                leaf.block_until_ready()
        return self


def take_apart(
    tree: Any, *, file: str, paused: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext
) -> TakenApart:
    """``tree`` taken apart; ``file`` names the destination in errors (a cycle, two leaves of one path). ``paused``
    is around the objects jaxstow builds of its structure, not around the tree's flatten functions (the caller's)."""
    leaves, treedef = flatten(tree, file=file)
    with paused():
        try:
            structure = encode_treedef(treedef, file=file or None)
        except RecursionError:
            raise cycle_error(file) from None
        paths = _named(lambda: container_paths(structure), file)
    if paths is None:  # the tree has nodes that name their children themselves (attributes, fields, ...)
        refuse_unrebuildable_modules(tree, file=file or None)
        paths, leaves, _ = _named(lambda: flatten_with_paths(tree), file)
    check_unique_paths(paths, file=file)
    return TakenApart(leaves, structure, paths)


def _named(paths: Callable[[], T], file: str) -> T:
    """``paths()``, which names leaves by their keys; a key too long to be a path is a :class:`FormatError`."""
    try:
        return paths()
    except ValueError as error:  # str() of an int key beyond Python's limit of digits
        raise FormatError(
            f"a dict key of the tree cannot be a path: {error}; use shorter keys", file=file or None
        ) from None


def check_unique_paths(paths: list[str], *, file: str) -> None:
    """A :class:`FormatError` naming ``file`` and the path if two leaves have one path (a key ``"a/b"`` beside the
    key ``"b"`` under ``"a"``, or ``0`` beside ``"0"``): no file keeps them apart."""
    if len(set(paths)) == len(paths):
        return
    seen: dict[str, int] = {}
    for index, path in enumerate(paths):
        if path in seen:
            raise FormatError(
                f"leaves {seen[path]} and {index} of the tree both have the path {path!r}; rename a key so that "
                "every leaf has its own path",
                file=file or None,
                path=path,
            )
        seen[path] = index
