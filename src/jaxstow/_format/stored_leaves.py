"""The stored leaves of a version 3 file by path, each made from the manifest's columns when first asked for.

>>> import io, numpy as np, jaxstow
>>> saved = io.BytesIO(); jaxstow.save(saved, {"w": np.arange(3.0), "b": np.ones(2), "n": 2}); _ = saved.seek(0)
>>> leaves = jaxstow.open(saved).stored
>>> list(leaves), leaves.described(), leaves["w"].shape, [leaf.path for leaf in leaves.described()]
(['b', 'w'], [], (3,), ['w'])
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, MutableMapping

from jaxstow._format.leaves import StoredLeaf
from jaxstow._format.manifest import KIND_NAMES, LeafColumns
from jaxstow._format.shards import Stored
from jaxstow._format.tensor_reads import TensorSlot

__all__ = ["StoredLeaves"]

#: The kinds of leaf kept apart from the stored ones: values and per-process leaves.
_NOT_STORED = "vp"


class StoredLeaves(MutableMapping[str, Stored]):
    """The stored leaves of a version 3 file by path.

    Those with details are made (and checked) when the file is opened, the others, stored exactly as their tensors, when
    first asked for.
    """

    def __init__(self, columns: LeafColumns, slots: Mapping[str, TensorSlot], made: dict[str, Stored]) -> None:
        self._columns = columns
        self._slots = slots
        self._made = made

    def __getitem__(self, path: str) -> Stored:
        leaf = self._made.get(path)
        if leaf is None:
            i = self._columns.marks.index()[path]
            if not self._columns.stored[i] or self._columns.kinds[i] == "p":
                raise KeyError(path)
            slot = self._slots[path]
            kind = KIND_NAMES[self._columns.kinds[i]]
            checksum, blocks = self._columns.checksum(i), self._columns.blocks.get(str(i))
            leaf = self._made[path] = StoredLeaf(path, kind, slot.dtype, slot.shape, checksum, None, blocks=blocks)
        return leaf

    def described(self) -> list[Stored]:
        """The leaves described so far: those with details (sharded leaves among them) and those asked for."""
        return list(self._made.values())

    def __setitem__(self, path: str, leaf: Stored) -> None:
        self._made[path] = leaf

    def __delitem__(self, path: str) -> None:
        raise TypeError("the leaves of a file cannot be removed")

    def __contains__(self, path: object) -> bool:
        i = self._columns.marks.index().get(path) if isinstance(path, str) else None
        return i is not None and self._columns.kinds[i] not in _NOT_STORED

    def __iter__(self) -> Iterator[str]:
        return (
            path for path, kind in zip(self._columns.paths, self._columns.kinds, strict=True) if kind not in _NOT_STORED
        )

    def __len__(self) -> int:
        return len(self._columns.kinds) - sum(map(self._columns.kinds.count, _NOT_STORED))
