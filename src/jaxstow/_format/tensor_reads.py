"""Reading tensors from a source fast: aligned buffers, small tensors coalesced, large ones read in parallel.

Each large tensor is read straight into its own 64-byte-aligned buffer, which ``jax.device_put`` on CPU adopts
without a copy. Small tensors that lie next to each other are fetched with one read and handed out as views. A source
that serves several reads at once (its :class:`~jaxstow._format.source.Parallel`) gets large reads as pieces on its
shared pool: a local disk 16 at a time, an object store as many requests as its transfer settings allow.

>>> import io, numpy as np
>>> from jaxstow._format.tensor_reads import TensorSlot, aligned_empty, read_slots
>>> from jaxstow._storage.opening import open_source
>>> source = open_source(io.BytesIO(np.arange(4, dtype=np.int32).tobytes()))
>>> read_slots(source, [TensorSlot.at("x", np.dtype(np.int32), (2,), 8)])["x"]
array([2, 3], dtype=int32)
>>> aligned_empty(10).ctypes.data % 64
0
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import NamedTuple

import numpy as np
from xxhash import xxh3_64, xxh3_64_hexdigest

from jaxstow._format.block_checksums import block_count
from jaxstow._format.piece_cuts import Piece, piece_reads, pieces_of
from jaxstow._format.source import Parallel, ReadSource, in_pool
from jaxstow._format.split_reads import read_and_hash_split, read_blocks_split, read_pieces
from jaxstow._util.buffers import HUGE_PAGE, leaf_buffer
from jaxstow._util.pools import submit

__all__ = [
    "ALIGNMENT",
    "LOCAL_DISK",
    "TensorSlot",
    "aligned_empty",
    "read_range",
    "read_slots",
    "read_tensors",
    "run_all",
]

ALIGNMENT = 64
#: How much further on a buffer starts where the system would copy into it slowly (:func:`clear_shift`).
SHIFT = 64
_SMALL = 1 << 20  # tensors below this are coalesced
_RUN = 16 << 20  # the most bytes one coalesced read fetches
#: How local files are read in parallel. Measured here: a cold disk serves 16 readers of 8 MiB pieces 1.7 GB/s, 8
#: readers of 16 MiB 1.05 GB/s, one 0.3 GB/s; from the page cache, on two busy cores, 16 readers match one
#: ``readinto`` and 4 reach 0.8x of it. Below 32 MiB one thread reads faster than the pieces are handed out.
LOCAL_DISK = Parallel(readers=16, piece=8 << 20, threshold=32 << 20)
#: A tensor read alone from a local disk with its checksum into memory touched before, from this size on, is read in
#: two parts at once, this thread's and the partner thread's (:mod:`~jaxstow._format.split_reads`). Measured here from
#: the page cache, a leaf of 3 MiB in 0.19-0.20 ms against 0.22 ms on one thread, 4 MiB 0.23 against 0.29, 8 MiB 0.36
#: against 0.53; 2 and 2.5 MiB take as long either way, the hand-over costing what the half saves. Memory never
#: touched is read on one thread: on a virtual machine two threads taking fresh pages from the host at once take them
#: twice as slowly as one.
_HALVED_FROM = 3 << 20


class TensorSlot(NamedTuple):
    """Where one tensor's bytes lie in a source, and how they are laid out; make one with :meth:`at`."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    #: The checksums of its blocks (:mod:`~jaxstow._format.block_checksums`), where its reader has them: a tensor
    #: read alone may then be verified block by block, its halves on two threads.
    blocks: str | None = None

    @classmethod
    def at(cls, name: str, dtype: np.dtype, shape: tuple[int, ...], offset: int) -> TensorSlot:
        """The slot of a tensor of ``dtype`` and ``shape`` starting at ``offset``."""
        return cls(name, dtype, shape, offset, math.prod(shape) * dtype.itemsize)


def clear_shift(address: int, offset: int) -> int:
    """0, or :data:`SHIFT` when memory at ``address`` would lie 1 to 31 bytes past the file's byte at ``offset``
    within a page; then ``address + SHIFT`` lies 65 to 95 bytes past it.

    The kernel copies between the page cache and a process's memory with ``rep movsb``, which AMD's Zen cores run
    several times slower at those distances. Measured on this project's AMD EPYC virtual machine, 4 MiB from the
    page cache: ``preadv`` 1.46-1.53 ms at those distances, 0.16-0.24 ms at any other (``pwrite`` 1.60-1.66 ms,
    0.31-0.34 ms). A leaf 16 bytes before a page's end in its file, read into huge pages on a 2 MiB boundary, took
    1.09 ms, and 0.25 ms 64 bytes further on.

    >>> clear_shift(4096 * 10, 4096 - 16), clear_shift(4096 * 10, 4096 - 64), clear_shift(4096 * 10 + 64, 4096 + 48)
    (64, 0, 64)
    """
    return SHIFT if 0 < (address - offset) % 4096 < 32 else 0


def aligned_empty(nbytes: int, offset: int | None = None) -> np.ndarray:
    """An uninitialised uint8 buffer of ``nbytes`` whose first byte is 64-byte aligned; to be read into from a file's
    byte at ``offset``, where the system copies into it fast (:func:`clear_shift`).

    From the allocator, which hands the process's freed memory back to it: pages used before need no zeroing by the
    system, which on a virtual machine costs more than the reads into them (a step of 1 GiB restored again: 1.6
    client CPU-s from the allocator, 2.8 in fresh huge pages).
    """
    raw = np.empty(nbytes + ALIGNMENT + (0 if offset is None else SHIFT), dtype=np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    if offset is not None:
        start += clear_shift(raw.ctypes.data + start, offset)
    return raw[start : start + nbytes]


def _runs(offsets: np.ndarray, nbytes: np.ndarray) -> list[np.ndarray]:
    """Group tensors (by index) into reads.

    Each large tensor alone, neighbouring small ones together, at most about ``_RUN`` bytes a read; vectorised, so that
    ten thousand small tensors cost no Python loop here.
    """
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


#: ``verify(name, digest)`` gets the xxh3 of each tensor read, to compare with the checksum it expects.
Verify = Callable[[str, str], None]
_Columns = tuple[np.ndarray, np.ndarray, Sequence[np.dtype], Sequence[Sequence[int]]]


def _span(run: np.ndarray, columns: _Columns) -> tuple[int, int]:
    """Where a run's bytes start in the source, and how many there are."""
    offsets, nbytes = columns[0], columns[1]
    start = int(offsets[run[0]])
    return start, int(offsets[run[-1]] + nbytes[run[-1]]) - start


def _cut(buffer: np.ndarray, run: np.ndarray, columns: _Columns, digests: list[str] | None) -> list[np.ndarray]:
    """The tensors of a run read into ``buffer``, as arrays over it; their digests into ``digests``."""
    offsets, nbytes, dtypes, shapes = columns
    if len(run) == 1:  # most often a large tensor in a buffer of its own
        i = int(run[0])
        if digests is not None:
            digests[i] = xxh3_64_hexdigest(buffer.data)
        return [buffer.view(dtypes[i]).reshape(shapes[i])]
    out = []
    data = buffer.data
    ndarray = np.ndarray
    start = int(offsets[run[0]])
    for i, begin, length in zip(run.tolist(), (offsets[run] - start).tolist(), nbytes[run].tolist(), strict=True):
        if digests is not None:
            digests[i] = xxh3_64_hexdigest(data[begin : begin + length])
        array = ndarray(shapes[i], dtypes[i], buffer, begin)
        out.append(array if array.flags.aligned else array.copy())  # raw bytes at an odd offset (complex128): aligned
    return out


def run_all(pool: ThreadPoolExecutor, jobs: Iterable[Callable[[], None]]) -> None:
    """Run every job on ``pool`` and wait for all.

    The first failure cancels the jobs not yet started and is raised once the running ones have ended (so no thread
    writes into a buffer after its reader gave up).
    """
    futures: list[Future[None]] = [submit(pool, job) for job in jobs]
    try:
        for future in futures:
            future.result()
    except BaseException:
        for future in futures:
            future.cancel()
        wait(futures)
        raise


def read_range(source: ReadSource, offset: int, buffer: memoryview) -> None:
    """Fill ``buffer`` with the bytes at ``offset``.

    In pieces on the source's pool when it is large enough, else in one read (always one read on a thread of a pool,
    which must not wait for its own pool).
    """
    buffer = buffer.cast("B")
    plan = source.parallel
    if plan is None or len(buffer) < plan.threshold or in_pool():
        source.read_into(offset, buffer)
        return
    pieces = [(offset + at, buffer[at : at + size]) for at, size in pieces_of(offset, len(buffer), plan.piece)]
    run_all(plan.pool(), [functools.partial(source.read_into, at, part) for at, part in pieces])


def _read_in_parallel(
    source: ReadSource, plan: Parallel, runs: list[np.ndarray], columns: _Columns, digests: list[str] | None
) -> list[list[np.ndarray]]:
    """Read the runs in pieces of about ``plan.piece`` bytes on the source's pool.

    A disk or a store serves several requests at once several times faster than one. The pieces are cut at the
    multiples of ``plan.piece`` (:mod:`~jaxstow._format.piece_cuts`), one piece filling the end of a run's buffer and
    the start of the next. Each run is cut and hashed by the thread that reads its last piece.
    """
    spans = [_span(run, columns) for run in runs]
    buffers = [aligned_empty(size, start) for start, size in spans]
    reads = piece_reads(spans, plan.piece)
    left = [0] * len(runs)  # the pieces of each run not read yet
    for piece in reads:
        for r in _filled(piece):
            left[r] += 1
    parts = [_cut(buffers[r], run, columns, digests) if not left[r] else [] for r, run in enumerate(runs)]  # no bytes
    lock = threading.Lock()

    def read(piece: Piece) -> None:
        views = [
            buffers[r].data[at : at + size] if r >= 0 else memoryview(bytearray(size)) for r, at, size in piece.segments
        ]
        source.read_scatter(piece.offset, views)
        with lock:
            for r in _filled(piece):
                left[r] -= 1
            done = [r for r in _filled(piece) if left[r] == 0]
        for r in done:
            parts[r] = _cut(buffers[r], runs[r], columns, digests)

    run_all(plan.pool(), [functools.partial(read, piece) for piece in reads])
    return parts


def _filled(piece: Piece) -> list[int]:
    """The runs whose buffers ``piece`` fills some of."""
    return [r for r, _, _ in piece.segments if r >= 0]


def read_tensors(
    source: ReadSource,
    offsets: np.ndarray | Sequence[int],
    nbytes: np.ndarray | Sequence[int],
    dtypes: Sequence[np.dtype],
    shapes: Sequence[Sequence[int]],
    digests: list[str] | None = None,
) -> list[np.ndarray]:
    """The tensors at ``offsets`` (each ``nbytes`` long, of its dtype and shape), in the order given.

    Large reads run on several threads when the source allows it. ``digests``, when given, receives each tensor's xxh3.
    """
    if len(dtypes) == 1:  # one tensor: none of the planning below
        offset = int(offsets[0])
        return [_read_one(source, offset, aligned_empty(int(nbytes[0]), offset), dtypes[0], shapes[0], digests)]
    offsets, nbytes = np.asarray(offsets, np.int64), np.asarray(nbytes, np.int64)
    columns = (offsets, nbytes, dtypes, shapes)
    runs = _runs(offsets, nbytes)
    out: list[np.ndarray] = [None] * len(offsets)  # type: ignore[list-item]
    if digests is not None:
        digests[:] = [""] * len(offsets)
    plan = source.parallel
    if plan is not None and int(nbytes.sum()) >= plan.threshold:
        parts = _read_in_parallel(source, plan, runs, columns, digests)
    else:
        parts = []
        for run in runs:
            start, size = _span(run, columns)
            buffer = aligned_empty(size, start)
            read_range(source, start, buffer.data)
            parts.append(_cut(buffer, run, columns, digests))
    for run, part in zip(runs, parts, strict=True):
        for i, array in zip(run.tolist(), part, strict=True):
            out[i] = array
    return out


def _read_one(
    source: ReadSource,
    offset: int,
    buffer: np.ndarray,
    dtype: np.dtype,
    shape: Sequence[int],
    digests: list[str] | None,
    *,
    touched: bool = False,
) -> np.ndarray:
    """One tensor, read into ``buffer`` (in pieces on the source's pool when it is large), hashed once read.

    From a local disk, below the size read in parallel, it is read and hashed piece by piece
    (:func:`_read_and_hash`); into a buffer ``touched`` before, from :data:`_HALVED_FROM` bytes on, its second half
    read at once by the partner thread.
    """
    data = buffer.data
    if digests is not None and source.parallel is LOCAL_DISK and len(buffer) < LOCAL_DISK.threshold:
        digests[:] = [_read_and_hash(source, offset, data, halved=_halved(source, len(buffer), touched=touched))]
    else:
        read_range(source, offset, data)
        if digests is not None:
            digests[:] = [xxh3_64_hexdigest(data)]
    return buffer.view(dtype).reshape(shape)


def _halved(source: ReadSource, nbytes: int, *, touched: bool) -> bool:
    """Whether a tensor of ``nbytes`` read alone into memory ``touched`` or not is read in two halves at once."""
    in_range = source.parallel is LOCAL_DISK and _HALVED_FROM <= nbytes < LOCAL_DISK.threshold
    return in_range and touched and not in_pool()


def _read_and_hash(source: ReadSource, offset: int, data: memoryview, *, halved: bool) -> str:
    """The xxh3 of the bytes at ``offset`` read into ``data``, each block hashed as soon as it is read, while it is
    still in the core's cache; ``halved``, in two parts at once (:func:`~jaxstow._format.split_reads.read_and_hash_split`)."""
    if halved:
        return read_and_hash_split(source, offset, data)
    digest = xxh3_64()
    with source.reading() as read_into:
        read_pieces(read_into, offset, data, digest)
    return digest.hexdigest()


def read_slots(source: ReadSource, slots: Sequence[TensorSlot], verify: Verify | None = None) -> dict[str, np.ndarray]:
    """Read every slot, as :func:`read_tensors` does; ``verify(name, digest)`` gets each tensor's xxh3.

    One slot (a leaf read alone) is read into memory of its own (:func:`~jaxstow._util.buffers.leaf_buffer`); where
    it is read in halves and has its :attr:`~TensorSlot.blocks`, each half is verified by its blocks' checksums on
    its own thread, and ``verify`` gets the tensor's xxh3 only if a block's differs.
    """
    digests: list[str] | None = None if verify is None else []
    if len(slots) == 1:
        slot = slots[0]
        leaf = leaf_buffer(slot.nbytes, clear_shift(0, slot.offset)) if slot.nbytes >= HUGE_PAGE else None
        buffer = aligned_empty(slot.nbytes, slot.offset) if leaf is None else leaf.array
        touched = leaf is not None and leaf.touched
        has_blocks = slot.blocks is not None and len(slot.blocks) == 16 * block_count(slot.nbytes)
        if verify is not None and has_blocks and _halved(source, slot.nbytes, touched=touched):
            if read_blocks_split(source, slot.offset, buffer.data) != slot.blocks:
                verify(slot.name, xxh3_64_hexdigest(buffer.data))  # which the leaf's own checksum then judges
            return {slot.name: buffer.view(slot.dtype).reshape(slot.shape)}
        arrays = [_read_one(source, slot.offset, buffer, slot.dtype, slot.shape, digests, touched=touched)]
    else:
        arrays = read_tensors(
            source,
            [slot.offset for slot in slots],
            [slot.nbytes for slot in slots],
            [slot.dtype for slot in slots],
            [slot.shape for slot in slots],
            digests,
        )
    if verify is not None and digests is not None:
        for slot, digest in zip(slots, digests, strict=True):
            verify(slot.name, digest)
    return {slot.name: array for slot, array in zip(slots, arrays, strict=True)}
