"""Reading tensors from a source fast: aligned buffers, small tensors coalesced, large ones read in parallel.

Each large tensor is read straight into its own 64-byte-aligned buffer, which ``jax.device_put`` on CPU adopts
without a copy. Small tensors that lie next to each other are fetched with one read and handed out as views.

>>> import io, numpy as np
>>> from jaxstow._format.reading import TensorSlot, aligned_empty, read_slots
>>> from jaxstow._storage.opening import open_source
>>> source = open_source(io.BytesIO(np.arange(4, dtype=np.int32).tobytes()))
>>> read_slots(source, [TensorSlot.at("x", np.dtype(np.int32), (2,), 8)])["x"]
array([2, 3], dtype=int32)
>>> aligned_empty(10).ctypes.data % 64
0
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from jaxstow._format.source import ReadSource

__all__ = ["ALIGNMENT", "TensorSlot", "aligned_empty", "read_slots", "read_tensors"]

ALIGNMENT = 64
_SMALL = 1 << 20  # tensors below this are coalesced
_RUN = 16 << 20  # the most bytes one coalesced read fetches
_PARALLEL_BYTES = 32 << 20  # below this, one thread reads faster than a pool starts


class TensorSlot(NamedTuple):
    """Where one tensor's bytes lie in a source, and how they are laid out; make one with :meth:`at`."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    @classmethod
    def at(cls, name: str, dtype: np.dtype, shape: tuple[int, ...], offset: int) -> TensorSlot:
        """The slot of a tensor of ``dtype`` and ``shape`` starting at ``offset``."""
        return cls(name, dtype, shape, offset, math.prod(shape) * dtype.itemsize)


def aligned_empty(nbytes: int) -> np.ndarray:
    """An uninitialised uint8 buffer of ``nbytes`` whose first byte is 64-byte aligned."""
    raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start : start + nbytes]


def _runs(offsets: np.ndarray, nbytes: np.ndarray) -> list[np.ndarray]:
    """Group tensors (by index) into reads: each large tensor alone, neighbouring small ones together, at most about
    ``_RUN`` bytes a read; vectorised, so that ten thousand small tensors cost no Python loop here."""
    order = np.argsort(offsets, kind="stable")
    if not len(order):
        return []
    starts, sizes = offsets[order], nbytes[order]
    small = sizes < _SMALL
    ends = starts + sizes
    breaks = np.ones(len(order), bool)
    if len(order) > 1:
        # A run goes on while tensors are small and each starts where the one before it ends.
        breaks[1:] = ~small[1:] | ~small[:-1] | (starts[1:] != ends[:-1])
    first = np.maximum.accumulate(np.where(breaks, starts, 0))
    if len(order) > 1:  # and is cut every _RUN bytes
        breaks[1:] |= (starts[1:] - first[1:]) // _RUN != (starts[:-1] - first[:-1]) // _RUN
    return np.split(order, np.flatnonzero(breaks)[1:])


Verify = Callable[[str, memoryview], None]
#: ``check(i, data)`` is called with the bytes of the ``i``-th tensor asked for, on the thread that read them.
Check = Callable[[int, memoryview], None]


def _read_run(source: ReadSource, run: np.ndarray, columns: _Columns, check: Check | None) -> list[np.ndarray]:
    offsets, nbytes, dtypes, shapes = columns
    start = int(offsets[run[0]])
    size = int(offsets[run[-1]] + nbytes[run[-1]]) - start
    buffer = aligned_empty(size)
    source.read_into(start, buffer.data)
    if len(run) == 1:  # most often a large tensor in a buffer of its own
        i = int(run[0])
        if check is not None:
            check(i, buffer.data)
        return [buffer.view(dtypes[i]).reshape(shapes[i])]
    out = []
    data = buffer.data
    ndarray = np.ndarray
    for i, begin, length in zip(run.tolist(), (offsets[run] - start).tolist(), nbytes[run].tolist(), strict=True):
        if check is not None:
            check(i, data[begin : begin + length])
        out.append(ndarray(shapes[i], dtypes[i], buffer, begin))
    return out


_Columns = tuple[np.ndarray, np.ndarray, Sequence[np.dtype], Sequence[Sequence[int]]]


def read_tensors(
    source: ReadSource,
    offsets: np.ndarray,
    nbytes: np.ndarray,
    dtypes: Sequence[np.dtype],
    shapes: Sequence[Sequence[int]],
    check: Check | None = None,
) -> list[np.ndarray]:
    """The tensors at ``offsets`` (each ``nbytes`` long, of its dtype and shape), in the order given; large reads run
    on several threads when the source allows it. ``check(i, data)`` sees each tensor's bytes."""
    offsets, nbytes = np.asarray(offsets, np.int64), np.asarray(nbytes, np.int64)
    columns = (offsets, nbytes, dtypes, shapes)
    runs = _runs(offsets, nbytes)
    out: list[np.ndarray] = [None] * len(offsets)  # type: ignore[list-item]
    parallel = source.parallel and int(nbytes.sum()) >= _PARALLEL_BYTES
    workers = min(len(runs), os.cpu_count() or 1, 4) if parallel else 1
    if workers <= 1:
        parts = [_read_run(source, run, columns, check) for run in runs]
    else:
        with ThreadPoolExecutor(workers) as pool:
            parts = list(pool.map(lambda run: _read_run(source, run, columns, check), runs))
    for run, part in zip(runs, parts, strict=True):
        for i, array in zip(run.tolist(), part, strict=True):
            out[i] = array
    return out


def read_slots(source: ReadSource, slots: Sequence[TensorSlot], verify: Verify | None = None) -> dict[str, np.ndarray]:
    """Read every slot, as :func:`read_tensors` does; ``verify(name, data)`` sees each tensor's bytes."""
    check = None if verify is None else lambda i, data: verify(slots[i].name, data)
    arrays = read_tensors(
        source,
        np.array([slot.offset for slot in slots], np.int64),
        np.array([slot.nbytes for slot in slots], np.int64),
        [slot.dtype for slot in slots],
        [slot.shape for slot in slots],
        check,
    )
    return {slot.name: array for slot, array in zip(slots, arrays, strict=True)}
