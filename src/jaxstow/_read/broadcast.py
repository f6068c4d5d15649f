"""Read once, broadcast: a box that several processes need is read from storage by one of them and sent to the others.

While a multi-process restore runs inside :func:`broadcasting`, each sharded leaf's boxes are looked at across every
process of the run (the placement says which devices, so which processes, need each box). A box that several
processes need, and that is large enough to pay for sending, is read by one of them (taken in turn, so that the reads
spread over the processes) and sent to the others over a :class:`~jaxstow._storage.peers.PeerTransport`, whose every
wait ends within its timeout and whose messages are checksummed. A process whose box does not come (a dead or
stalled reader, a broken connection) reads it itself, so a broadcast never fails a restore that reading would not.
Storage then serves the replicated part of a model once, not once per replica. See docs/scaling.md.

>>> from jaxstow._read.broadcast import readers
>>> readers({((0, 4),): [0, 1, 2], ((4, 8),): [1, 2], ((8, 9),): [3]}, min_bytes=0, itemsize=4)
{((0, 4),): 0, ((4, 8),): 2}
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import zlib
from collections.abc import Callable, Iterator

import jax
import numpy as np

from jaxstow._format.shards import Box
from jaxstow._storage.peers import PeerTransport
from jaxstow.errors import JaxstowError

__all__ = ["MIN_BYTES", "active", "broadcasting", "exchange", "readers"]

logger = logging.getLogger("jaxstow.checkpoint.manager")

#: Boxes smaller than this are read by every process that needs them: a read costs little more than a message.
MIN_BYTES = 64 << 10

_lock = threading.Lock()
_current: list[PeerTransport] = []


@contextlib.contextmanager
def broadcasting(transport: PeerTransport) -> Iterator[None]:
    """Restores on any thread of this process share boxes over ``transport`` until the block ends."""
    with _lock:
        _current.append(transport)
    try:
        yield
    finally:
        with _lock:
            _current.remove(transport)


def active() -> PeerTransport | None:
    """The transport of the restore running, or ``None`` (then every process reads what it needs)."""
    return _current[-1] if _current else None


def readers(holders: dict[Box, list[int]], *, min_bytes: int, itemsize: int, turn: int = 0) -> dict[Box, int]:
    """The process that reads each box several processes need (of at least ``min_bytes``), taking turns among them
    from ``turn`` on."""
    chosen: dict[Box, int] = {}
    for step, (box, processes) in enumerate(sorted(holders.items()), start=turn):
        if len(processes) > 1 and math.prod(stop - start for start, stop in box) * itemsize >= min_bytes:
            chosen[box] = processes[step % len(processes)]
    return chosen


def exchange(
    transport: PeerTransport,
    tag: str,
    placement: jax.sharding.Sharding,
    shape: tuple[int, ...],
    dtype: np.dtype,
    read: Callable[[Box], np.ndarray],
) -> dict[Box, np.ndarray]:
    """The boxes this process needs that others need too: read and sent where it is their reader, received otherwise
    (read here if they do not come). ``tag`` names the leaf, the same in every process."""
    holders: dict[Box, set[int]] = {}
    for device, index in placement.devices_indices_map(shape).items():
        holders.setdefault(_box(index, shape), set()).add(int(device.process_index))  # type: ignore[attr-defined]
    turn = zlib.crc32(tag.encode())  # leaves take turns too, so that a process reads as much as another
    needs = {box: sorted(processes) for box, processes in holders.items()}
    chosen = readers(needs, min_bytes=MIN_BYTES, itemsize=dtype.itemsize, turn=turn)
    me = transport.process_index
    got: dict[Box, np.ndarray] = {}
    for box, reader in chosen.items():  # every box read here first, so that no other process waits on this one
        if reader == me:
            got[box] = read(box)
            for other in sorted(holders[box] - {me}):
                with contextlib.suppress(JaxstowError):  # that process reads the box itself
                    transport.send(other, f"{tag}@{box}", np.ascontiguousarray(got[box]))
    for box, reader in chosen.items():
        if reader != me and me in holders[box]:
            got[box] = _received(transport, reader, f"{tag}@{box}", box, dtype, read)
    return got


def _received(
    transport: PeerTransport, reader: int, tag: str, box: Box, dtype: np.dtype, read: Callable[[Box], np.ndarray]
) -> np.ndarray:
    """The box as ``reader`` sent it, or as read here when it does not come whole within the transport's timeout."""
    shape = tuple(stop - start for start, stop in box)
    try:
        data = transport.receive(reader, tag)
        if len(data) != math.prod(shape) * dtype.itemsize:
            raise ValueError(f"{len(data)} bytes came for {dtype}{list(shape)}")
    except (JaxstowError, ValueError) as error:
        logger.warning("reading %s from storage: it did not come from process %d (%s)", tag, reader, error)
        return read(box)
    return np.frombuffer(data, dtype).reshape(shape)


def _box(index: tuple[slice, ...], shape: tuple[int, ...]) -> Box:
    return tuple((axis.indices(size)[0], axis.indices(size)[1]) for axis, size in zip(index, shape, strict=True))
