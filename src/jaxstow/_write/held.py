"""A tree held for a save that finishes later: its structure now, its arrays on the host, encoded when written.

:func:`hold` runs on the caller's thread and does only what cannot wait: it takes the tree's structure and holds
every array on the host (zero-copy for CPU arrays, which also keeps a later donation from reusing their buffers).
:meth:`HeldTree.encode` and the writing run later, on a background writer's thread.

>>> import io, jax.numpy as jnp, jaxstow
>>> from jaxstow._write.held import hold
>>> held = hold({"w": jnp.ones(2)})
>>> buffer = io.BytesIO()
>>> _ = held.encode().write(buffer); _ = buffer.seek(0)
>>> jaxstow.load(buffer)
{'w': Array([1., 1.], dtype=float32)}
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jaxstow._format.leaves import is_sharded
from jaxstow._format.per_process import held, is_per_process
from jaxstow._write.encoded import EncodedTree, encode_tree

__all__ = ["HeldTree", "hold"]


class HeldTree:
    """A tree held for a later :func:`~jaxstow._write.encoded.encode_tree`: its structure and its leaves, arrays on the host."""

    def __init__(self, tree: Any, *, copy: bool, file: str, part: int | None = None) -> None:
        self._file = file
        self._part = part
        self._ready: EncodedTree | None = None
        if copy:
            # Copies are taken now; encoding already knows how to copy every kind of stored leaf.
            self._ready = encode_tree(tree, copy=True, file=file, part=part)
            return
        leaves, self._treedef = jax.tree_util.tree_flatten(tree)
        self._leaves = _hold_on_host(leaves)
        # Typed PRNG keys stay JAX arrays (they keep their kind in the file); a host view of their data keeps a
        # later donation from reusing their buffers all the same.
        self._guards = [np.asarray(jax.random.key_data(leaf)) for leaf in leaves if _is_key(leaf)]

    def encode(self) -> EncodedTree:
        """The tree's :class:`~jaxstow._write.encoded.EncodedTree`; errors in the tree (an unsaveable leaf) surface here."""
        if self._ready is not None:
            return self._ready
        tree = jax.tree_util.tree_unflatten(self._treedef, self._leaves)
        return encode_tree(tree, file=self._file, part=self._part)


def hold(tree: Any, *, copy: bool = False, file: str = "", part: int | None = None) -> HeldTree:
    """Hold ``tree`` for a background save; only this part has to run on the caller's thread.

    JAX arrays are immutable: without ``copy`` they are held as host views, with no copy on CPU. ``copy=True`` copies
    every array now, for trees whose numpy buffers the caller will change. ``file`` names the destination in errors;
    ``part`` is this process's share of a tree saved by several (see :func:`~jaxstow._write.encoded.encode_tree`).

    >>> import numpy as np
    >>> from jaxstow._write.held import hold
    >>> weights = np.zeros(2)
    >>> held = hold({"w": weights}, copy=True)
    >>> weights[:] = 1
    >>> held.encode().leaves[0].array
    array([0., 0.])
    """
    return HeldTree(tree, copy=copy, file=file, part=part)


def _is_plain_array(leaf: Any) -> bool:
    """A JAX array of a numpy dtype: not a typed PRNG key or another extended dtype, which numpy cannot hold."""
    return isinstance(leaf, jax.Array) and isinstance(leaf.dtype, np.dtype)


def _is_key(leaf: Any) -> bool:
    return (
        isinstance(leaf, jax.Array)
        and not isinstance(leaf.dtype, np.dtype)
        and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)
    )


def _hold_on_host(leaves: list[Any]) -> list[Any]:
    """Leaves with every plain JAX array on one device replaced by its host array.

    Transfers from accelerators overlap. Sharded arrays stay as they are (immutable), to be saved shard by shard.
    """
    if jax.default_backend() != "cpu":
        for leaf in leaves:
            if _is_plain_array(leaf):
                leaf.copy_to_host_async()
    return [
        np.asarray(leaf)
        if _is_plain_array(leaf) and not is_sharded(leaf)
        else held(leaf)
        if is_per_process(leaf)
        else leaf
        for leaf in leaves
    ]
