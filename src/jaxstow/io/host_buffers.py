"""Host memory that the collectors reuse from run to run: arrays whose pages are already backed.

Memory touched for the first time costs a page fault per page, and in a virtual machine often far more (the host
backs the page then, at times at a few hundred MB/s): a run that copies 40 MB of samples into fresh arrays pays it at
every run, erratically. :func:`empty` carves its arrays from buffers that earlier runs gave back instead. A buffer
goes back to the pool when the last array that views it is gone (the collector's and every one it returned), so
nothing a caller still holds is ever reused; the pool keeps at most :data:`IDLE_LIMIT` bytes of such buffers idle and
frees the rest, and :func:`release` frees every idle one.

>>> from jaxstow.io import host_buffers
>>> _ = host_buffers.release()
>>> samples = host_buffers.empty((1000, 256), "float32")
>>> address = samples.ctypes.data
>>> del samples                                  # its buffer goes back to the pool, backed and idle
>>> host_buffers.idle_bytes()
1024000
>>> host_buffers.empty((1000, 256), "float32").ctypes.data == address   # the next run reuses it
True
>>> host_buffers.release(), host_buffers.idle_bytes()
(1024000, 0)
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import numpy as np

__all__ = ["COPIED_APART", "IDLE_LIMIT", "copy", "empty", "idle_bytes", "release"]

#: At most this many bytes of idle buffers are kept for the next run; a buffer given back beyond them is freed.
IDLE_LIMIT = 256 << 20
#: Copies of fewer bytes come from the allocator, which hands out again the memory freed last, already backed: the
#: blocks of samples that a run hands over copied every few thousand steps, where the pool would cost more than the copy.
COPIED_APART = 128 << 10

_lock = threading.RLock()  # a finalizer may give a buffer back in the middle of a call that holds it
_idle: list[np.ndarray] = []  # buffers no array views any more, smallest first


class _Lease:
    """The owner of an array carved from a pooled buffer: when the last view of it is gone, the buffer goes back."""

    def __init__(self, buffer: np.ndarray, nbytes: int) -> None:
        self.buffer = buffer
        self.__array_interface__ = {"data": (buffer.ctypes.data, False), "shape": (nbytes,), "typestr": "|u1"}


def _give_back(buffer: np.ndarray) -> None:
    with _lock:
        if sum(idle.nbytes for idle in _idle) + buffer.nbytes <= IDLE_LIMIT:
            _idle.append(buffer)
            _idle.sort(key=lambda idle: idle.nbytes)


def _take(nbytes: int) -> np.ndarray:
    """An idle buffer of ``nbytes`` to twice as many (the smallest), or a new one."""
    with _lock:
        for index, buffer in enumerate(_idle):
            if nbytes <= buffer.nbytes <= 2 * nbytes:
                return _idle.pop(index)
    return np.empty(max(nbytes, 1), np.uint8)


def empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An uninitialized writable array, in a buffer an earlier array gave back if one of about its size is idle."""
    kind = np.dtype(dtype)
    if kind.hasobject:
        return np.empty(shape, kind)
    nbytes = int(np.prod(shape, dtype=np.int64)) * kind.itemsize
    lease = _Lease(_take(nbytes), nbytes)
    weakref.finalize(lease, _give_back, lease.buffer)
    array: np.ndarray = np.asarray(lease).view(kind).reshape(shape)  # its views keep the lease alive, not the buffer
    return array


def copy(array: np.ndarray) -> np.ndarray:
    """A copy of ``array`` in a buffer from :func:`empty`, or from the allocator under :data:`COPIED_APART` bytes."""
    if array.nbytes < COPIED_APART:
        return np.array(array)
    copied = empty(np.shape(array), array.dtype)
    copied[...] = array
    return copied


def idle_bytes() -> int:
    """Bytes of buffers that no array views, kept for the next run."""
    with _lock:
        return sum(buffer.nbytes for buffer in _idle)


def release() -> int:
    """Free every idle buffer; returns the bytes freed."""
    with _lock:
        freed = sum(buffer.nbytes for buffer in _idle)
        _idle.clear()
    return freed
