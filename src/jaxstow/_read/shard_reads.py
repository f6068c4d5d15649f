"""Boxes of sharded leaves assembled from their shards, the reads of many leaves planned first and run together.

A sharded leaf is stored as shards, possibly in several files (one per process that saved it). Restoring such leaves
whole reads every shard of every leaf: planned first (which part of which shard lands where), the reads then run on
the pool of the files' source, so an object store gets as many requests in flight as its transfer allows, not one
shard at a time. Whole shards of native files are read straight into their place in the assembled array, and the
shards that follow each other in a file (those of consecutive leaves, as each process writes them) are read
together, up to a piece of the source's size, with one request scattered over their places.

>>> import numpy as np
>>> from jaxstow._read.shard_reads import ShardReads
>>> ShardReads([]).run()
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from jaxstow._format.checksum import checksum_bytes
from jaxstow._format.header import NativeReader
from jaxstow._format.native_or_npz import Container
from jaxstow._format.shards import Box, ShardedLeaf, StoredShard, intersect
from jaxstow._format.source import Parallel
from jaxstow._format.tensor_reads import TensorSlot, aligned_empty, run_all
from jaxstow._read.block_verified import read_part
from jaxstow._read.slicing import full_box

__all__ = ["ShardReads"]

#: ``verify(path, found, wanted, source)`` raises when a shard's checksum (of the ``source``-th file) is not the one
#: recorded.
Verify = Callable[[str, str, str | None, int], None]
_PIECE = 16 << 20  # reads of a source with no parallel plan are joined up to this


class _Whole(NamedTuple):
    """A whole shard of a native file, to be read into ``into`` (its bytes' place)."""

    container: int
    offset: int
    into: memoryview
    leaf: ShardedLeaf
    shard: StoredShard


class ShardReads:
    """The reads of boxes of sharded leaves from ``containers``, a tree's files.

    A leaf's shards name their files. Planned by :meth:`box` and done together by :meth:`run`.
    """

    def __init__(self, containers: Sequence[Container], verify: Verify | None = None) -> None:
        self._containers = containers
        self._verify = verify
        self._jobs: list[Callable[[], None]] = []
        self._wholes: list[_Whole] = []
        self._left: list[int] = []
        self._lock = threading.Lock()

    def box(self, leaf: ShardedLeaf, box: Box) -> Callable[[], np.ndarray]:
        """Plan the reads of ``box`` of ``leaf``; returns what gives the assembled array once :meth:`run` is done."""
        for shard in leaf.shards:  # a box within one shard, as device boxes on the saved layout are: no assembly
            if intersect(shard.box, box) == box:
                inner = tuple((a - start, b - start) for (a, b), (start, _) in zip(box, shard.box, strict=True))
                if self._native(shard) and inner == full_box(shard.shape):
                    nbytes, at = math.prod(shard.shape) * leaf.dtype.itemsize, self._slot(shard).offset
                    whole = aligned_empty(nbytes, at).view(leaf.dtype)
                    self._plan_whole(leaf, shard, whole)
                    return lambda: whole.reshape(shard.shape)
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
            if self._native(shard) and inner == full_box(shard.shape) and region.flags.c_contiguous:
                self._plan_whole(leaf, shard, region)
            else:
                self._jobs.append(functools.partial(self._into, leaf, shard, inner, region))
        return lambda: out

    def _native(self, shard: StoredShard) -> bool:
        return isinstance(self._containers[shard.source], NativeReader)

    def _slot(self, shard: StoredShard) -> TensorSlot:
        """Where a shard of a native file lies in it."""
        return self._containers[shard.source].slots[shard.tensor]

    def _plan_whole(self, leaf: ShardedLeaf, shard: StoredShard, into: np.ndarray) -> None:
        slot = self._slot(shard)
        self._wholes.append(_Whole(shard.source, slot.offset, into.reshape(-1).view(np.uint8).data, leaf, shard))

    def run(self) -> None:
        """Do every read planned: on the files' shared pool when they are native files read in parallel."""
        source = getattr(self._containers[0], "source", None) if self._containers else None
        parallel = source.parallel if source is not None else None
        jobs = self._jobs + [functools.partial(self._read_together, run) for run in self._runs(parallel)]
        if parallel is None or len(jobs) < 2 or not all(isinstance(c, NativeReader) for c in self._containers):
            for job in jobs:
                job()
            self._jobs, self._wholes = [], []
            return
        run_all(parallel.pool(), jobs)
        self._jobs, self._wholes = [], []

    def _runs(self, parallel: Parallel | None) -> list[list[tuple[int, int, memoryview]]]:
        """The whole shards planned, as runs of pieces (whole index, offset, place) that follow each other in one file.

        Each run is up to a piece of the source's size: small shards joined, large ones cut.
        """
        piece = parallel.piece if parallel is not None else _PIECE
        self._left = [-(-len(whole.into) // piece) or 1 for whole in self._wholes]
        self._lock = threading.Lock()
        pieces = [
            (index, whole.offset + at, whole.into[at : at + piece])
            for index, whole in sorted(enumerate(self._wholes), key=lambda item: (item[1].container, item[1].offset))
            for at in range(0, max(len(whole.into), 1), piece)
        ]
        runs: list[list[tuple[int, int, memoryview]]] = []
        for index, offset, into in pieces:
            last = runs[-1][-1] if runs else None
            joins = (
                last is not None
                and self._wholes[last[0]].container == self._wholes[index].container
                and last[1] + len(last[2]) == offset
                and sum(len(member[2]) for member in runs[-1]) + len(into) <= piece
            )
            if joins:
                runs[-1].append((index, offset, into))
            else:
                runs.append([(index, offset, into)])
        return runs

    def _read_together(self, run: list[tuple[int, int, memoryview]]) -> None:
        """Read a run with one request into its places.

        Each shard whose last piece this was is checked against its checksum.
        """
        source = self._containers[self._wholes[run[0][0]].container].source  # type: ignore[attr-defined]
        source.read_scatter(run[0][1], [into for _, _, into in run])
        for index, _, _ in run:
            with self._lock:
                self._left[index] -= 1
                done = self._left[index] == 0
            if done:
                whole = self._wholes[index]
                self._check(whole.leaf, checksum_bytes(whole.into), whole.shard)

    def _whole(self, leaf: ShardedLeaf, shard: StoredShard, inner: Box, cell: list[np.ndarray]) -> None:
        cell.append(self._shard(leaf, shard, inner))

    def _into(self, leaf: ShardedLeaf, shard: StoredShard, inner: Box, region: np.ndarray) -> None:
        if region.flags.c_contiguous:  # read straight into place (row blocks are)
            self._shard(leaf, shard, inner, into=region)
        else:
            region[...] = self._shard(leaf, shard, inner)

    def _shard(self, leaf: ShardedLeaf, shard: StoredShard, inner: Box, into: np.ndarray | None = None) -> np.ndarray:
        """The part ``inner`` of one shard (into ``into``, a C-contiguous array of its shape, when given).

        A whole shard is verified against its checksum.
        """
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
        checks = None if whole else shard  # a whole shard is verified against its checksum below
        file = container.file
        part = read_part(
            container.source, slot.offset, leaf.dtype, shard.shape, inner, checks, file=file, path=leaf.path, into=into
        )
        if whole:
            self._check(leaf, checksum_bytes(part.reshape(-1).view(np.uint8).data), shard)
        return part

    def _check(self, leaf: ShardedLeaf, found: str, shard: StoredShard) -> None:
        if self._verify is not None:
            self._verify(leaf.path, found, shard.checksum, shard.source)
