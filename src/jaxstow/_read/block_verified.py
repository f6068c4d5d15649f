"""A part of a stored array read and verified block by block: the blocks it touches are read whole and each compared
with its checksum (:mod:`~jaxstow._format.block_checksums`; an array of one block, which has none, with its own).

A part is read so where that reads at most :data:`_OVER_READ` times its bytes (a range of 20 MiB or more, or ranges
that fill most of the blocks they touch), so that verifying never makes a restore read much more than it needs;
otherwise (a few rows, a column of a matrix) its bytes are read as they are, and only the blocks it holds whole are
verified: the bytes of a block it holds in part go unverified, as a part of a tensor without block checksums does. Only the blocks the part touches are read: a range of whole blocks straight into place, a block
it covers in part into a buffer of its own; a part that is many ranges is read through a scratch buffer of the
blocks they touch, at most :data:`_SCRATCH` bytes at a time.

>>> import io, numpy as np
>>> from jaxstow._format.block_checksums import Checksums
>>> from jaxstow._storage.opening import open_source
>>> array = np.arange(2**19, dtype=np.float32).reshape(512, 1024)
>>> blocks = "".join(Checksums.of(array.data.cast("B"))[1])
>>> source = open_source(io.BytesIO(array.tobytes()))
>>> part = read_verified_box(source, 0, array.dtype, array.shape, ((3, 500), (2, 4)), blocks, file="f", path="w")
>>> bool((part == array[3:500, 2:4]).all())
True
"""

from __future__ import annotations

import math
from typing import NamedTuple, Protocol

import numpy as np

from jaxstow._format.block_checksums import BLOCK_BYTES, block_span, checked_blocks
from jaxstow._format.checksum import checksum_bytes
from jaxstow._format.shards import Box
from jaxstow._format.source import ReadSource
from jaxstow._format.tensor_reads import aligned_empty, read_range
from jaxstow._read.slicing import read_box
from jaxstow.errors import CorruptFileError

__all__ = ["Checksummed", "read_part", "read_verified_box", "verify_box_blocks"]

#: The most bytes a part that is many ranges is read through at once (more: it is read in parts along an axis).
_SCRATCH = 64 << 20
#: A part is verified where the blocks it touches hold at most this many times its bytes.
_OVER_READ = 1.05


class Checksummed(Protocol):
    """A stored tensor's checksums, as its entry gives them: its blocks' (``None``: none) and its own (``None``: none).

    A stored leaf and a stored shard are such.
    """

    @property
    def blocks(self) -> object: ...

    @property
    def checksum(self) -> str | None: ...


class _Stored(NamedTuple):
    """Where a tensor's bytes are: from ``offset`` of ``source``."""

    source: ReadSource
    offset: int


class _Tensor:
    """A stored tensor's layout and its blocks' checksums."""

    def __init__(self, dtype: np.dtype, shape: tuple[int, ...], blocks: str, *, file: str | None, path: str) -> None:
        """``blocks``: the checksum of each block, checked (:func:`_verifiable`)."""
        self.dtype, self.shape, self.file, self.path, self.blocks = dtype, shape, file, path, blocks
        self.nbytes = math.prod(shape) * dtype.itemsize
        self.strides = tuple(math.prod(shape[axis + 1 :]) * dtype.itemsize for axis in range(len(shape)))

    def first_byte(self, box: Box) -> int:
        return sum(start * stride for (start, _), stride in zip(box, self.strides, strict=True))

    def end_byte(self, box: Box) -> int:
        """One past the last byte of ``box`` (a box of at least one element)."""
        last = sum((stop - 1) * stride for (_, stop), stride in zip(box, self.strides, strict=True))
        return last + self.dtype.itemsize

    def touched(self, box: Box) -> np.ndarray:
        """Whether each block holds a byte of ``box`` (a box of at least one element)."""
        count = -(-self.nbytes // BLOCK_BYTES)
        first = self.first_byte(box)
        if self.end_byte(box) - first == math.prod(stop - start for start, stop in box) * self.dtype.itemsize:
            low, high = block_span(first, self.end_byte(box), self.nbytes)  # one range
            marks = np.zeros(count, np.bool_)
            marks[low:high] = True
            return marks
        last = max(axis for axis, (start, stop) in enumerate(box) if (start, stop) != (0, self.shape[axis]))
        extent = [stop - start for start, stop in box[:last]]
        run_bytes = (box[last][1] - box[last][0]) * self.strides[last]
        starts = np.full(math.prod(extent), first, np.int64)
        for axis, index in enumerate(np.indices(extent).reshape(last, -1)):
            starts += index * self.strides[axis]
        opened = np.bincount(starts // BLOCK_BYTES, minlength=count + 1)
        closed = np.bincount((starts + run_bytes - 1) // BLOCK_BYTES + 1, minlength=count + 1)
        return np.cumsum(opened - closed)[:count] > 0

    def covered(self, box: Box) -> list[tuple[int, int]]:
        """Each block whose bytes ``box`` (of at least one element) holds whole, and where they start among the box's
        bytes (in row-major order): those a read of the box alone verifies at no cost."""
        first, end = self.first_byte(box), self.end_byte(box)
        if end - first == math.prod(stop - start for start, stop in box) * self.dtype.itemsize:
            starts, run_bytes = np.array([first], np.int64), end - first  # one range
        else:
            last = max(axis for axis, (start, stop) in enumerate(box) if (start, stop) != (0, self.shape[axis]))
            run_bytes = (box[last][1] - box[last][0]) * self.strides[last]
            if run_bytes < min(BLOCK_BYTES, self.nbytes - (self.nbytes - 1) // BLOCK_BYTES * BLOCK_BYTES):
                return []  # runs shorter than any block: none held whole
            extent = [stop - start for start, stop in box[:last]]
            starts = np.full(math.prod(extent), first, np.int64)
            for axis, index in enumerate(np.indices(extent).reshape(last, -1)):
                starts += index * self.strides[axis]
        found = []
        for run, start in enumerate(starts.tolist()):
            block = -(-start // BLOCK_BYTES)
            while block * BLOCK_BYTES < self.nbytes and self.block_bytes(block)[1] <= start + run_bytes:
                found.append((block, run * run_bytes + block * BLOCK_BYTES - start))
                block += 1
        return found

    def affordable(self, box: Box) -> bool:
        """Whether the blocks ``box`` touches hold at most :data:`_OVER_READ` times its bytes."""
        needed = math.prod(stop - start for start, stop in box) * self.dtype.itemsize
        if not needed:
            return True
        touched = self.touched(box)
        held = int(touched.sum()) * BLOCK_BYTES - (BLOCK_BYTES * len(touched) - self.nbytes) * bool(touched[-1])
        return held <= _OVER_READ * needed

    def check(self, block: int, data: memoryview) -> None:
        """Raise a :class:`CorruptFileError` naming the leaf unless ``data``, the bytes of ``block``, match its
        checksum."""
        found, wanted = checksum_bytes(data), self.blocks[16 * block : 16 * block + 16]
        if found != wanted:
            start = block * BLOCK_BYTES
            raise CorruptFileError(
                f"checksum mismatch in bytes {start} to {min(start + BLOCK_BYTES, self.nbytes)} of the leaf (block "
                f"{block}: expected xxh3 {wanted}, found {found}): the file is corrupt",
                file=self.file,
                path=self.path,
            )

    def block_bytes(self, block: int) -> tuple[int, int]:
        return block * BLOCK_BYTES, min((block + 1) * BLOCK_BYTES, self.nbytes)


def _verifiable(
    dtype: np.dtype, shape: tuple[int, ...], checks: Checksummed | None, *, file: str | None, path: str
) -> _Tensor | None:
    """The tensor, its parts verified by its blocks' checksums (a :class:`FormatError` if they are malformed), or, for
    a tensor of one block, which has none, by its own checksum, that block's; ``None`` where it has neither."""
    nbytes = math.prod(shape) * dtype.itemsize
    if checks is not None and checks.blocks is not None:
        return _Tensor(dtype, shape, checked_blocks(checks.blocks, nbytes, file=file, path=path), file=file, path=path)
    if checks is not None and checks.checksum is not None and 0 < nbytes <= BLOCK_BYTES:
        return _Tensor(dtype, shape, checks.checksum, file=file, path=path)
    return None


def read_verified_box(
    source: ReadSource,
    offset: int,
    dtype: np.dtype,
    shape: tuple[int, ...],
    box: Box,
    blocks: object,
    *,
    file: str | None,
    path: str,
    into: np.ndarray | None = None,
) -> np.ndarray:
    """The elements of ``box`` of the row-major array of ``dtype`` and ``shape`` stored at ``offset`` of ``source``,
    every block they touch verified against ``blocks`` (a :class:`FormatError` if those are malformed, a
    :class:`CorruptFileError` naming ``file`` and ``path`` if a block does not match).

    The result is ``into`` (a C-contiguous array of the box's shape and ``dtype``) filled, or a new 64-byte-aligned
    array.
    """
    checked = checked_blocks(blocks, math.prod(shape) * dtype.itemsize, file=file, path=path)
    return _read_verified(_Tensor(dtype, shape, checked, file=file, path=path), _Stored(source, offset), box, into)


def _read_verified(tensor: _Tensor, stored: _Stored, box: Box, into: np.ndarray | None) -> np.ndarray:
    extent = tuple(stop - start for start, stop in box)
    if into is None:
        nbytes = math.prod(extent) * tensor.dtype.itemsize
        into = aligned_empty(nbytes, stored.offset + tensor.first_byte(box)).view(tensor.dtype).reshape(extent)
    if into.size:
        _read_into(tensor, stored, box, into)
    return into


def verify_box_blocks(
    data: np.ndarray,
    dtype: np.dtype,
    shape: tuple[int, ...],
    box: Box,
    checks: Checksummed,
    *,
    file: str | None,
    path: str,
) -> None:
    """Check every block of a tensor whose bytes are at hand (``data``, flat ``uint8``: a memory map's) that ``box``
    touches, where :func:`read_part` would read them (its blocks' checksums are checked for form in any case)."""
    tensor = _verifiable(dtype, shape, checks, file=file, path=path)
    if tensor is None or not math.prod(stop - start for start, stop in box):
        return
    touched = np.flatnonzero(tensor.touched(box)).tolist() if tensor.affordable(box) else None
    for block in touched if touched is not None else [block for block, _ in tensor.covered(box)]:
        start, stop = tensor.block_bytes(block)
        tensor.check(block, data[start:stop].data)


def _read_into(tensor: _Tensor, stored: _Stored, box: Box, out: np.ndarray) -> None:
    """Fill ``out`` (an array of ``box``'s shape, possibly a view into a larger one) with ``box``, verified."""
    first, end = tensor.first_byte(box), tensor.end_byte(box)
    if end - first == out.nbytes:  # one range
        if out.flags.c_contiguous:
            _read_range(tensor, stored, first, end, out.reshape(-1).view(np.uint8))
        else:
            whole = aligned_empty(out.nbytes, stored.offset + first)
            _read_range(tensor, stored, first, end, whole)
            out[...] = whole.view(tensor.dtype).reshape(out.shape)
        return
    splittable = [axis for axis, (start, stop) in enumerate(box) if stop - start > 1]
    if end - first > _SCRATCH and splittable:
        axis = splittable[0]
        start, stop = box[axis]
        middle = (start + stop) // 2
        for part in ((start, middle), (middle, stop)):
            within = tuple(
                slice(part[0] - start, part[1] - start) if at == axis else slice(None) for at in range(len(box))
            )
            _read_into(tensor, stored, (*box[:axis], part, *box[axis + 1 :]), out[within])
        return
    low, high = block_span(first, end, tensor.nbytes)
    base = low * BLOCK_BYTES
    scratch = aligned_empty(min(high * BLOCK_BYTES, tensor.nbytes) - base, stored.offset + base)
    marks = tensor.touched(box)[low:high]
    edges = np.flatnonzero(np.diff(np.concatenate(([False], marks, [False])).astype(np.int8)))
    for run_start, run_stop in edges.reshape(-1, 2).tolist():
        start, _ = tensor.block_bytes(low + run_start)
        _, stop = tensor.block_bytes(low + run_stop - 1)
        _read_blocks(tensor, stored, start, scratch[start - base : stop - base])
    out[...] = np.ndarray(out.shape, tensor.dtype, buffer=scratch, offset=first - base, strides=tensor.strides)


def _read_range(tensor: _Tensor, stored: _Stored, start: int, stop: int, into: np.ndarray) -> None:
    """Read bytes ``start`` to ``stop`` of the tensor into ``into`` (flat ``uint8``), every block they touch verified:
    the blocks they cover whole straight into place, the one or two they cover in part through buffers."""
    low, high = block_span(start, stop, tensor.nbytes)
    whole_low = low if start == tensor.block_bytes(low)[0] else low + 1
    whole_high = high if stop == tensor.block_bytes(high - 1)[1] else high - 1
    if whole_low < whole_high:
        begin, _ = tensor.block_bytes(whole_low)
        _, end = tensor.block_bytes(whole_high - 1)
        _read_blocks(tensor, stored, begin, into[begin - start : end - start])
    for block in sorted({low, high - 1} - set(range(whole_low, whole_high))):
        begin, end = tensor.block_bytes(block)
        buffer = aligned_empty(end - begin, stored.offset + begin)
        _read_blocks(tensor, stored, begin, buffer)
        at, until = max(begin, start), min(end, stop)
        into[at - start : until - start] = buffer[at - begin : until - begin]


def _read_blocks(tensor: _Tensor, stored: _Stored, start: int, into: np.ndarray) -> None:
    """Read whole blocks from byte ``start`` of the tensor (a block's first) into ``into``, and check each."""
    read_range(stored.source, stored.offset + start, into.data)
    first = start // BLOCK_BYTES
    for at in range(0, into.size, BLOCK_BYTES):
        tensor.check(first + at // BLOCK_BYTES, into[at : at + BLOCK_BYTES].data)


def read_part(
    source: ReadSource,
    offset: int,
    dtype: np.dtype,
    shape: tuple[int, ...],
    box: Box,
    checks: Checksummed | None,
    *,
    file: str | None,
    path: str,
    into: np.ndarray | None = None,
) -> np.ndarray:
    """:func:`read_verified_box` for a tensor whose ``checks`` hold block checksums (checked for form), or, for one of
    a single block, its own checksum, where the blocks ``box`` touches hold at most :data:`_OVER_READ` times its
    bytes; otherwise, and for a tensor with neither (a file written before block checksums, or by another writer) or
    ``checks=None``, :func:`~jaxstow._read.slicing.read_box`: its bytes unverified."""
    tensor = _verifiable(dtype, shape, checks, file=file, path=path)
    if tensor is not None and tensor.affordable(box):
        return _read_verified(tensor, _Stored(source, offset), box, into)
    part = read_box(source, offset, dtype, shape, box, into=into)
    if tensor is not None and part.size and (covered := tensor.covered(box)):  # the blocks held whole: at no cost
        held = np.ascontiguousarray(part).reshape(-1).view(np.uint8)
        for block, at in covered:
            start, stop = tensor.block_bytes(block)
            tensor.check(block, held[at : at + stop - start].data)
    return part
