"""Page-locked host buffers that a restore reads a file into and that go to their device with no copy on the host.

A transfer to an accelerator from ordinary (pageable) host memory is a copy into page-locked memory and then a direct
transfer; reading the file straight into page-locked memory saves that copy. Each buffer here is an array in a
device's ``pinned_host`` memory of the exact dtype and shape of a piece, with a writable numpy view of its bytes: the
file is read into the view, then ``jax.device_put(buffer.array, device)`` moves it. A buffer is given back once that
transfer is done, and kept by (device, dtype, shape) for the next piece of the same kind (the layers of a model share a
few shapes), at most ``limit`` of them at a time.

Writing into an array jax holds is outside jax's contract, so :func:`writes_reach_the_device` checks once per device
that a byte written through the view reaches the device and that the device's copy is its own; where either fails
(or the view cannot be made) :meth:`PinnedPieces.take` gives ``None`` and the caller stages through a copy as before.

>>> import jax, numpy as np
>>> pieces = PinnedPieces(limit=2)
>>> pieces.take(jax.devices("cpu")[0], np.dtype(np.float32), (4,)) is None  # a CPU device: no transfer to save
True
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from typing import Any

import jax
import ml_dtypes
import numpy as np

from jaxstow._util.pinned import pinned_sharding

__all__ = ["PinnedPiece", "PinnedPieces", "sub_byte", "writes_reach_the_device"]

_Kind = tuple[Any, np.dtype, tuple[int, ...]]
_CHECKED: dict[Any, bool] = {}
_CHECKED_LOCK = threading.Lock()


class PinnedPiece:
    """A ``pinned_host`` array of one device (``array``) and a writable view of its bytes (``view``, typed)."""

    def __init__(self, array: jax.Array, view: np.ndarray) -> None:
        self.array, self.view = array, view

    @property
    def bytes(self) -> np.ndarray:
        """The view's bytes, flat: what a file is read into."""
        return self.view.reshape(-1).view(np.uint8)


def sub_byte(dtype: np.dtype) -> bool:
    """Whether ``dtype``'s elements are narrower than a byte (int4, float4_e2m1fn, ...): a device may pack them."""
    if dtype.itemsize != 1:
        return False
    for info in (ml_dtypes.iinfo, ml_dtypes.finfo):
        with contextlib.suppress(ValueError):
            return bool(info(dtype).bits < 8)
    return False


def _made(device: Any, dtype: np.dtype, shape: tuple[int, ...]) -> PinnedPiece | None:
    """A new buffer of ``dtype`` and ``shape`` in ``device``'s ``pinned_host`` memory, or ``None`` where it has
    none, the dtype's elements are not whole bytes, or its bytes are not one plain block a view can reach."""
    pinned = pinned_sharding(device)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if pinned is None or nbytes == 0 or sub_byte(dtype):
        return None
    try:
        array = jax.device_put(np.zeros(shape, dtype), pinned).block_until_ready()  # no copy left to land later
        if array.addressable_data(0).on_device_size_in_bytes() != nbytes:
            return None
        raw = (ctypes.c_uint8 * nbytes).from_address(array.unsafe_buffer_pointer())
    except Exception:  # a jax or a device that does not offer such a view: the caller copies instead
        return None
    return PinnedPiece(array, np.ctypeslib.as_array(raw).view(dtype).reshape(shape))


def writes_reach_the_device(device: Any) -> bool:
    """Whether bytes written through a :class:`PinnedPiece`'s view arrive on ``device`` with ``device_put``, in a
    copy of the device's own (a later write to the view leaves it as it was); checked once per device."""
    with _CHECKED_LOCK:
        if device in _CHECKED:
            return _CHECKED[device]
        piece = _made(device, np.dtype(np.uint8), (4096,))
        works = False
        if piece is not None:
            try:
                piece.view[:] = np.arange(4096) % 251
                moved = jax.device_put(piece.array, jax.sharding.SingleDeviceSharding(device))
                moved.block_until_ready()
                piece.view[:] = 7
                works = bool(np.array_equal(np.asarray(moved), np.arange(4096) % 251))
            except Exception:
                works = False
        _CHECKED[device] = works
        return works


class PinnedPieces:
    """Buffers handed round by (device, dtype, shape); at most ``limit`` held, a free one of another kind let go to
    make room. Thread-safe; each buffer is used by one thread at a time."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._free: dict[_Kind, list[PinnedPiece]] = {}
        self._held = 0
        self._lock = threading.Lock()

    def take(self, device: Any, dtype: np.dtype, shape: tuple[int, ...]) -> PinnedPiece | None:
        """A buffer for a piece of ``dtype`` and ``shape`` bound for ``device``, or ``None`` (then copy instead)."""
        if not writes_reach_the_device(device):
            return None
        kind = (device, dtype, shape)
        with self._lock:
            if self._free.get(kind):
                return self._free[kind].pop()
            if self._held >= self.limit:
                other = next((key for key, free in self._free.items() if free), None)
                if other is None:
                    return None
                self._free[other].pop()
                self._held -= 1
            self._held += 1
        piece = _made(device, dtype, shape)
        if piece is None:
            with self._lock:
                self._held -= 1
        return piece

    def give(self, piece: PinnedPiece) -> None:
        """Hand ``piece`` back once the transfer from it is done."""
        kind = (piece.array.sharding.device_set.pop(), piece.view.dtype, piece.view.shape)
        with self._lock:
            self._free.setdefault(kind, []).append(piece)

    def drop(self) -> None:
        """Let every free buffer go."""
        with self._lock:
            self._held -= sum(len(free) for free in self._free.values())
            self._free.clear()
