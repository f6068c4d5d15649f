"""A save's host-memory budget: device arrays (and numpy arrays to copy) come to the host whole or in pieces while written.

A save registers with a :class:`HostBudget` the arrays that would cost host memory: arrays on an accelerator, and,
with ``copy=True``, numpy arrays the caller may change. At most ``limit`` bytes of them are held on the host at a time,
what the writer has in hand included. While all the bytes not yet fetched fit in what the budget has left, each array
is fetched whole, with no copy on its device: its device-to-host copy is started (into the device's page-locked
``pinned_host`` memory where it has one, a direct transfer at the link's speed; else ``copy_to_host_async``), then its
host array taken. An array larger than what is left is fetched in pieces (flat slices of at most ``piece_bytes``),
each cut on its device, brought to the host and freed there before the next is cut: the device holds at most one
piece beyond the caller's arrays. Each piece or array is released once the writer has the next one.

As soon as the rest fits, every array not yet fetched has its copy started, then taken, and :attr:`HostBudget.fetched`
is set: from then on the save no longer reads the caller's arrays, so the caller may change them, or donate them to a
jitted step (which deletes them). Arrays already on the host without a copy (CPU ``jax.Array``\\ s, immutable even
under ``copy``; numpy arrays without ``copy``) cost no extra host memory and are not counted.

>>> import numpy as np
>>> from jaxstow._write.host_budget import HostBudget
>>> budget = HostBudget(limit=64)
>>> weights = np.arange(32.0)  # 256 bytes, four times the budget
>>> tensor = budget.defer(weights, copy=True)
>>> pieces = [piece.nbytes for piece in tensor.written()]  # pieces of a quarter of the budget
>>> len(pieces), sum(pieces), budget.peak <= 64, budget.fetched.is_set()
(16, 256, True, True)
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
import xxhash

from jaxstow._format.checksum import as_bytes
from jaxstow._format.dtypes import name_of_dtype
from jaxstow._format.pieces import Deferred
from jaxstow._format.replicas import Box, print_ranges
from jaxstow._format.shard_holders import as_box
from jaxstow._util.host_memory import default_host_budget
from jaxstow._util.pinned import pinned_sharding
from jaxstow._write.mapped_copies import mapped_copy, mapped_elements
from jaxstow.errors import ArgumentError

__all__ = ["HostBudget", "on_host"]

#: Platforms whose arrays are host memory already: holding them for a save is a zero-copy view.
_HOST_PLATFORMS = frozenset({"cpu"})
#: The largest piece, so that a large budget still streams in steps the writer can overlap.
_MAX_PIECE_BYTES = 256 << 20


def checked_limit(limit: int | None) -> int:
    """``limit``, or the default for ``None``; a limit that is not a positive integer raises an ArgumentError."""
    if limit is None:
        return default_host_budget()
    if isinstance(limit, bool) or not isinstance(limit, int | np.integer) or limit <= 0:
        raise ArgumentError(f"host_memory_limit must be a positive number of bytes, not {limit!r}")
    return int(limit)


def on_host(leaf: jax.Array) -> bool:
    """Whether every device of ``leaf`` keeps its buffers in host memory (a host view of them is no copy)."""
    return all(device.platform in _HOST_PLATFORMS for device in leaf.devices())


class HostBudget:
    """The host memory a save may hold at once for its deferred arrays; see the module's docstring."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = checked_limit(limit)
        self.piece_bytes = max(1, min(self.limit // 4, _MAX_PIECE_BYTES))
        #: Set once the save no longer reads the caller's arrays (the writer's job sets it too when it ends).
        self.fetched = threading.Event()
        self.fetched.set()
        self.peak = 0
        self._tensors: list[_Fetched] = []
        self._unfetched = 0  # bytes neither fetched nor with their copy started
        self._reading = 0  # tensors whose source the save still reads
        self._encoding = 0  # trees whose encoding, still to come, reads the caller's arrays
        self._held = 0
        self._in_hand = 0  # what the writer was last given, which it may hold until it has the next piece
        self._lock = threading.Lock()

    def defer(self, leaf: Any, *, copy: bool, within: tuple[slice, ...] | None = None) -> Deferred | None:
        """A :class:`~jaxstow._format.pieces.Deferred` for ``leaf`` (or its part ``within``, slices of every axis) if
        holding it costs host memory, else ``None``."""
        if not self.costs_memory(leaf, copy=copy):
            return None
        tensor = _Fetched(leaf, self, within)
        with self._lock:
            self._tensors.append(tensor)
            self._unfetched += tensor.nbytes
            self._reading += 1
            self.fetched.clear()
        return tensor

    def replica_print(self, leaf: Any) -> str | None:
        """The :func:`~jaxstow._format.replicas.replica_print` of ``leaf``, a shard whose host copy costs memory, read
        from its device a piece at a time (the rows that hold the bytes it covers), else ``None``."""
        if not self.costs_memory(leaf, copy=False):
            return None
        lead = math.prod(leaf.shape[: _indexed_axes(leaf.shape)])
        row = leaf.nbytes // lead  # bytes of a row; a row index fits the int32 that jax indexes with
        most = max(row, self.piece_bytes // 2)  # bytes of a range read at once: the rows that hold it fit a piece
        spans = [
            (low, min(low + most, stop))
            for start, stop in print_ranges(leaf.nbytes)
            for low in range(start, stop, most)
        ]
        count = min(lead, max(-(-high // row) - low // row for low, high in spans))  # rows that hold any range
        per_call = min(len(spans), max(1, self.piece_bytes // (count * row)))
        hasher = xxhash.xxh3_64()
        for first in range(0, len(spans), per_call):
            group = spans[first : first + per_call]
            starts = [min(low // row, lead - count) for low, _ in group]
            padded = np.asarray(starts + starts[-1:] * (per_call - len(group)), np.int32)  # one program for every group
            held = np.asarray(_towards_host(_row_groups(leaf, padded, lead=lead, count=count)))[: len(group)]
            for (low, high), start, rows in zip(group, starts, held, strict=True):
                hasher.update(as_bytes(rows)[low - start * row : high - start * row])
            del held
        return hasher.hexdigest()

    def wait_for_encoding(self) -> None:
        """A tree whose encoding reads the caller's arrays is held: :attr:`fetched` waits for :meth:`encoded`."""
        with self._lock:
            self._encoding += 1
            self.fetched.clear()

    def encoded(self) -> None:
        """A tree counted by :meth:`wait_for_encoding` is encoded: it no longer reads the caller's arrays."""
        with self._lock:
            self._encoding -= 1
            self._settle()

    def start_rest_if_it_fits(self) -> None:
        """Start the device-to-host copy of every array not yet fetched if they all fit in the budget's remainder.

        The copies are counted as held from now on; numpy arrays to copy are copied now.
        """
        with self._lock:
            if self._unfetched and self._unfetched <= self.limit - self._held:
                for tensor in self._tensors:
                    tensor.start()

    def fetch_rest_if_it_fits(self) -> None:
        """Fetch every byte not yet fetched if they all fit in the budget's remainder; then set :attr:`fetched`.

        Every copy is started before the first is waited for, so that the transfers overlap.
        """
        with self._lock:
            if self.fetched.is_set() or not self._reading or self._unfetched > self.limit - self._held:
                return
            for tensor in self._tensors:
                tensor.start()
            for tensor in self._tensors:
                tensor.take_rest()
            self._settle()

    def counts(self, *, copy: bool) -> bool:
        """Whether a tree saved with ``copy`` may hold arrays that cost host memory here."""
        return copy or _accelerators_present()

    def costs_memory(self, leaf: Any, *, copy: bool) -> bool:
        """Whether holding ``leaf`` for a save costs host memory: on an accelerator, or a numpy array to copy."""
        if type(leaf) is np.ndarray:
            return copy and leaf.size > 0 and name_of_dtype(leaf.dtype) is not None
        return (
            _accelerators_present()
            and isinstance(leaf, jax.Array)
            and len(leaf.sharding.device_set) == 1  # on one device, whatever its sharding (a one-device mesh too)
            and leaf.is_fully_addressable
            and isinstance(leaf.dtype, np.dtype)
            and leaf.size > 0
            and name_of_dtype(leaf.dtype) is not None
            and not on_host(leaf)
        )

    def _room(self) -> int:
        """Called with the lock held: the bytes the budget has left, the writer's piece in hand counted as held."""
        return self.limit - self._held

    def _count(self, fetched: int, held: int) -> None:
        """Called with the lock held: ``fetched`` bytes were fetched, ``held`` bytes more (or fewer) are held."""
        self._unfetched -= fetched
        self._held += held
        self.peak = max(self.peak, self._held)

    def _hand_over(self, nbytes: int) -> None:
        """Called with the lock held, once the writer's next piece (or whole array) is held: it takes ``nbytes``.

        What it had before is released only now, since the writer may hold it until it has the next (its loop's
        variable); so what is held, counted, includes what is in the writer's hands.
        """
        self._held -= self._in_hand
        self._in_hand = nbytes

    def _settle(self) -> None:
        """Called with the lock held: set :attr:`fetched` if the save no longer reads any of the caller's arrays."""
        if not self._reading and not self._encoding:
            self.fetched.set()


@functools.cache
def _accelerators_present() -> bool:
    """Whether this process has devices whose memory is not the host's (else no jax array costs host memory)."""
    platforms = {jax.default_backend()}
    for platform in ("gpu", "tpu"):
        try:
            platforms |= {device.platform for device in jax.devices(platform)}
        except RuntimeError:  # no such backend here
            continue
    return not platforms <= _HOST_PLATFORMS


def _towards_host(array: jax.Array) -> jax.Array:
    """``array`` with its copy to the host started: a copy of it in its device's ``pinned_host`` memory (where the
    device has that memory), else ``array`` itself, its ``copy_to_host_async`` called. Its ``numpy.asarray`` waits for
    the copy."""
    pinned = pinned_sharding(next(iter(array.devices())))
    if pinned is not None:
        moved: jax.Array = jax.device_put(array, pinned)
        return moved
    array.copy_to_host_async()
    return array


@functools.partial(jax.jit, static_argnames=("lead", "count", "within"))
def _rows(source: jax.Array, start: Any, *, lead: int, count: int, within: Box | None = None) -> jax.Array:
    """Rows ``start`` to ``start + count`` of ``source`` (or of its part ``within``, a box in it) seen as ``lead``
    rows, cut on its device: one computation whose only buffer is its result (the part and the 2-D view of it are no
    copies inside it, nor is a row index ever past ``lead``)."""
    part = source if within is None else source[tuple(slice(low, high) for low, high in within)]
    return jax.lax.dynamic_slice_in_dim(part.reshape(lead, -1), start, count, 0)


@functools.partial(jax.jit, static_argnames=("lead", "count"))
def _row_groups(source: jax.Array, starts: Any, *, lead: int, count: int) -> jax.Array:
    """For each of ``starts``, rows ``start`` to ``start + count`` of ``source`` seen as ``lead`` rows, cut on its
    device in one computation whose only buffer is its result."""
    rows = source.reshape(lead, -1)
    return jax.vmap(lambda start: jax.lax.dynamic_slice_in_dim(rows, start, count, 0))(starts)


def _indexed_axes(shape: tuple[int, ...]) -> int:
    """How many leading axes of ``shape`` make the finest rows whose index fits an int32 (every axis, for most)."""
    return max(axes for axes in range(len(shape) + 1) if math.prod(shape[:axes]) < 1 << 31)


def _row_axes(shape: tuple[int, ...], step: int) -> int:
    """How many leading axes of ``shape`` make the rows of a piece: the fewest whose rows hold at most ``step``."""
    return next(axes for axes in range(1, len(shape) + 1) if math.prod(shape[axes:]) <= step)


class _Fetched(Deferred):
    """One array of a :class:`HostBudget`: fetched whole, or in pieces of at most ``piece_bytes``, in C order.

    An array on a device is read through an alias of the caller's array (the same buffer, another ``jax.Array``), so
    that the host copy jax keeps with the array it copied is this save's, freed with it, not kept with the caller's.
    """

    def __init__(self, source: Any, budget: HostBudget, within: tuple[slice, ...] | None = None) -> None:
        self._on_device = not isinstance(source, np.ndarray)
        #: The part of a device array that this tensor is (its box in it), cut from it piece by piece; ``None`` for all.
        self._within = None if within is None else as_box(within, source.shape)
        if within is not None and not self._on_device:
            source = source[within]  # a view
        shape = source.shape if self._within is None else tuple(high - low for low, high in self._within)
        super().__init__(source.dtype, shape)
        if self._on_device:
            source = jax.make_array_from_single_device_arrays(source.shape, source.sharding, [source])
        self._source: Any = source  # None once the save no longer reads it
        self._budget = budget
        step = max(1, budget.piece_bytes // self.dtype.itemsize)
        size = self.nbytes // self.dtype.itemsize
        # Pieces of whole rows on a device (the fewest leading axes whose rows fit a piece), so that each is cut
        # there by a row index; flat slices of a numpy array.
        axes = self.ndim if not self._on_device or size <= step else _row_axes(self.shape, step)
        self._lead = math.prod(self.shape[:axes])
        self._row = size // self._lead
        stride = max(1, step // self._row) * self._row
        self._bounds = [(start, min(start + stride, size)) for start in range(0, size, stride)]
        self._started = False  # fetched whole: its copy started (counted as held), then taken into ``_whole``
        self._whole: np.ndarray | None = None
        self._ahead: dict[int, np.ndarray] = {}
        self._next = 0  # the first piece not fetched for the writing pass

    def pieces(self, *, final: bool = True) -> Iterator[np.ndarray]:
        budget = self._budget
        for index, (start, stop) in enumerate(self._bounds):
            nbytes = (stop - start) * self.dtype.itemsize
            if final:
                budget.fetch_rest_if_it_fits()
            with budget._lock:
                if not final:
                    piece = self._piece_at(index)
                elif self._started or (index == 0 and self.nbytes <= budget._room()):
                    self.start()
                    piece = self._piece_at(index)
                    if index == 0:
                        budget._hand_over(self.nbytes)
                else:
                    ahead = self._ahead.pop(index, None)
                    piece = self._fetch(index) if ahead is None else ahead
                    if ahead is None:
                        self._next = index + 1
                        budget._count(nbytes, nbytes)
                    budget._hand_over(nbytes)
            yield piece
            del piece
        if final:
            with budget._lock:
                self._whole = None
                self._done_reading()

    def start(self) -> None:
        """Called with the budget's lock held: fetch this array whole, if none of it is fetched yet.

        Its copy to the host is started (a numpy array is copied now) and counted as held.
        """
        if self._started or self._next or self._source is None:
            return
        self._started = True
        self._budget._count(self.nbytes, self.nbytes)
        if self._on_device:
            self._source = _towards_host(self._cut(0, self._lead))
        else:
            self._whole = mapped_copy(self._source)  # a transposed array in its C order
            self._done_reading()

    def take_rest(self) -> None:
        """Called with the budget's lock held, after :meth:`start`: the rest of this array on the host, now.

        An array fetched whole is taken (its copy waited for); one partly written has its remaining pieces fetched.
        """
        if self._source is None:
            return
        if self._started:
            self._take_whole()
            return
        for index in range(self._next, len(self._bounds)):
            start, stop = self._bounds[index]
            self._ahead[index] = self._fetch(index)
            self._budget._count((stop - start) * self.dtype.itemsize, (stop - start) * self.dtype.itemsize)
        self._next = len(self._bounds)
        self._done_reading()

    def _piece_at(self, index: int) -> np.ndarray:
        """Piece ``index``: a view of the whole array if fetched whole, else the one fetched ahead, else fetched now
        (a piece of its own, not counted: for a pass that hashes the array before it is written)."""
        if self._started and self._whole is None:
            self._take_whole()
        start, stop = self._bounds[index]
        if self._whole is not None:
            return self._whole[start:stop]
        piece = self._ahead.get(index)
        return self._fetch(index) if piece is None else piece

    def _take_whole(self) -> None:
        self._whole = np.asarray(self._source).reshape(-1)
        self._done_reading()

    def _done_reading(self) -> None:
        if self._source is not None:
            self._source = None  # the caller's array is no longer needed
            self._budget._reading -= 1
            self._budget._settle()

    def _fetch(self, index: int) -> np.ndarray:
        """Piece ``index`` on the host: a copy of a numpy array's, or a device array's cut on its device, copied to
        the host and freed there before this returns (the device holds one piece at a time)."""
        start, stop = self._bounds[index]
        source = self._source
        if not self._on_device:
            if source.flags.c_contiguous:
                return mapped_copy(source.reshape(-1)[start:stop])
            return mapped_elements(source, start, stop)  # these alone, in C order (a transposed array)
        return np.asarray(_towards_host(self._cut(start // self._row, (stop - start) // self._row))).reshape(-1)

    def _cut(self, row: int, count: int) -> jax.Array:
        """Rows ``row`` to ``row + count`` of the source on its device: the source itself when they are all of it."""
        whole: jax.Array = self._source
        if self._within is None and count == self._lead:
            return whole
        cut: jax.Array = _rows(whole, row, lead=self._lead, count=count, within=self._within)
        return cut
