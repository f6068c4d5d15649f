"""Restoring arrays to accelerators through a small pool of host buffers, each piece's transfer overlapping the next read.

A reader thread reads each leaf of a native file, in flat pieces of at most ``_PIECE_BYTES``, into one of
``_BUFFERS`` reusable host buffers and checksums it on the way; the caller's thread hands each piece to the device
(through page-locked ``pinned_host`` memory where the device offers it, off CPU) and gives its buffer back once the
transfer is done. Host memory is the pool, whatever the model's size; a leaf of several pieces is joined on the device.
A failed read or transfer stops the reader, drops the buffers and raises a JaxstowError naming the leaf.

>>> import io, jax, jax.numpy as jnp, jaxstow
>>> buffer = io.BytesIO()
>>> jaxstow.save(buffer, {"w": jnp.arange(6.0).reshape(2, 3)}); _ = buffer.seek(0)
>>> jaxstow.load(buffer, pipeline=True)["w"]
Array([[0., 1., 2.],
       [3., 4., 5.]], dtype=float32)
"""

from __future__ import annotations

import queue
import threading
import traceback
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import xxhash

from jaxstow._format.header import NativeReader
from jaxstow._format.shards import ShardedLeaf
from jaxstow._format.tensor_reads import aligned_empty
from jaxstow._read.opened import OpenedFile
from jaxstow._util.pinned import pinned_sharding
from jaxstow.errors import DeviceTransferError, JaxstowError, StorageError

__all__ = ["pipelined_paths", "restore_pipelined"]

#: The size of each host buffer, and so of each piece read and transferred.
_PIECE_BYTES = 64 << 20
#: Host buffers in the pool: one being read, one being transferred, one spare.
_BUFFERS = 3


def pipelined_paths(opened: OpenedFile, paths: Sequence[str]) -> list[str]:
    """Those of ``paths`` the pipeline restores: whole, unsharded arrays of a native file read from its source."""
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
        and leaf.nbytes > 0
    ]


class _Piece:
    """A piece read into a pool buffer: its leaf, its bytes, whether it is its leaf's last."""

    def __init__(self, path: str, buffer: np.ndarray, nbytes: int, last: bool) -> None:
        self.path, self.buffer, self.nbytes, self.last = path, buffer, nbytes, last


def restore_pipelined(opened: OpenedFile, leaves: Sequence[tuple[str, Any]]) -> dict[str, jax.Array]:
    """The arrays at ``leaves``' paths (from :func:`pipelined_paths`), each on its placement (``None``: the default)."""
    if not leaves:
        return {}
    container = opened.container
    assert isinstance(container, NativeReader)
    leaves = sorted(leaves, key=lambda leaf: container.slots[leaf[0]].offset)  # the file read front to back
    free: queue.Queue[np.ndarray] = queue.Queue()
    for _ in range(_BUFFERS):
        free.put(aligned_empty(_PIECE_BYTES))
    ready: queue.Queue[_Piece | BaseException | None] = queue.Queue()
    stop = threading.Event()
    reader = threading.Thread(
        target=_read,
        args=(opened, container, [path for path, _ in leaves], free, ready, stop),
        name="jaxstow-pipeline-reader",
        daemon=True,
    )
    reader.start()
    out: dict[str, jax.Array] = {}
    parts: list[jax.Array] = []
    path = ""
    try:
        for path, placement in leaves:
            leaf = opened.stored[path]
            while True:
                piece = ready.get()
                if isinstance(piece, BaseException):
                    raise piece
                assert piece is not None and piece.path == path
                whole = piece.last and not parts
                shape = leaf.shape if whole else (-1,)
                data = piece.buffer[: piece.nbytes].view(leaf.dtype).reshape(shape)
                opened.check_narrowing([(path, data)])
                parts.append(_transfer(data, placement if whole else None))
                free.put(piece.buffer)
                del data
                if piece.last:
                    break
            array = parts[0] if len(parts) == 1 else jnp.concatenate(parts).reshape(leaf.shape)
            if len(parts) > 1 and placement is not None:
                array = jax.device_put(array, placement)
            out[path], parts = array, []
    except JaxstowError:
        out.clear()
        raise
    except Exception as error:
        out.clear()
        traceback.clear_frames(error.__traceback__)  # their locals hold pool buffers
        raise DeviceTransferError(
            f"{opened.file}: moving leaf {path!r} to its device failed: {error}", file=opened.file, path=path
        ) from error
    finally:
        stop.set()
        while reader.is_alive():  # a reader waiting for a buffer gets one, sees stop and ends
            free.put(np.empty(0, np.uint8))
            reader.join(0.01)
        # The buffers go now, not with the traceback, which holds this frame.
        free.queue.clear()
        ready.queue.clear()
        parts.clear()
        piece = None
    return out


def _transfer(data: np.ndarray, placement: Any) -> jax.Array:
    """``data`` copied onto ``placement`` (the default device for ``None``), the copy done when this returns."""
    device = next(iter(placement.device_set)) if isinstance(placement, jax.sharding.Sharding) else placement
    device = device or jax.devices()[0]
    pinned = pinned_sharding(device)
    if pinned is not None:
        staged = jax.device_put(data, pinned)
        target = (
            placement if isinstance(placement, jax.sharding.Sharding) else jax.sharding.SingleDeviceSharding(device)
        )
        array: jax.Array = jax.device_put(staged, target)
    else:  # a CPU device may alias host memory (even with may_alias=False): it gets a copy of its own
        array = jax.device_put(data.copy() if device.platform == "cpu" else data, placement)
    array.block_until_ready()
    return array


def _read(
    opened: OpenedFile,
    container: NativeReader,
    paths: list[str],
    free: queue.Queue[np.ndarray],
    ready: queue.Queue[_Piece | BaseException | None],
    stop: threading.Event,
) -> None:
    """Read every leaf of ``paths`` into pool buffers, piece by piece, verified; an error ends the reading."""
    path = ""
    buffer: np.ndarray | None = None
    try:
        for path in paths:
            leaf, slot = opened.stored[path], container.slots[path]
            hasher = xxhash.xxh3_64()
            for start, stop_at in _pieces(slot.nbytes):
                buffer = free.get()
                if stop.is_set():
                    return
                container.source.read_into(slot.offset + start, buffer[: stop_at - start].data)
                opened.on_read(stop_at - start)
                hasher.update(buffer[: stop_at - start].data)
                last = stop_at == slot.nbytes
                if last:
                    opened.verify(path, hasher.hexdigest(), leaf.checksum)
                ready.put(_Piece(path, buffer, stop_at - start, last))
                buffer = None
    except Exception as error:
        buffer = None  # the error's traceback holds this frame: the buffer goes with the pool
        traceback.clear_frames(error.__traceback__)
        if isinstance(error, JaxstowError):
            ready.put(_naming(error, path))
        else:
            ready.put(StorageError(f"reading leaf {path!r} failed: {error}", file=opened.file or ""))


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
