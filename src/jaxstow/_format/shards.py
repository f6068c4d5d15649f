"""Sharded arrays as stored.

Each distinct shard a tensor of its own, with its box (start and stop per axis) in the whole array. A leaf's shards may
lie in several files (one per process that saved them).

>>> from jaxstow._format.shards import intersect
>>> intersect(((0, 4), (0, 8)), ((2, 6), (4, 8)))
((2, 4), (4, 8))
>>> intersect(((0, 4),), ((4, 8),)) is None
True
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from jaxstow._format.dtypes import checked_shape, dtype_from_name, name_of_dtype
from jaxstow._format.leaves import Entry, StoredLeaf, raw_leaf_layout
from jaxstow._format.replicas import Box
from jaxstow._format.sharding_description import check_sharding_description
from jaxstow._format.tensor_reads import TensorSlot
from jaxstow.errors import CorruptFileError, FormatError, excerpt

__all__ = [
    "Box",
    "ShardedLeaf",
    "Stored",
    "StoredShard",
    "check_coverage",
    "intersect",
    "sharded_leaf_from_entry",
]


class StoredShard(NamedTuple):
    """One stored shard: the tensor holding it, in which file (``source``, an index), and its box."""

    tensor: str
    source: int
    box: Box
    checksum: str | None
    #: Its blocks' checksums as the manifest gives them, checked where used (:mod:`~jaxstow._format.block_checksums`).
    blocks: object = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(stop - start for start, stop in self.box)


class ShardedLeaf(NamedTuple):
    """A validated manifest entry of a sharded array.

    Its global dtype and shape, its shards and the sharding it had (mesh shape, axis names and partition spec, when it
    had a mesh).
    """

    path: str
    kind: str
    dtype: np.dtype
    shape: tuple[int, ...]
    checksum: None
    impl: None
    shards: tuple[StoredShard, ...]
    sharding: dict[str, Any] | None

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


#: A leaf as the header describes it: stored whole, or as shards.
Stored = StoredLeaf | ShardedLeaf


def intersect(first: Box, second: Box) -> Box | None:
    """The box two boxes share, or ``None`` if they share no element."""
    box = tuple((max(a, c), min(b, d)) for (a, b), (c, d) in zip(first, second, strict=True))
    return box if all(start < stop for start, stop in box) else None


def sharded_leaf_from_entry(entry: Entry, slots: Mapping[str, TensorSlot], *, source: int, file: str) -> ShardedLeaf:
    """Check a ``sharded`` manifest entry against the tensors of its file; every number is validated before use."""
    path = entry["path"]
    name, shape, shards = entry.get("dtype"), entry.get("shape"), entry.get("shards")
    dtype = dtype_from_name(name) if isinstance(name, str) else None
    if dtype is None:
        raise FormatError(f"unknown dtype {excerpt(name)}", file=file, path=path)
    shape = checked_shape(shape, dtype, file=file, path=path)
    if not isinstance(shards, list):
        raise FormatError("a sharded leaf needs its list of shards", file=file, path=path)
    sharding = entry.get("sharding")
    if sharding is not None:
        check_sharding_description(sharding, len(shape), file=file, path=path)
    stored = tuple(_shard(shard, path, dtype, tuple(shape), slots, source=source, file=file) for shard in shards)
    return ShardedLeaf(path, "sharded", dtype, tuple(shape), None, None, stored, sharding)


def _shard(
    shard: Any,
    path: str,
    dtype: np.dtype,
    shape: tuple[int, ...],
    slots: Mapping[str, TensorSlot],
    *,
    source: int,
    file: str,
) -> StoredShard:
    if not (isinstance(shard, dict) and isinstance(shard.get("tensor"), str) and isinstance(shard.get("box"), list)):
        raise FormatError(f"malformed shard {excerpt(shard)}", file=file, path=path)
    box = shard["box"]
    valid = len(box) == len(shape) and all(  # an axis of no elements is split into empty ranges at 0
        isinstance(axis, list)
        and len(axis) == 2
        and set(map(type, axis)) == {int}
        and (0 <= axis[0] < axis[1] <= size or axis == [0, 0] == [0, size])
        for axis, size in zip(box, shape, strict=False)
    )
    if not valid:
        raise FormatError(f"shard box {excerpt(box)} does not lie within the shape {list(shape)}", file=file, path=path)
    tensor, checksum = shard["tensor"], shard.get("xxh3")
    slot = slots.get(tensor)
    if slot is None:
        raise FormatError(f"the file holds no tensor {excerpt(tensor)} for this shard", file=file, path=path)
    if checksum is not None and not isinstance(checksum, str):
        raise FormatError(f"malformed checksum {excerpt(checksum)}", file=file, path=path)
    if "blocks" in shard and shard["blocks"] is None:  # null would read as "no block checksums"
        raise FormatError("malformed block checksums null of a shard", file=file, path=path)
    extent = [stop - start for start, stop in box]
    if not (slot.dtype == dtype and list(slot.shape) == extent):
        raw_leaf_layout({"path": path, "dtype": name_of_dtype(dtype), "shape": extent}, slot, file=file)
    return StoredShard(tensor, source, tuple((start, stop) for start, stop in box), checksum, shard.get("blocks"))


def check_coverage(leaf: ShardedLeaf, *, file: str) -> None:
    """Raise :class:`FormatError` unless the shards of ``leaf`` cover its whole array, each element once.

    A box stored by several files counts once (the files of a step may each hold it); one file holding a box twice
    is damage, whichever of its copies a read would take.
    """
    stored = [(shard.source, shard.box) for shard in leaf.shards]
    if len(set(stored)) != len(stored):
        twice = next(box for number, (_, box) in enumerate(stored) if stored[number] in stored[:number])
        shown = [list(axis) for axis in twice]
        raise CorruptFileError(
            f"the shard box {shown} is stored twice: the header is damaged", file=file, path=leaf.path
        )
    boxes = {shard.box for shard in leaf.shards}
    covered = sum(math.prod(stop - start for start, stop in box) for box in boxes)
    overlapping = any(
        intersect(first, second) is not None
        for i, first in enumerate(sorted(boxes))
        for second in sorted(boxes)[i + 1 :]
    )
    if covered != math.prod(leaf.shape) or overlapping:
        raise FormatError(
            f"the stored shards ({len(boxes)}) do not cover the array of shape {list(leaf.shape)} exactly once "
            "(a file of the checkpoint may be missing, or this file holds only the shards of process 0 of a tree "
            "saved by several processes: restore it with the step's other files, jaxstow.CheckpointManager.restore)",
            file=file,
            path=leaf.path,
        )
