"""Read once, broadcast: a box that several processes need is read from storage by one of them and sent to the others.

While a multi-process restore runs inside :func:`broadcasting`, each sharded leaf's boxes are looked at across every
process of the run (the placement says which devices, so which processes, need each box). A box that several
processes need, and that is large enough to pay for sending, is cut into as many ranges as it has holders (as a save
cuts a replicated shard); each range is read by one of them (in turns, so that reads and sends spread evenly over the
processes) and sent to the others over a :class:`~jaxstow._storage.peers.PeerTransport`, whose every wait ends within
its timeout and whose messages are authenticated. A process whose range does not come (a dead or stalled reader, a
broken connection) reads it itself, so a broadcast never fails a restore that reading would not.
Storage then serves the replicated part of a model once, not once per replica. See docs/scaling.md.

>>> from jaxstow._read.broadcast import readers
>>> for box, parts in readers({((0, 6),): [0, 1, 2], ((6, 9),): [3]}, min_bytes=0, itemsize=4).items():
...     print(box, [(part, reader) for part, _, reader in parts])
((0, 6),) [(((0, 2),), 0), (((2, 4),), 1), (((4, 6),), 2)]
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

from jaxstow._format.checksum import as_bytes
from jaxstow._format.leaves import share_box
from jaxstow._format.shards import Box
from jaxstow._storage.peers import PeerTransport, Pending
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


def exchange(
    transport: PeerTransport,
    tag: str,
    placement: jax.sharding.Sharding,
    shape: tuple[int, ...],
    dtype: np.dtype,
    read: Callable[[Box], np.ndarray],
) -> dict[Box, np.ndarray]:
    """The boxes this process needs that others need too, each assembled from its ranges: those this process reads,
    read and sent to the box's other holders, the others received (read here if they do not come). ``tag`` names the
    leaf, the same in every process."""
    holders: dict[Box, set[int]] = {}
    for device, index in placement.devices_indices_map(shape).items():
        holders.setdefault(_box(index, shape), set()).add(int(device.process_index))  # type: ignore[attr-defined]
    me = transport.index
    turn = zlib.crc32(tag.encode())  # leaves take turns too, so that a process reads as much as another
    needs = {box: sorted(processes) for box, processes in holders.items() if me in processes}
    plan = readers(needs, min_bytes=MIN_BYTES, itemsize=dtype.itemsize, turn=turn)
    got = {box: np.empty([stop - start for start, stop in box], dtype) for box in plan}
    expected = {  # registered before anything is sent, so that no process waits on another's receive
        (reader, part): transport.expect(reader, f"{tag}@{part}", limit=_size(part) * dtype.itemsize)
        for parts in plan.values()
        for part, _, reader in parts
        if reader != me
    }
    for box, parts in plan.items():  # every range read here first, so that no other process waits on this one
        for part, within, reader in parts:
            if reader == me:
                data = np.ascontiguousarray(read(part))
                got[box][within or ...] = data
                for other in needs[box]:
                    if other != me:
                        with contextlib.suppress(JaxstowError):  # that process reads the range itself
                            transport.send(other, f"{tag}@{part}", as_bytes(data))
    for box, parts in plan.items():
        for part, within, reader in parts:
            if reader != me:
                got[box][within or ...] = _received(expected[(reader, part)], f"{tag}@{part}", part, dtype, read)
    return got


def _size(box: Box) -> int:
    return math.prod(stop - start for start, stop in box)


def _received(pending: Pending, tag: str, box: Box, dtype: np.dtype, read: Callable[[Box], np.ndarray]) -> np.ndarray:
    """The box as its reader sent it, or as read here when it does not come whole within the transport's timeout."""
    shape = tuple(stop - start for start, stop in box)
    reader = pending.source
    try:
        data = pending.wait()
        if not isinstance(data, bytearray) or len(data) != math.prod(shape) * dtype.itemsize:
            raise ValueError(f"{data if isinstance(data, int) else len(data)} bytes came for {dtype}{list(shape)}")
    except (JaxstowError, ValueError) as error:
        logger.warning("reading %s from storage: it did not come from process %d (%s)", tag, reader, error)
        return read(box)
    return np.frombuffer(data, dtype).reshape(shape)


def _box(index: tuple[slice, ...], shape: tuple[int, ...]) -> Box:
    return tuple((axis.indices(size)[0], axis.indices(size)[1]) for axis, size in zip(index, shape, strict=True))
