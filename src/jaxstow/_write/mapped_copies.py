"""Copies of the caller's arrays that a save holds while it writes them, in memory of their own.

A large copy is made in an anonymous memory map, which goes back to the system the moment it is freed: copies made
and freed piece by piece never leave holes that the small allocations of the write (its header, its checksums) then
split, so that the next piece would need memory of its own and a save would hold more than its host budget.

>>> import numpy as np
>>> from jaxstow._write.mapped_copies import mapped_copy
>>> mapped_copy(np.arange(6.0).reshape(2, 3).T)
array([0., 3., 1., 4., 2., 5.])
>>> mapped_elements(np.arange(6.0).reshape(2, 3).T, 1, 4)
array([3., 1., 4.])
"""

from __future__ import annotations

import mmap

import numpy as np

__all__ = ["mapped_copy", "mapped_elements"]

#: Copies of fewer bytes are made as numpy makes them.
_MAPPED_FROM = 1 << 20
#: Elements copied at a time from a flat range of an array that is not C-contiguous.
_RUN = 1 << 14


def mapped_copy(array: np.ndarray) -> np.ndarray:
    """A flat copy of ``array``'s elements in C order; one of at least 1 MiB in an anonymous memory map."""
    if array.nbytes < _MAPPED_FROM:
        return np.array(array, order="C").reshape(-1)
    out = np.frombuffer(mmap.mmap(-1, array.nbytes), array.dtype, array.size)
    out.reshape(array.shape)[...] = array
    return out


def mapped_elements(array: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Elements ``start`` to ``stop`` of ``array`` in C order (``array.flat[start:stop]``), copied as
    :func:`mapped_copy` copies, a few at a time."""
    if (stop - start) * array.itemsize < _MAPPED_FROM:
        elements: np.ndarray = array.flat[start:stop]
        return elements
    out = np.frombuffer(mmap.mmap(-1, (stop - start) * array.itemsize), array.dtype, stop - start)
    for at in range(start, stop, _RUN):
        out[at - start : min(at + _RUN, stop) - start] = array.flat[at : min(at + _RUN, stop)]
    return out
