"""Read once, gather: a box that several processes restore is read from storage once, its ranges split among them,
and reaches the others over jax's own collectives.

While a multi-process restore runs inside :func:`reading_once`, each sharded leaf's boxes are looked at across every
process of the run (the placement says which devices, so which processes, hold each box). A box that several
processes hold, and that is large enough to pay for it, is cut into as many ranges as it has holders (as a save
cuts a replicated shard); each holder reads one range while the restore runs (taking turns, so that reads spread
evenly over the processes), and the leaf is left :class:`Pending`. Once every process has said that it read its
ranges (the caller's bounded barrier), :meth:`Exchange.deliver` gathers them: the processes that hold the same boxes
form a group, the ranges of all its leaves are packed into one row of bytes per process and all-gathered in chunks
of at most ``chunk_bytes`` (:mod:`jaxstow._read.gathering`); groups that share no process gather at once, and every
gather after the first waits behind a barrier again, so that no process enters a collective that another may never
reach; then each pending leaf becomes its ``jax.Array``. Storage serves the replicated part of a model once, not once per
replica. Every process must restore the same leaves onto the same shardings: :meth:`Exchange.digest` says which
ranges this one expects, for the caller to compare before any collective. See docs/scaling.md.

>>> from jaxstow._read.broadcast import readers
>>> for box, parts in readers({((0, 6),): [0, 1, 2], ((6, 9),): [3]}, min_bytes=0, itemsize=4).items():
...     print(box, [(part, reader) for part, _, reader in parts])
((0, 6),) [(((0, 2),), 0), (((2, 4),), 1), (((4, 6),), 2)]
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import threading
import zlib
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import jax
import numpy as np

from jaxstow._format.replicas import share_box
from jaxstow._format.shards import Box
from jaxstow._format.tensor_reads import aligned_empty
from jaxstow._read.gathering import gather_rows
from jaxstow._util.signal_free import start_thread

__all__ = ["CHUNK_BYTES", "MIN_BYTES", "Exchange", "Pending", "active", "reading_once", "readers"]

#: Boxes smaller than this are read by every process that holds them: a read costs little more than a gather.
MIN_BYTES = 64 << 10
#: What one collective gathers at most, every process's row together (device memory of the gathered chunk).
CHUNK_BYTES = 256 << 20
_PAGE = 4096
_ALIGN = 64 << 10  # rows are padded to a multiple of this, so that few lengths are compiled

_lock = threading.Lock()
_current: list[tuple[str, Exchange]] = []  # the folder each restore reads, and its exchange


@contextlib.contextmanager
def reading_once(exchange: Exchange, where: str) -> Iterator[Exchange]:
    """Restores on any thread of this process of the files in ``where`` (a folder's path or URL) read their shared
    boxes' ranges for ``exchange`` until the block ends; their leaves stay pending until :meth:`Exchange.deliver`.
    Other files restored meanwhile are read as usual."""
    entry = (where.replace("\\", "/").rstrip("/") + "/", exchange)
    with _lock:
        _current.append(entry)
    try:
        yield exchange
    finally:
        with _lock:
            _current.remove(entry)


def active(file: str) -> Exchange | None:
    """The exchange of the restore running that reads ``file``, or ``None`` (then every process reads what it
    needs)."""
    file = file.replace("\\", "/")
    with _lock:
        return next((exchange for where, exchange in reversed(_current) if file.startswith(where)), None)


def readers(
    holders: dict[Box, list[int]], *, min_bytes: int, itemsize: int, turn: int = 0
) -> dict[Box, list[tuple[Box, tuple[slice, ...] | None, int]]]:
    """How each box that several processes need (of at least ``min_bytes``) is read: cut into as many ranges as it
    has holders, each range read by one of them (taking turns from ``turn`` on), with where it lies in the box."""
    plan: dict[Box, list[tuple[Box, tuple[slice, ...] | None, int]]] = {}
    for box, processes in sorted(holders.items()):
        count = len(processes)
        if count < 2 or math.prod(stop - start for start, stop in box) * itemsize < min_bytes:
            continue
        plan[box] = []
        for rank in range(count):
            part, within = share_box(box, rank, count)
            if part is not None:
                plan[box].append((part, within, processes[(rank + turn) % count]))
    return plan


class _Range(NamedTuple):
    """A range of a shared box: read by ``reader``, gathered by the box's ``holders``."""

    tag: str
    box: Box
    part: Box
    within: tuple[slice, ...] | None
    reader: int
    holders: tuple[int, ...]
    nbytes: int


class Pending:
    """Stands for a restored leaf until :meth:`Exchange.deliver` gathers its boxes and builds it."""

    def __init__(
        self, tag: str, build: Callable[[], jax.Array], *, shape: tuple[int, ...], sharding: jax.sharding.Sharding
    ) -> None:
        self.tag = tag
        self.build = build
        self.shape = shape  # what the leaf will be, and where
        self.sharding = sharding

    def __repr__(self) -> str:
        return f"<{self.tag}: pending>"


class Exchange:
    """The shared boxes of one restore in this process: the ranges it reads, and those the others send it."""

    def __init__(
        self,
        *,
        chunk_bytes: int | None = None,
        min_bytes: int | None = None,
        me: int | None = None,
        gather: Callable[[tuple[int, ...], np.ndarray], np.ndarray] = gather_rows,
    ) -> None:
        """``chunk_bytes`` and ``min_bytes``: :data:`CHUNK_BYTES` and :data:`MIN_BYTES` by default; ``me``: this
        process's index; ``gather(group, row)``: the collective (:func:`~jaxstow._read.gathering.gather_rows`)."""
        self.me = int(jax.process_index()) if me is None else me
        self.gather = gather
        self.chunk_bytes = CHUNK_BYTES if chunk_bytes is None else chunk_bytes
        self.min_bytes = MIN_BYTES if min_bytes is None else min_bytes
        self._lock = threading.Lock()
        self._ranges: list[_Range] = []  # every range of every shared box, whoever reads it
        self._read: dict[tuple[str, Box], np.ndarray] = {}  # the ranges read here, as bytes
        self._boxes: dict[tuple[str, Box], np.ndarray] = {}  # the boxes held here, completed by the gather
        self._places: dict[tuple[str, Box], np.ndarray] = {}  # where the bytes of each range gathered go
        self._late: list[tuple[np.ndarray, np.ndarray]] = []  # (received, its place) where the place is strided

    def share(
        self,
        tag: str,
        placement: jax.sharding.Sharding,
        shape: tuple[int, ...],
        dtype: np.dtype,
        read: Callable[[Box], np.ndarray],
    ) -> dict[Box, np.ndarray]:
        """Plan the boxes of the leaf ``tag`` (the same name in every process) that several processes hold, and
        read this process's ranges of them now; the boxes held here that :meth:`deliver` completes, by box."""
        holders: dict[Box, set[int]] = {}
        for device, index in placement.devices_indices_map(shape).items():
            holders.setdefault(_box(index, shape), set()).add(int(device.process_index))  # type: ignore[attr-defined]
        turn = zlib.crc32(tag.encode())  # leaves take turns too, so that a process reads as much as another
        ordered = {box: sorted(processes) for box, processes in holders.items()}
        plan = readers(ordered, min_bytes=self.min_bytes, itemsize=dtype.itemsize, turn=turn)
        ranges = [
            _Range(tag, box, part, within, reader, tuple(ordered[box]), _volume(part) * dtype.itemsize)
            for box, parts in plan.items()
            for part, within, reader in parts
        ]
        mine = {box: _empty(box, dtype) for box in plan if self.me in ordered[box]}
        # The boxes' fresh pages are touched while this process's ranges are read: storage is waited for, and the
        # gather later writes into memory already there.
        touching = threading.Thread(target=_touch, args=(list(mine.values()),), name="jaxstow-touch")
        start_thread(touching)
        try:
            got = [(found, np.ascontiguousarray(read(found.part))) for found in ranges if found.reader == self.me]
        finally:
            touching.join()
        for found, data in got:
            mine[found.box][found.within or ...] = data
            with self._lock:
                self._read[(tag, found.part)] = data.reshape(-1).view(np.uint8)
        with self._lock:
            self._ranges.extend(ranges)
            self._boxes.update({(tag, box): array for box, array in mine.items()})
        return mine

    def digest(self) -> str:
        """What this process expects to gather: every range of every leaf and who reads it, hashed."""
        with self._lock:
            ranges = sorted((r.tag, r.part, r.reader, r.holders, r.nbytes) for r in self._ranges)
        return hashlib.sha256(json.dumps(ranges).encode()).hexdigest()[:16]

    def deliver(self, tree: Any, barrier: Callable[[str], None]) -> Any:
        """``tree`` with its pending leaves built, once every process's ranges are gathered. Every process calls it
        after every process has read its ranges; ``barrier(name)`` (bounded) runs before each further wave of
        gathers (in a wave, a process takes part in one gather at most), so that no process enters a collective
        that another may never reach."""
        rows: dict[tuple[int, ...], dict[int, list[_Range]]] = {}
        for found in sorted(self._ranges, key=lambda r: (r.tag, r.part)):
            rows.setdefault(found.holders, {}).setdefault(found.reader, []).append(found)
        longest = {group: max(map(_length, members.values())) for group, members in rows.items()}
        sizes = {group: _chunk(longest[group], self.chunk_bytes // len(group)) for group in rows}
        rounds = max((math.ceil(longest[group] / sizes[group]) for group in rows), default=0)
        for round_ in range(rounds):
            for wave, groups in enumerate(_waves(sorted(rows))):
                if round_ or wave:
                    barrier(f"chunk{round_}.{wave}")
                for group in groups:
                    low = round_ * sizes[group]
                    if self.me in group and low < longest[group]:
                        self._gather(group, rows[group], low, min(low + sizes[group], longest[group]))
        for received, place in self._late:
            place[...] = received
        return jax.tree.map(lambda leaf: leaf.build() if isinstance(leaf, Pending) else leaf, tree)

    def _gather(self, group: tuple[int, ...], rows: dict[int, list[_Range]], low: int, high: int) -> None:
        """Bytes ``low`` to ``high`` of every row of ``group``, gathered; the others' put into the boxes held here."""
        length = -(-(high - low) // _ALIGN) * _ALIGN
        pieces = [
            (self._read[(found.tag, found.part)][start:stop], at)
            for found, start, stop, at in _window(rows.get(self.me, []), low, high)
        ]
        if len(pieces) == 1 and pieces[0][1] == 0 and pieces[0][0].size == length and _aligned(pieces[0][0]):
            row = pieces[0][0]  # one range read here fills the row: sent as it is
        else:
            row = aligned_empty(length)  # aligned: jax takes it on CPU without a copy
            filled = 0
            for piece, at in pieces:
                row[at : at + piece.size] = piece
                filled = at + piece.size
            row[filled:] = 0
        gathered = self.gather(group, row)
        for index, member in enumerate(group):
            if member != self.me:
                for found, start, stop, at in _window(rows.get(member, []), low, high):
                    self._place(found)[start:stop] = gathered[index, at : at + stop - start]

    def _place(self, found: _Range) -> np.ndarray:
        """Where the bytes of the range ``found`` go: its place in its box, or a buffer copied there at the end
        where that place is strided."""
        key = (found.tag, found.part)
        if key not in self._places:
            place = self._boxes[(found.tag, found.box)][found.within or ...]
            if place.flags.c_contiguous:
                self._places[key] = place.reshape(-1).view(np.uint8)
            else:
                received = np.empty(place.shape, place.dtype)
                self._late.append((received, place))
                self._places[key] = received.reshape(-1).view(np.uint8)
        return self._places[key]


def _waves(groups: list[tuple[int, ...]]) -> list[list[tuple[int, ...]]]:
    """``groups`` in waves of groups that share no process, each group in the first wave it fits: a process takes
    part in at most one gather of a wave, so that each gather follows a barrier and disjoint groups gather at once.

    >>> _waves([(0, 1, 2, 3), (0, 2), (1, 3)])
    [[(0, 1, 2, 3)], [(0, 2), (1, 3)]]
    """
    waves: list[list[tuple[int, ...]]] = []
    for group in groups:
        wave = next((wave for wave in waves if not any(set(group) & set(other) for other in wave)), None)
        if wave is None:
            waves.append([group])
        else:
            wave.append(group)
    return waves


def _window(ranges: list[_Range], low: int, high: int) -> Iterator[tuple[_Range, int, int, int]]:
    """The ranges of a row (laid end to end) that overlap its bytes ``low`` to ``high``: each with the bytes of it
    there (start and stop within the range) and where they start in the window."""
    offset = 0
    for found in ranges:
        start, stop = max(offset, low), min(offset + found.nbytes, high)
        if start < stop:
            yield found, start - offset, stop - offset, start - low
        offset += found.nbytes


def _touch(arrays: list[np.ndarray]) -> None:
    """Write a byte of every page of ``arrays``, so that the system backs them with memory now."""
    for array in arrays:
        flat = array.reshape(-1).view(np.uint8)
        flat[::_PAGE] = 0


def _aligned(array: np.ndarray) -> bool:
    return bool(array.ctypes.data % 64 == 0)


def _length(ranges: list[_Range]) -> int:
    return sum(found.nbytes for found in ranges)


def _chunk(longest: int, budget: int) -> int:
    """The bytes of each row gathered at once: all of it, or as much as ``budget`` allows (a multiple of 64 KiB)."""
    return max(_ALIGN, min(-(-longest // _ALIGN) * _ALIGN, budget // _ALIGN * _ALIGN))


def _empty(box: Box, dtype: np.dtype) -> np.ndarray:
    """A box's array, 64-byte aligned so that jax puts it on a CPU device without a copy."""
    return aligned_empty(_volume(box) * dtype.itemsize).view(dtype).reshape([stop - start for start, stop in box])


def _box(index: tuple[slice, ...], shape: tuple[int, ...]) -> Box:
    return tuple((axis.indices(size)[0], axis.indices(size)[1]) for axis, size in zip(index, shape, strict=True))


def _volume(box: Box) -> int:
    return math.prod(stop - start for start, stop in box)
