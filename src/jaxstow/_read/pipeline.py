"""Restoring arrays to accelerators through a pool of host buffers, many leaves read and transferred at once.

Up to ``_READERS`` threads (one for a source that serves one read at a time) each take a leaf of a native file, read
it in pieces of at most ``_PIECE_BYTES`` into a host buffer of the pool, checksum it on the way and hand each piece
to the device, giving the buffer back once the transfer is done: one thread's transfer overlaps the others' reads, and
host memory is the pool (at most one buffer a thread), whatever the model's size. Where the device has page-locked
``pinned_host`` memory, a piece bound for one device is read straight into such a buffer of its dtype and shape
(``pinned_pieces.py``), which goes to the device with no copy on the host (on an H200, 4 GiB from the page cache in
0.19-0.24 s, against 0.28-0.42 s through a copy); other pieces are staged through a copy there. A leaf of several pieces is joined on its device, one such leaf at a
time, so that the device holds at most one leaf twice. Leaves under ``_PIECE_BYTES // 64``, 64-bit leaves that jax
with x64 off narrows (checked whole) and leaves of a dtype this jax lacks are left to the caller, which reads them at
once. A failed read or transfer
stops the readers, drops the buffers and raises a JaxstowError naming the leaf.

>>> import io, jax, jax.numpy as jnp, jaxstow
>>> buffer = io.BytesIO()
>>> jaxstow.save(buffer, {"w": jnp.arange(6.0).reshape(2, 3)}); _ = buffer.seek(0)
>>> jaxstow.load(buffer, pipeline=True)["w"]
Array([[0., 1., 2.],
       [3., 4., 5.]], dtype=float32)
"""

from __future__ import annotations

import contextlib
import threading
import traceback
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import xxhash

from jaxstow._format.header import NativeReader
from jaxstow._format.shards import ShardedLeaf
from jaxstow._format.stored_values import values_checked
from jaxstow._format.tensor_reads import LOCAL_DISK, aligned_empty
from jaxstow._read.narrowing import NARROWED, held_problem
from jaxstow._read.opened import OpenedFile
from jaxstow._read.pinned_pieces import PinnedPieces, sub_byte
from jaxstow._util.pinned import pinned_sharding
from jaxstow._util.pools import SharedPool
from jaxstow.errors import DeviceTransferError, JaxstowError, StorageError

__all__ = ["pipelined_paths", "restore_pipelined"]

#: The size of each host buffer, and so of each piece read and transferred.
_PIECE_BYTES = 64 << 20
#: Bytes read from a local disk and hashed at a time: hashed while they are in the processor's cache, not read
#: again from memory (4 x 64 MiB from the page cache, read and hashed on a 2-core VM: 48 ms against 57 ms whole).
_HASHED_BYTES = 1 << 20
#: Leaves read and transferred at once. On an H200 with 16 cores, 4 GiB of 64 MiB leaves from the page cache: 16
#: threads read and hash them in 0.15 s, 8 in 0.24 s, 4 in 0.38 s.
_READERS = 16
#: The reader threads, kept for the process and shared by every restore.
_READER_THREADS = SharedPool("pipeline-reader", _READERS)


def pipelined_paths(opened: OpenedFile, paths: Sequence[str]) -> list[str]:
    """Those of ``paths`` the pipeline restores: whole, unsharded arrays of a native file read from its source, of
    ``_PIECE_BYTES // 64`` bytes or more (smaller ones cost more to transfer one by one than in a batch), and not
    64-bit ones that jax with x64 off narrows (their values are checked whole, once verified, by the batch path), nor
    ones of elements narrower than a byte that take several pieces (XLA on CPU fails to join 2-bit ones)."""
    if (
        not paths
        or opened.memory_mapped
        or len(opened.containers) != 1
        or not isinstance(opened.container, NativeReader)
    ):
        return []
    return [
        path
        for path in paths
        if (leaf := opened.stored.get(path)) is not None
        and leaf.kind == "array"
        and not isinstance(leaf, ShardedLeaf)
        and leaf.nbytes >= max(1, _PIECE_BYTES // 64)
        and (leaf.dtype not in NARROWED or jax.dtypes.canonicalize_dtype(leaf.dtype) == leaf.dtype)
        and held_problem(leaf.dtype) is None  # left to the caller, which refuses it naming the leaf
        and (leaf.nbytes <= _PIECE_BYTES or not sub_byte(leaf.dtype))  # XLA cannot join pieces of 2-bit elements
    ]


class _Pool:
    """Host buffers of ``nbytes``, made as threads first ask and then handed round; :meth:`drop` lets them go."""

    def __init__(self, nbytes: int, readers: int) -> None:
        self.nbytes = nbytes
        self.pinned = PinnedPieces(limit=2 * readers)  # two kinds of piece in turn need not make buffers anew
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()

    def take(self) -> np.ndarray:
        with self._lock:
            if self._free:
                return self._free.pop()
        return aligned_empty(self.nbytes)  # at most one a reader: each gives its buffer back before taking another

    def give(self, buffer: np.ndarray) -> None:
        with self._lock:
            self._free.append(buffer)

    def drop(self) -> None:
        self.pinned.drop()
        with self._lock:
            self._free.clear()


def restore_pipelined(opened: OpenedFile, leaves: Sequence[tuple[str, Any]]) -> dict[str, jax.Array]:
    """The arrays at ``leaves``' paths (from :func:`pipelined_paths`), each on its placement (``None``: the default)."""
    if not leaves:
        return {}
    container = opened.container
    assert isinstance(container, NativeReader)
    leaves = sorted(leaves, key=lambda leaf: container.slots[leaf[0]].offset)  # the file read front to back
    readers = _READERS if container.source.parallel is not None else 1  # a source that serves one read at a time
    pool = _Pool(min(_PIECE_BYTES, max(opened.stored[path].nbytes for path, _ in leaves)), readers)
    stop = threading.Event()
    # A leaf of one piece is a job of its own; the leaves of several are one job, so that one is joined at a time.
    several = [leaf for leaf in leaves if opened.stored[leaf[0]].nbytes > _PIECE_BYTES]
    jobs = [[leaf] for leaf in leaves if opened.stored[leaf[0]].nbytes <= _PIECE_BYTES] + ([several] if several else [])

    def restore_leaves(job: list[tuple[str, Any]]) -> dict[str, jax.Array]:
        out = {}
        try:
            for path, placement in job:
                if stop.is_set():
                    raise _Stopped
                try:
                    out[path] = _restore_leaf(opened, container, path, placement, pool, stop)
                except JaxstowError as error:
                    raise _naming(error, path) from None
        except BaseException:
            stop.set()  # the other readers stop at their next piece
            raise
        return out

    futures: list[Future[dict[str, jax.Array]]] = []
    try:
        futures += _READER_THREADS.run_each(restore_leaves, jobs, at_once=readers)
        if any(future.exception() for future in futures):
            raise _first_failure(futures, container)
        return {path: array for future in futures for path, array in future.result().items()}
    finally:
        pool.drop()  # the buffers go now, not with an error's traceback
        futures.clear()


class _Stopped(Exception):
    """A reader told to stop once another leaf failed."""


def _first_failure(futures: list[Future[dict[str, jax.Array]]], container: NativeReader) -> BaseException:
    """The failure of the leaf first in the file among those that failed, its frames (which hold pool buffers)
    cleared."""
    failures = [
        error for future in futures if (error := future.exception()) is not None and not isinstance(error, _Stopped)
    ]
    for error in failures:
        traceback.clear_frames(error.__traceback__)

    def where(error: BaseException) -> float:
        path = error.path if isinstance(error, JaxstowError) else None
        return container.slots[path].offset if path is not None and path in container.slots else float("inf")

    return min(failures, key=where)


def _restore_leaf(
    opened: OpenedFile, container: NativeReader, path: str, placement: Any, pool: _Pool, stop: threading.Event
) -> jax.Array:
    """The leaf at ``path`` read piece by piece into a pool buffer, verified, on ``placement``."""
    leaf, slot = opened.stored[path], container.slots[path]
    hasher = xxhash.xxh3_64()
    parts: list[jax.Array] = []
    buffer: np.ndarray | None = None
    try:
        for start, stop_at in _pieces(slot.nbytes):
            if stop.is_set():
                raise _Stopped
            whole = start == 0 and stop_at == slot.nbytes
            shape = leaf.shape if whole else ((stop_at - start) // leaf.dtype.itemsize,)
            target = _target(placement if whole else None)
            device = _direct(target)
            staged = pool.pinned.take(device, leaf.dtype, shape) if device is not None else None
            if staged is None and buffer is None:
                buffer = pool.take()
            piece = staged.bytes if staged is not None else buffer[: stop_at - start]  # type: ignore[index]
            try:
                _read_piece(opened, container, path, slot.offset + start, piece, hasher)
                if stop_at == slot.nbytes:
                    opened.verify(path, hasher.hexdigest(), leaf.checksum)
                data = staged.view if staged is not None else piece.view(leaf.dtype).reshape(shape)
                values_checked(data, file=opened.file, path=path)
                with _moving(opened, path):
                    parts.append(_transfer(staged.array if staged is not None else data, target))
                del data
            finally:
                if staged is not None:
                    pool.pinned.give(staged)
    finally:
        if buffer is not None:
            pool.give(buffer)
    if len(parts) == 1:
        return parts[0]
    with _moving(opened, path):  # joined on the device, which may lack the memory
        array = jnp.concatenate(parts).reshape(leaf.shape)
        parts.clear()
        return jax.device_put(array, placement) if placement is not None else array


@contextlib.contextmanager
def _moving(opened: OpenedFile, path: str) -> Iterator[None]:
    """A failure of the device (out of memory, a lost device) as a DeviceTransferError naming the leaf ``path``."""
    try:
        yield
    except JaxstowError:
        raise
    except Exception as error:
        raise DeviceTransferError(
            f"{opened.file}: moving leaf {path!r} to its device failed: {error}", file=opened.file, path=path
        ) from error


def _read_piece(
    opened: OpenedFile, container: NativeReader, path: str, offset: int, piece: np.ndarray, hasher: Any
) -> None:
    """Fill ``piece`` with the file's bytes at ``offset``, each part hashed (``hasher``) as it lands, while it is in
    the processor's cache: ``_HASHED_BYTES`` at a time from a local disk, all at once from other sources (where a read
    is a request); a failure is a StorageError naming the leaf ``path``."""
    step = _HASHED_BYTES if container.source.parallel is LOCAL_DISK else max(1, len(piece))
    try:
        with container.source.reading() as read:
            for start in range(0, len(piece), step):
                part = piece[start : start + step].data
                read(offset + start, part)
                hasher.update(part)
    except JaxstowError:
        raise
    except Exception as error:
        failure = StorageError(f"reading leaf {path!r} failed: {error}", file=opened.file or "")
        failure.path = path
        raise failure from error
    opened.on_read(len(piece))


def _target(placement: Any) -> jax.sharding.Sharding:
    """Where a piece bound for ``placement`` goes: a sharding (a device's own for a device, the first device's for
    ``None``)."""
    if isinstance(placement, jax.sharding.Sharding):
        return placement
    return jax.sharding.SingleDeviceSharding(placement or jax.devices()[0])


def _direct(target: jax.sharding.Sharding) -> Any:
    """The device a piece bound for ``target`` may be read for straight into page-locked memory (a
    :class:`~jaxstow._read.pinned_pieces.PinnedPiece`): one device's own memory, not host memory (where the buffer,
    handed round, would be the array restored)."""
    if len(target.device_set) != 1 or target.memory_kind in {"pinned_host", "unpinned_host"}:
        return None
    return next(iter(target.device_set))


def _transfer(data: np.ndarray | jax.Array, target: jax.sharding.Sharding) -> jax.Array:
    """``data`` copied onto ``target``, the copy done when this returns.

    A numpy array is staged through ``pinned_host`` memory where the device has it, unless that is where it goes (a
    copy put there may be the pool's buffer itself); a CPU device may alias host memory (even with
    ``may_alias=False``): such a one gets a copy of its own. A ``pinned_host`` array goes as it is.
    """
    device: jax.Device = next(iter(target.device_set))
    pinned = pinned_sharding(device)
    array: jax.Array
    if isinstance(data, jax.Array):
        array = jax.device_put(data, target)
    elif pinned is not None and target.memory_kind != pinned.memory_kind:
        array = jax.device_put(jax.device_put(data, pinned), target)
    else:
        own = data.copy() if device.platform == "cpu" or pinned is not None else data
        array = jax.device_put(own, target)
    array.block_until_ready()
    return array


def _naming(error: JaxstowError, path: str) -> JaxstowError:
    """``error`` naming the leaf ``path``, if it names none (a source's error knows bytes, not leaves)."""
    if error.path is None:
        error.path = path
        error.args = (f"{error} (reading leaf {path!r})", *error.args[1:])
    return error


def _pieces(nbytes: int) -> Iterator[tuple[int, int]]:
    """Byte ranges of at most ``_PIECE_BYTES`` covering ``nbytes``."""
    for start in range(0, nbytes, _PIECE_BYTES):
        yield start, min(start + _PIECE_BYTES, nbytes)
