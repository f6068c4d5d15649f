"""A tree in memory, the tree of another library's file (``from_format=``), restored as a jaxstow file's tree is.

:class:`TreeInMemory` is an opened file whose leaves are in memory: each array (numpy, or a ``jax.Array``, brought to
the host) a stored leaf read as it is, never encoded, copied or checksummed again; every other leaf a value, as it
is; the structure the tree's own. A restore from it takes every option of :func:`jaxstow.load` (``like``,
``as_numpy``, ``sharding``, ``select``, ...), and its errors name the file the tree came from.

>>> import numpy as np

>>> from jaxstow._read.memory_tree import TreeInMemory
>>> from jaxstow._read.restore import restore
>>> weights = np.arange(3.0)
>>> with TreeInMemory({"w": weights, "step": 7}, name="params.msgpack") as opened:
...     restored = restore(opened, as_numpy=True)
>>> restored, restored["w"] is weights
({'step': 7, 'w': array([0., 1., 2.])}, True)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.tree_util import PyTreeDef

try:
    from numpy.lib.array_utils import byte_bounds
except ImportError:  # numpy before 2
    from numpy import byte_bounds  # type: ignore[attr-defined,no-redef]

from jaxstow._format.keypaths import flatten_with_paths
from jaxstow._format.leaves import StoredLeaf, key_impl_name
from jaxstow._format.manifest import LeafColumns
from jaxstow._format.tensor_reads import TensorSlot, Verify
from jaxstow._read.opened import OpenedFile
from jaxstow.errors import FormatError

__all__ = ["TreeInMemory"]


class _Arrays:
    """The arrays of a tree in memory as a container whose tensors are read as they are (named ``file`` in errors)."""

    manifest: dict[str, Any] | None = None
    columns: LeafColumns | None = None

    def __init__(self, arrays: dict[str, np.ndarray], file: str) -> None:
        self.file = file
        self.metadata: dict[str, str] = {}
        self._arrays = arrays

    @property
    def slots(self) -> Mapping[str, TensorSlot]:
        return {}  # no tensor is laid out in a file: leaves are read whole, from memory

    def read(self, names: Sequence[str], verify: Verify | None = None) -> dict[str, np.ndarray]:
        del verify  # held in memory since they were read, with no checksum to compare
        return {name: self._arrays[name] for name in names}

    def close(self) -> None:
        self._arrays = {}


class TreeInMemory(OpenedFile):
    """``tree`` as an opened file named ``name``: its arrays stored leaves, its other leaves values.

    A :class:`~jaxstow.errors.FormatError` naming the file if two leaves have one path (keys such as ``0`` and
    ``"0"``), which a restore could not tell apart.
    """

    def __init__(self, tree: Any, *, name: str) -> None:
        paths, leaves, treedef = flatten_with_paths(tree)
        arrays: dict[str, np.ndarray] = {}
        stored: dict[str, StoredLeaf] = {}
        self._values: dict[str, Any] = {}
        for path, leaf in zip(paths, leaves, strict=True):
            if path in arrays or path in self._values:
                raise FormatError("holds two leaves at this path (keys that read the same)", file=name, path=path)
            if isinstance(leaf, jax.Array) and jax.numpy.issubdtype(leaf.dtype, jax.dtypes.prng_key):
                array = arrays[path] = np.asarray(jax.random.key_data(leaf))
                stored[path] = StoredLeaf(path, "key", array.dtype, array.shape, None, key_impl_name(leaf.dtype))
            elif isinstance(leaf, np.ndarray | np.generic | jax.Array):
                array = arrays[path] = np.asarray(leaf)
                kind = "npscalar" if isinstance(leaf, np.generic) else "array"
                stored[path] = StoredLeaf(path, kind, array.dtype, array.shape, None, None)
            else:
                self._values[path] = leaf
        _unshared(arrays)
        super().__init__(_Arrays(arrays, name), leaves=stored)
        self.leaf_order = tuple(paths)
        self.value_entries = {path: {"path": path, "kind": "value"} for path in self._values}
        self._treedef = treedef

    def treedef(self) -> PyTreeDef:
        """The tree's own structure."""
        return self._treedef

    def value(self, path: str) -> Any:
        """The value at ``path``, as the tree holds it."""
        return self._values[path]


def _unshared(arrays: dict[str, np.ndarray]) -> None:
    """Copy each array whose memory an array before it holds too (tied weights, views of one tensor in a torch
    file): a restored leaf written to must not change another, as no two leaves of a jaxstow file share memory."""
    end = -1
    for low, high, path in sorted((*byte_bounds(array), path) for path, array in arrays.items() if array.nbytes):
        if low < end:
            arrays[path] = arrays[path].copy()
        end = max(end, high)
