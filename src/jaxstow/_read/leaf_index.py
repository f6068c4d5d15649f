"""The leaves of a version 3 file, indexed by columns: a leaf's description is made only when it is asked for, and a
whole restore reads every leaf by columns, with no Python object per leaf but the array itself.

>>> import io, numpy as np, jaxstow
>>> from jaxstow._read.opened import OpenedFile
>>> from jaxstow._read.leaf_index import read_all
>>> from jaxstow._format.container import open_container
>>> from jaxstow._storage.opening import open_source
>>> buffer = io.BytesIO()
>>> jaxstow.save(buffer, {"w": np.arange(3.0), "n": 2})
>>> _ = buffer.seek(0)
>>> with OpenedFile(open_container(open_source(buffer))) as opened:
...     print(opened.stored["w"].shape, read_all(opened))
(3,) [2, array([0., 1., 2.])]
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

import numpy as np

from jaxstow._format.columns import KIND_NAMES, LeafColumns
from jaxstow._format.leaves import StoredLeaf, decode_value_entry
from jaxstow._format.reading import TensorSlot, read_tensors
from jaxstow._format.shards import Stored
from jaxstow._format.tensor_table import SlotTable
from jaxstow.errors import CorruptFileError

if TYPE_CHECKING:
    from jaxstow._read.opened import OpenedFile

__all__ = ["StoredLeaves", "read_all"]


class StoredLeaves(MutableMapping[str, Stored]):
    """The stored leaves of a version 3 file by path: those with details are made (and checked) when the file is
    opened, the others, stored exactly as their tensors, when first asked for."""

    def __init__(self, columns: LeafColumns, slots: Mapping[str, TensorSlot], made: dict[str, Stored]) -> None:
        self._columns = columns
        self._slots = slots
        self._made = made

    @functools.cached_property
    def _index(self) -> dict[str, int]:  # made when a leaf is first asked for: a whole restore never asks
        return dict(zip(self._columns.paths, range(len(self._columns.paths)), strict=True))

    def __getitem__(self, path: str) -> Stored:
        leaf = self._made.get(path)
        if leaf is None:
            i = self._index[path]
            if not self._columns.stored[i]:
                raise KeyError(path)
            slot = self._slots[path]
            kind = KIND_NAMES[self._columns.kinds[i]]
            leaf = self._made[path] = StoredLeaf(path, kind, slot.dtype, slot.shape, self._columns.checksum(i), None)
        return leaf

    def described(self) -> list[Stored]:
        """The leaves described so far: those with details (sharded leaves among them) and those asked for."""
        return list(self._made.values())

    def __setitem__(self, path: str, leaf: Stored) -> None:
        self._made[path] = leaf

    def __delitem__(self, path: str) -> None:
        raise TypeError("the leaves of a file cannot be removed")

    def __contains__(self, path: object) -> bool:
        i = self._index.get(path) if isinstance(path, str) else None
        return i is not None and self._columns.kinds[i] != "v"

    def __iter__(self) -> Iterator[str]:
        return (path for path, kind in zip(self._columns.paths, self._columns.kinds, strict=True) if kind != "v")

    def __len__(self) -> int:
        return len(self._columns.kinds) - self._columns.kinds.count("v")


def read_all(opened: OpenedFile) -> list[Any] | None:
    """Every leaf of a version 3 native file in leaf order (arrays as numpy, verified), read by columns; ``None``
    for a file this cannot read so (another container or version, sharded leaves, a memory map)."""
    container, columns = opened.container, opened.container.columns
    slots = container.slots
    source = getattr(container, "source", None)
    if (
        columns is None
        or not isinstance(slots, SlotTable)
        or source is None
        or opened.memory_mapped
        or "s" in columns.kinds
    ):
        return None
    paths = columns.stored_paths()
    rows = np.fromiter(map(slots.index.__getitem__, paths), np.int64, len(paths))
    row_list = rows.tolist()
    dtypes = [slots.dtypes[row] for row in row_list]
    shapes = [slots.shapes[row] for row in row_list]
    positions = np.flatnonzero(columns.stored).tolist()
    special = [(k, i) for k, i in enumerate(positions) if i in columns.entries or columns.kinds[i] != "a"]
    leaves = {k: opened.stored[columns.paths[i]] for k, i in special}
    for k, leaf in leaves.items():  # leaves stored as raw bytes have their dtype and shape in their details
        dtypes[k], shapes[k] = leaf.dtype, leaf.shape
    nbytes = slots.nbytes[rows]
    opened.on_read(int(nbytes.sum()))
    digests: list[str] = []
    arrays: list[Any] = read_tensors(source, slots.offsets[rows], nbytes, dtypes, shapes, digests)
    if digests != columns.checksums:
        k = next(k for k, (found, wanted) in enumerate(zip(digests, columns.checksums, strict=True)) if found != wanted)
        raise CorruptFileError(
            f"checksum mismatch (expected xxh3 {columns.checksums[k]}, found {digests[k]}): the file is corrupt",
            file=opened.file,
            path=paths[k],
        )
    for k, leaf in leaves.items():
        arrays[k] = opened.as_leaf(leaf, arrays[k])
    if len(positions) == len(columns.paths):
        return arrays
    values: list[Any] = [None] * len(columns.paths)
    for i, array in zip(positions, arrays, strict=True):
        values[i] = array
    for i, entry in columns.entries.items():
        if entry["kind"] == "value":
            values[i] = decode_value_entry(entry, file=opened.file)
    return values
