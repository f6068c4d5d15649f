"""Shards that several processes hold (replicas): the part of each that every holder writes, and a print of the
values the holders hold, which the processes of a save compare.

>>> share_box(((0, 8), (0, 3)), 1, 2)
(((4, 8), (0, 3)), (slice(4, 8, None), slice(None, None, None)))
>>> import numpy as np
>>> replica_print(np.arange(3.0)) == replica_print(np.arange(3.0)) != replica_print(np.arange(1.0, 4.0))
True
"""

from __future__ import annotations

import numpy as np

from jaxstow._format.checksum import as_bytes, checksum_bytes

__all__ = ["Box", "Holders", "print_ranges", "replica_print", "share_box"]

#: ``(start, stop)`` along every axis.
Box = tuple[tuple[int, int], ...]
#: The processes that hold a box, in order.
Holders = tuple[int, ...]

#: A replica of at most this many bytes is printed whole; a larger one by :data:`_WINDOWS` evenly spaced windows of
#: :data:`_WINDOW` bytes, so that comparing replicas costs every process as little as a small array's bytes.
_WHOLE = 64 << 10
_WINDOWS, _WINDOW = 64, 1 << 10


def share_box(box: Box, rank: int, count: int) -> tuple[Box | None, tuple[slice, ...] | None]:
    """The part of ``box`` that the ``rank``-th of ``count`` holders writes, and where it lies within the box.

    ``(None, None)`` when it writes nothing; the whole box (and ``None``) when it is the only holder.
    """
    if count == 1 or not box:
        return (box, None) if rank == 0 else (None, None)
    axis = next((axis for axis, (start, stop) in enumerate(box) if stop - start >= count), 0)
    start, stop = box[axis]
    low, high = start + (stop - start) * rank // count, start + (stop - start) * (rank + 1) // count
    if low == high:
        return None, None
    part = (*box[:axis], (low, high), *box[axis + 1 :])
    within = tuple(slice(low - start, high - start) if i == axis else slice(None) for i in range(len(box)))
    return part, within


def replica_print(data: np.ndarray) -> str:
    """An xxh3 of a replica's bytes: all of them up to 64 KiB, else 64 windows of 1 KiB spread evenly over them
    (:func:`print_ranges`).

    Replicas that drifted apart (another seed, an update one process missed) differ nearly everywhere, so the
    windows tell them apart without a pass over every byte in every process of every save.
    """
    raw = np.frombuffer(as_bytes(np.ascontiguousarray(data)), np.uint8)
    ranges = print_ranges(raw.nbytes)
    if len(ranges) > 1:
        raw = np.concatenate([raw[low:high] for low, high in ranges])
    return checksum_bytes(raw.data)


def print_ranges(nbytes: int) -> list[tuple[int, int]]:
    """The byte ranges of a replica of ``nbytes`` that its print covers, in order: all of it up to 64 KiB, else 64
    windows of 1 KiB spread evenly over it.

    >>> print_ranges(10), print_ranges(1 << 20)[:2], len(print_ranges(1 << 20))
    ([(0, 10)], [(0, 1024), (16627, 17651)], 64)
    """
    if nbytes <= _WHOLE:
        return [(0, nbytes)]
    starts = np.linspace(0, nbytes - _WINDOW, _WINDOWS).astype(np.int64)
    return [(int(start), int(start) + _WINDOW) for start in starts]
