"""The memory of a leaf read alone: huge pages, kept for the next leaf once the arrays over it are gone.

Memory the process never touched costs a page fault per 4 KiB page, and on a virtual machine that hands freed pages
back to its host far more than the read into it. A buffer from :func:`leaf_buffer` starts on a 2 MiB boundary, its
whole 2 MiB extents in huge pages (one fault each, not 512); when the last array over it goes, it is kept, its pages
still in place, for the next buffer of its size (a loop that reads leaves one by one and lets each go, as the
allocator gives ``np.empty`` the memory just freed). At most :data:`KEPT_BYTES` are kept, none over
:data:`LARGEST_KEPT` (larger ones go back to the system at once, as the allocator's own do), and a forked child keeps
none of its parent's.

>>> from jaxstow._util.buffers import leaf_buffer, release_kept
>>> release_kept()  # none kept yet
>>> first = leaf_buffer(3 << 20)
>>> address, size, fresh = first.array.ctypes.data, first.array.nbytes, not first.touched
>>> del first
>>> again = leaf_buffer(3 << 20)
>>> fresh, again.touched, again.array.ctypes.data == address, again.array.nbytes == size, address % (2 << 20)
(True, True, True, True, 0)
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
from typing import Any, NamedTuple

import numpy as np

__all__ = ["HUGE_PAGE", "KEPT_BYTES", "LARGEST_KEPT", "LeafBuffer", "leaf_buffer", "release_kept"]

#: The size of a huge page, and the least a buffer of :func:`leaf_buffer` should hold.
HUGE_PAGE = 2 << 20
#: The most bytes of buffers kept for the next reads, and the largest buffer kept: that of a leaf of up to 32 MiB
#: (a leaf's buffer holds 2 MiB more than its whole extents), the largest read alone on one or two threads.
KEPT_BYTES = 64 << 20
LARGEST_KEPT = (32 << 20) + HUGE_PAGE
_ANONYMOUS = hasattr(mmap, "MAP_ANONYMOUS")
_ADVISED = getattr(mmap, "MADV_HUGEPAGE", None) is not None


class _Mapping(NamedTuple):
    """An anonymous mapping, and the address of its first 2 MiB boundary, where its buffers start."""

    mapping: mmap.mmap
    start: int


class _Kept:
    """The mappings whose arrays are gone, by size, waiting for the next buffer of that size.

    An array can go inside a garbage collection that an allocation under the lock starts, and its owner then gives
    its mapping back on the thread that holds the lock: the lock is re-entrant, and nothing the collector tracks is
    made under it.
    """

    def __init__(self, most: int, largest: int) -> None:
        self.most, self.largest = most, largest  # attributes: module globals may be gone at the interpreter's exit
        self.reset()

    def reset(self) -> None:
        """Start empty, with a lock of its own (in a forked child, whose parent's lock may be held by a thread gone)."""
        self.lock = threading.RLock()
        self.sizes: dict[int, list[_Mapping]] = {}
        self.held = 0

    def release(self) -> None:
        empty: dict[int, list[_Mapping]] = {}
        with self.lock:
            kept, self.sizes, self.held = self.sizes, empty, 0
        del kept  # the mappings unmapped as they go, outside the lock

    def take(self, size: int) -> _Mapping | None:
        with self.lock:
            mappings = self.sizes.get(size)
            if not mappings:
                return None
            self.held -= size
            return mappings.pop()

    def give(self, mapping: _Mapping, size: int) -> None:
        first: list[_Mapping] = []
        with self.lock:
            if size <= self.largest and self.held + size <= self.most:
                self.sizes.setdefault(size, first).append(mapping)
                self.held += size


_KEPT = _Kept(KEPT_BYTES, LARGEST_KEPT)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_KEPT.reset)


def release_kept() -> None:
    """Hand the buffers kept for the next reads back to the system (as ``malloc_trim`` does the allocator's)."""
    _KEPT.release()


class _Owner:
    """The owner of a mapping, the base of the arrays over it; given back to :data:`_KEPT` when they are all gone."""

    def __init__(self, mapping: _Mapping, size: int, interface: dict[str, Any], kept: _Kept) -> None:
        self.mapping, self.size, self.kept = mapping, size, kept
        self.__array_interface__ = interface

    def __del__(self) -> None:
        self.kept.give(self.mapping, self.size)


class LeafBuffer(NamedTuple):
    """A buffer of :func:`leaf_buffer`, and whether its pages are in place (kept from an earlier read)."""

    array: np.ndarray
    touched: bool


def leaf_buffer(nbytes: int, shift: int = 0) -> LeafBuffer | None:
    """An uninitialised uint8 buffer of ``nbytes``, ``shift`` bytes (under 4 KiB) past a 2 MiB boundary, in huge
    pages where the system has them.

    Taken from the buffers kept after their arrays went, when one of its size is there (``touched``), else freshly
    mapped; ``None`` on a system without anonymous mappings (the caller then takes ``np.empty``'s memory).
    """
    if not _ANONYMOUS:
        return None
    # Whole extents, and room to start on a boundary: 4 KiB at least past the extents from the boundary on.
    size = -(-nbytes // HUGE_PAGE) * HUGE_PAGE + HUGE_PAGE
    mapping = _KEPT.take(size)
    touched = mapping is not None
    if mapping is None:
        mapping = _mapped(size, nbytes)
    interface = {"shape": (nbytes,), "typestr": "|u1", "data": (mapping.start + shift, False), "version": 3}
    return LeafBuffer(np.asarray(_Owner(mapping, size, interface, _KEPT)), touched)


def _mapped(size: int, nbytes: int) -> _Mapping:
    """A fresh anonymous mapping of ``size`` bytes, the extents a buffer of ``nbytes`` fills from its first 2 MiB
    boundary advised into huge pages."""
    mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    view = np.frombuffer(mapping, np.uint8)
    address = view.ctypes.data
    del view  # no export of the mapping outlives this call: the owner alone holds it
    offset = -address % HUGE_PAGE
    if _ADVISED:  # only the extents the buffer fills: a huge page never holds bytes beyond it
        with contextlib.suppress(OSError):  # no transparent huge pages in this kernel: small pages
            mapping.madvise(mmap.MADV_HUGEPAGE, offset, nbytes - nbytes % HUGE_PAGE)
    return _Mapping(mapping, address + offset)
