"""A tree held for a save that finishes later: its structure encoded now, its arrays on the host, encoded when
written.

:func:`hold` runs on the caller's thread and does only what cannot wait: it takes the tree's structure and holds
every array on the host (zero-copy for CPU arrays, which also keeps a later donation from reusing their buffers).
:meth:`HeldTree.encode` and the writing run later, on a background writer's thread. With a
:class:`~jaxstow._write.host_budget.HostBudget`, arrays on an accelerator (and numpy arrays to copy) are registered
with the budget now and brought to the host by the writer instead, whole or in pieces, within the budget; sharded
arrays and PRNG keys on an accelerator make the budget wait for their encoding, which registers the shards it writes
with the budget (every process's, and its share of those that several processes hold, which it prints within the
budget) or reads them (PRNG keys). The caller waits for the budget's ``fetched``: once it is set, the save reads none of the caller's arrays.

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

from jaxstow._format.held_elsewhere import on_own_device
from jaxstow._format.leaves import EncodedValue, is_sharded
from jaxstow._format.per_process import held, is_per_process
from jaxstow._format.skeleton import encode_value
from jaxstow._write.array_details import array_details
from jaxstow._write.encoded import EncodedTree, encode_tree
from jaxstow._write.flattening import naming_deleted_arrays
from jaxstow._write.host_budget import HostBudget, on_host
from jaxstow._write.taken_apart import take_apart
from jaxstow.errors import JaxstowError

__all__ = ["HeldTree", "hold"]


class HeldTree:
    """A tree held for a later :func:`~jaxstow._write.encoded.encode_tree`: its structure and its leaves, arrays on the host."""

    def __init__(
        self, tree: Any, *, copy: bool, file: str, part: int | None = None, budget: HostBudget | None = None
    ) -> None:
        self._file = file
        self._part = part
        self._budget = budget
        self._ready: EncodedTree | None = None
        self._awaited = False  # the budget waits for this tree's encoding
        if copy:
            # Copies are taken now (within a budget: by the writer); encoding knows which stored leaves need one.
            self._ready = encode_tree(tree, copy=True, file=file, part=part, hosting=budget)
        else:
            # The structure now: static data as it is at the call, and no class rebuilt around host copies later.
            self._parts = take_apart(tree, file=file)
            leaves = self._parts.leaves
            self._details = array_details(leaves)  # held on the host, they are numpy arrays
            # A part after the first writes only its sharded leaves: the others are not registered to be fetched.
            with naming_deleted_arrays(lambda: self._parts.paths, leaves, file=file):
                self._leaves = _hold_on_host(leaves, keep=None if part else budget)
                # Sharded arrays and typed PRNG keys (which keep their kind in the file) stay JAX arrays, read when
                # encoded: on the host, from views of their buffers (else copies), which a later donation or
                # deletion of the caller's arrays does not reach; on an accelerator, the budget waits until they
                # are read.
                self._leaves = [
                    _guarded(leaf) if isinstance(leaf, jax.Array) and on_host(leaf) else leaf for leaf in self._leaves
                ]
                later = [leaf for leaf in self._leaves if isinstance(leaf, jax.Array)]
            if budget is not None and not all(on_host(leaf) for leaf in later):
                budget.wait_for_encoding()
                self._awaited = True
        if budget is not None:
            budget.start_rest_if_it_fits()

    def encode(self) -> EncodedTree:
        """The tree's :class:`~jaxstow._write.encoded.EncodedTree`; errors in the tree (an unsaveable leaf) surface here."""
        if self._ready is None:
            leaves = [leaf.array() if isinstance(leaf, _HostShards) else leaf for leaf in self._leaves]
            parts = self._parts.with_leaves(leaves)
            self._ready = encode_tree(
                parts, file=self._file, part=self._part, hosting=self._budget, details=self._details
            )
        if self._budget is not None:
            if self._awaited:
                self._awaited = False
                self._budget.encoded()
            self._budget.fetch_rest_if_it_fits()
        return self._ready


def hold(
    tree: Any, *, copy: bool = False, file: str = "", part: int | None = None, budget: HostBudget | None = None
) -> HeldTree:
    """Hold ``tree`` for a background save; only this part has to run on the caller's thread.

    JAX arrays are immutable: they are held as host views, with no copy on CPU, ``copy`` or not. ``copy=True`` copies
    the arrays the caller could change, for trees whose numpy buffers the caller will change: now, or, within a
    ``budget``, while written (the caller waiting for ``budget.fetched``). ``file`` names the destination in errors; ``part`` is this process's
    share of a tree saved by several (see :func:`~jaxstow._write.encoded.encode_tree`).

    >>> import numpy as np
    >>> from jaxstow._write.held import hold
    >>> weights = np.zeros(2)
    >>> held = hold({"w": weights}, copy=True)
    >>> weights[:] = 1
    >>> held.encode().leaves[0].array
    array([0., 0.])
    """
    return HeldTree(tree, copy=copy, file=file, part=part, budget=budget)


def _is_plain_array(leaf: Any) -> bool:
    """A JAX array of a numpy dtype: not a typed PRNG key or another extended dtype, which numpy cannot hold."""
    return isinstance(leaf, jax.Array) and isinstance(leaf.dtype, np.dtype)


def _is_key(leaf: Any) -> bool:
    return (
        isinstance(leaf, jax.Array)
        and not isinstance(leaf.dtype, np.dtype)
        and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)
    )


class _HostShards:
    """A JAX array in host memory, held as views of its shards' buffers: the views keep a donation from reusing the
    buffers, and :meth:`array` reads them even after the caller deleted the array (``delete()``)."""

    def __init__(self, leaf: jax.Array, views: list[np.ndarray], shardings: list[jax.sharding.Sharding]) -> None:
        self.shape, self.sharding = leaf.shape, leaf.sharding
        self.shards = list(zip(views, shardings, strict=True))

    def array(self) -> jax.Array:
        """The array again, over the same buffers (``device_put`` of a host view copies nothing on the CPU)."""
        shards = [jax.device_put(view, sharding) for view, sharding in self.shards]
        return jax.make_array_from_single_device_arrays(self.shape, self.sharding, shards)


def _guarded(leaf: jax.Array) -> _HostShards | jax.Array:
    """``leaf``, an array in host memory, as views of its buffers, which the save reads whatever the caller does to
    ``leaf`` later. Where numpy cannot view them (typed PRNG keys, sub-byte dtypes such as int4, whose host arrays
    are copies), a copy of ``leaf`` of the save's own, with its sharding, which no donation of the caller's reaches."""
    if _is_plain_array(leaf):
        buffers = [shard.data for shard in leaf.addressable_shards]
        if not buffers:  # on another process's devices: refused when encoded, naming them
            return leaf
        views = [np.asarray(data) for data in buffers]
        if all(view.ctypes.data == data.unsafe_buffer_pointer() for view, data in zip(views, buffers, strict=True)):
            return _HostShards(leaf, views, [data.sharding for data in buffers])
    copied: jax.Array = _copy(leaf)
    return copied


_copy = jax.jit(lambda leaf: leaf.copy())


def _hold_on_host(leaves: list[Any], *, keep: HostBudget | None) -> list[Any]:
    """Leaves with every plain JAX array on one device replaced by its host array.

    Those whose host copy costs memory within ``keep``, a budget, are registered with it instead (its writer fetches
    them). Transfers from accelerators overlap. Sharded arrays stay as they are (immutable), to be saved shard by shard.
    """
    kept_back = [None if keep is None else keep.defer(leaf, copy=False) for leaf in leaves]
    if jax.default_backend() != "cpu":
        for leaf, kept in zip(leaves, kept_back, strict=True):
            if kept is None and _is_plain_array(leaf):
                leaf.copy_to_host_async()
    return [
        kept
        if kept is not None
        else np.asarray(leaf)
        if _is_plain_array(leaf) and not is_sharded(leaf) and on_own_device(leaf)
        else held(leaf)
        if is_per_process(leaf)
        else _value_now(leaf)
        for leaf, kept in zip(leaves, kept_back, strict=True)
    ]


def _value_now(leaf: Any) -> Any:
    """A leaf as it is when the save is asked for: a value that is no array (an object of a registered class saved by
    its attributes, a ``functools.partial`` and its arguments, a number) is encoded now, so that the caller's changes
    after ``save`` returns are not saved; an array as it is.

    JAX arrays are immutable; numpy arrays and torch tensors that the caller will change need ``copy=True``.
    """
    if isinstance(leaf, jax.Array | np.ndarray | np.generic) or (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
        return leaf
    try:
        return EncodedValue(encode_value(leaf))
    except (JaxstowError, RecursionError):  # refused again when the tree is encoded, naming its leaf
        return leaf
