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

__all__ = ["ALIGNMENT", "TensorSlot", "aligned_empty", "read_slots"]

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


def _runs(slots: Sequence[TensorSlot]) -> list[list[TensorSlot]]:
    """Group slots into reads: each large slot alone, adjacent small slots together."""
    runs: list[list[TensorSlot]] = []
    current: list[TensorSlot] = []
    for slot in sorted(slots, key=lambda s: s.offset):
        if slot.nbytes >= _SMALL:
            runs.append([slot])
            continue
        if current and (
            slot.offset != current[-1].offset + current[-1].nbytes
            or slot.offset + slot.nbytes - current[0].offset > _RUN
        ):
            runs.append(current)
            current = []
        current.append(slot)
    if current:
        runs.append(current)
    return runs


Verify = Callable[[str, memoryview], None]


def _read_run(source: ReadSource, run: list[TensorSlot], verify: Verify | None) -> dict[str, np.ndarray]:
    start = run[0].offset
    buffer = aligned_empty(run[-1].offset + run[-1].nbytes - start)
    source.read_into(start, buffer.data)
    out = {}
    data = buffer.data
    for slot in run:
        begin = slot.offset - start
        if verify is not None:
            verify(slot.name, data[begin : begin + slot.nbytes])
        out[slot.name] = buffer[begin : begin + slot.nbytes].view(slot.dtype).reshape(slot.shape)
    return out


def read_slots(source: ReadSource, slots: Sequence[TensorSlot], verify: Verify | None = None) -> dict[str, np.ndarray]:
    """Read every slot; large reads run on several threads when the source allows it.

    ``verify(name, data)`` is called with each tensor's bytes, on the thread that read them.
    """
    runs = _runs(slots)
    out: dict[str, np.ndarray] = {}
    parallel = source.parallel and sum(slot.nbytes for slot in slots) >= _PARALLEL_BYTES
    workers = min(len(runs), os.cpu_count() or 1, 4) if parallel else 1
    if workers <= 1:
        for run in runs:
            out.update(_read_run(source, run, verify))
        return out
    with ThreadPoolExecutor(workers) as pool:
        for part in pool.map(lambda run: _read_run(source, run, verify), runs):
            out.update(part)
    return out
