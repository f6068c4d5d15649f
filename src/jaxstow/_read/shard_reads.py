"""Boxes of sharded leaves assembled from their shards, the reads of many leaves planned first and run together.

A sharded leaf is stored as shards, possibly in several files (one per process that saved it). Restoring such leaves
whole reads every shard of every leaf: planned first (which part of which shard lands where), the reads then run on
the pool of the files' source, so an object store gets as many requests in flight as its transfer allows, not one
shard at a time. Shards of native files are read straight into their place in the assembled array.

>>> import numpy as np
>>> from jaxstow._read.shard_reads import ShardReads
>>> ShardReads([]).run()
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import numpy as np

from jaxstow._format.checksum import checksum_bytes
from jaxstow._format.container import Container
from jaxstow._format.native import NativeReader
from jaxstow._format.reading import aligned_empty, run_all
from jaxstow._format.shards import Box, ShardedLeaf, StoredShard, intersect
from jaxstow._read.slicing import full_box, read_box

__all__ = ["ShardReads"]

#: ``verify(path, found, wanted)`` raises when a shard's checksum is not the one recorded.
Verify = Callable[[str, str, str | None], None]


class ShardReads:
    """The reads of boxes of sharded leaves from ``containers`` (a tree's files: the leaf's shards name theirs),
    planned by :meth:`box` and done together by :meth:`run`."""

    def __init__(self, containers: Sequence[Container], verify: Verify | None = None) -> None:
        self._containers = containers
        self._verify = verify
        self._jobs: list[Callable[[], None]] = []

    def box(self, leaf: ShardedLeaf, box: Box) -> Callable[[], np.ndarray]:
        """Plan the reads of ``box`` of ``leaf``; returns what gives the assembled array once :meth:`run` is done."""
        for shard in leaf.shards:  # a box within one shard, as device boxes on the saved layout are: no assembly
            if intersect(shard.box, box) == box:
                inner = tuple((a - start, b - start) for (a, b), (start, _) in zip(box, shard.box, strict=True))
                cell: list[np.ndarray] = []
                self._jobs.append(functools.partial(self._whole, leaf, shard, inner, cell))
                return lambda: cell[0]
        extent = tuple(stop - start for start, stop in box)
        out = aligned_empty(math.prod(extent) * leaf.dtype.itemsize).view(leaf.dtype).reshape(extent)
        for shard in leaf.shards:
            overlap = intersect(shard.box, box)
            if overlap is None:
                continue
            inner = tuple((a - start, b - start) for (a, b), (start, _) in zip(overlap, shard.box, strict=True))
            region = out[tuple(slice(a - start, b - start) for (a, b), (start, _) in zip(overlap, box, strict=True))]
            self._jobs.append(functools.partial(self._into, leaf, shard, inner, region))
        return lambda: out

    def run(self) -> None:
        """Do every read planned: on the files' shared pool when they are native files read in parallel."""
        jobs, self._jobs = self._jobs, []
        plan = getattr(self._containers[0], "source", None) if self._containers else None
        parallel = plan.parallel if plan is not None else None
        if parallel is None or len(jobs) < 2 or not all(isinstance(c, NativeReader) for c in self._containers):
            for job in jobs:
                job()
            return
        run_all(parallel.pool(), jobs)

    def _whole(self, leaf: ShardedLeaf, shard: StoredShard, inner: Box, cell: list[np.ndarray]) -> None:
        cell.append(self._shard(leaf, shard, inner))

    def _into(self, leaf: ShardedLeaf, shard: StoredShard, inner: Box, region: np.ndarray) -> None:
        if region.flags.c_contiguous:  # read straight into place (row blocks are)
            self._shard(leaf, shard, inner, into=region)
        else:
            region[...] = self._shard(leaf, shard, inner)

    def _shard(self, leaf: ShardedLeaf, shard: StoredShard, inner: Box, into: np.ndarray | None = None) -> np.ndarray:
        """The part ``inner`` of one shard (into ``into``, a C-contiguous array of its shape, when given); a whole
        shard is verified against its checksum."""
        container = self._containers[shard.source]
        whole = inner == full_box(shard.shape)
        if not isinstance(container, NativeReader):
            raw = container.read([shard.tensor], lambda _, found: self._check(leaf, found, shard))
            part = (
                raw[shard.tensor]
                .reshape(-1)
                .view(np.uint8)
                .view(leaf.dtype)
                .reshape(shard.shape)[tuple(slice(start, stop) for start, stop in inner)]
            )
            if into is not None:
                into[...] = part
            return part
        slot = container.slots[shard.tensor]
        part = read_box(container.source, slot.offset, leaf.dtype, shard.shape, inner, into=into)
        if whole:
            self._check(leaf, checksum_bytes(part.reshape(-1).view(np.uint8).data), shard)
        return part

    def _check(self, leaf: ShardedLeaf, found: str, shard: StoredShard) -> None:
        if self._verify is not None:
            self._verify(leaf.path, found, shard.checksum)
