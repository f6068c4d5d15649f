"""A save's host-memory budget: device arrays (and numpy arrays to copy) come to the host in pieces while written.

A save registers with a :class:`HostBudget` the arrays that would cost host memory: arrays on an accelerator, and,
with ``copy=True``, numpy arrays the caller may change. They are written piece by piece, each piece fetched when the
writer reaches it and released once the writer has the next one (it may hold a piece until then), so that at most
``limit`` bytes are held at a time, the piece in the writer's hands included. As soon as all the bytes not yet fetched
fit in what the budget has left, every one of them is fetched at once (device-to-host copies started, numpy arrays
copied) and :attr:`HostBudget.fetched` is set: from then on the save no longer reads the caller's arrays, so the
caller may change them or donate them to a jitted step. Arrays already on the host without a copy (CPU
``jax.Array``\\ s, immutable even under ``copy``; numpy arrays without ``copy``) cost no extra host memory and are not
counted.

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
import os
import threading
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from jaxstow._format.dtypes import name_of_dtype
from jaxstow._format.pieces import Deferred
from jaxstow.errors import ArgumentError

__all__ = ["HostBudget", "default_limit"]

#: Platforms whose arrays are host memory already: holding them for a save is a zero-copy view.
_HOST_PLATFORMS = frozenset({"cpu"})
#: The largest piece, so that a large budget still streams in steps the writer can overlap.
_MAX_PIECE_BYTES = 256 << 20


def default_limit() -> int:
    """A quarter of the machine's physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4


def checked_limit(limit: int | None) -> int:
    """``limit``, or the default for ``None``; a limit that is not a positive integer raises an ArgumentError."""
    if limit is None:
        return default_limit()
    if isinstance(limit, bool) or not isinstance(limit, int | np.integer) or limit <= 0:
        raise ArgumentError(f"host_memory_limit must be a positive number of bytes, not {limit!r}")
    return int(limit)


class HostBudget:
    """The host memory a save may hold at once for its deferred arrays; see the module's docstring."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = checked_limit(limit)
        self.piece_bytes = max(1, min(self.limit // 4, _MAX_PIECE_BYTES))
        #: Set once nothing is left to fetch from the caller's arrays (or the save has ended).
        self.fetched = threading.Event()
        self.fetched.set()
        self.peak = 0
        self._tensors: list[_Fetched] = []
        self._unfetched = 0
        self._held = 0
        self._in_hand = 0  # the piece the writer was last given, which it may hold until it has the next one
        self._lock = threading.Lock()

    def defer(self, leaf: Any, *, copy: bool) -> Deferred | None:
        """A :class:`~jaxstow._format.pieces.Deferred` for ``leaf`` if holding it costs host memory, else ``None``."""
        if not self.costs_memory(leaf, copy=copy):
            return None
        tensor = _Fetched(leaf, self)
        with self._lock:
            self._tensors.append(tensor)
            self._unfetched += tensor.nbytes
            self.fetched.clear()
        return tensor

    def fetch_rest_if_it_fits(self) -> None:
        """Fetch every byte not yet fetched if they all fit in the budget's remainder; then set :attr:`fetched`."""
        with self._lock:
            if self.fetched.is_set() or self._unfetched > self.limit - self._held:
                return
            for tensor in self._tensors:
                tensor.fetch_rest()
            self.fetched.set()

    def release(self) -> None:
        """The save has ended, well or not: nothing waits for :attr:`fetched` any longer."""
        self.fetched.set()

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
            and isinstance(leaf.sharding, jax.sharding.SingleDeviceSharding)
            and isinstance(leaf.dtype, np.dtype)
            and leaf.size > 0
            and name_of_dtype(leaf.dtype) is not None
            and next(iter(leaf.devices())).platform not in _HOST_PLATFORMS
        )

    def _count(self, fetched: int, held: int) -> None:
        """Called with the lock held: ``fetched`` bytes were fetched, ``held`` bytes more (or fewer) are held."""
        self._unfetched -= fetched
        self._held += held
        self.peak = max(self.peak, self._held)

    def _hand_over(self, nbytes: int) -> None:
        """Called with the lock held, once the writer's next piece is held: the writer takes it, of ``nbytes``.

        The piece it had before is released only now, since the writer may hold it until it has the next one (its
        loop's variable); so what is held, counted, includes the piece in the writer's hands.
        """
        self._held -= self._in_hand
        self._in_hand = nbytes


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


class _Fetched(Deferred):
    """One array of a :class:`HostBudget`, fetched piece by piece (flat slices of at most ``piece_bytes``)."""

    def __init__(self, source: Any, budget: HostBudget) -> None:
        super().__init__(source.dtype, source.shape)
        if not isinstance(source, np.ndarray):
            # The next step may donate the caller's array as soon as the save returns: the pieces are fetched from
            # a copy on the device, whose buffer is this save's alone (the runtime makes a donation wait for it).
            source = jax.numpy.copy(source)
        self._source: Any = source
        self._budget = budget
        step = max(1, budget.piece_bytes // self.dtype.itemsize)
        size = self.nbytes // self.dtype.itemsize
        self._bounds = [(start, min(start + step, size)) for start in range(0, size, step)]
        self._ahead: dict[int, Any] = {}
        self._next = 0  # the first piece not fetched for the writing pass

    def pieces(self, *, final: bool = True) -> Iterator[np.ndarray]:
        budget = self._budget
        for index, (start, stop) in enumerate(self._bounds):
            nbytes = (stop - start) * self.dtype.itemsize
            if final:
                budget.fetch_rest_if_it_fits()
                with budget._lock:
                    piece = self._ahead.pop(index, None)
                    if piece is None:
                        piece = self._fetch(index)
                        self._next = index + 1
                        budget._count(nbytes, nbytes)
                    budget._hand_over(nbytes)
            else:
                with budget._lock:
                    piece = self._ahead.get(index)
                    if piece is None:
                        piece = self._fetch(index)
            yield np.asarray(piece)
            del piece
        if final:
            self._source = None  # the caller's array is no longer needed

    def fetch_rest(self) -> None:
        """Fetch, at once, the pieces the writing pass has not fetched yet (the budget's lock is held)."""
        for index in range(self._next, len(self._bounds)):
            start, stop = self._bounds[index]
            self._ahead[index] = self._fetch(index)
            self._budget._count((stop - start) * self.dtype.itemsize, (stop - start) * self.dtype.itemsize)
        self._next = len(self._bounds)

    def _fetch(self, index: int) -> Any:
        """Piece ``index`` on the host: a copy of a numpy array's, or an accelerator's copied to the CPU (started)."""
        start, stop = self._bounds[index]
        if isinstance(self._source, np.ndarray):
            if self._source.flags.c_contiguous:
                return self._source.reshape(-1)[start:stop].copy()
            return self._source.flat[start:stop]  # a copy of these elements alone, in C order (a transposed array)
        piece = self._source.reshape(-1)[start:stop]
        on_host = jax.device_put(piece, jax.devices("cpu")[0])
        # A host platform's array may come back as it is: a view of it keeps a donation from reusing its buffer.
        return np.asarray(on_host) if next(iter(piece.devices())).platform in _HOST_PLATFORMS else on_host
