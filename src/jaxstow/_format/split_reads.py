"""A tensor read in two parts at once, this thread's and the partner thread's, cut where both should end together.

The partner (:mod:`~jaxstow._util.partner`) begins some tens of microseconds after this thread, and on a virtual
machine it can run slower than this thread for a whole process. A cut fixed at the half then left this thread
waiting for the partner, and waking once it was done: measured here, a 4 MiB leaf from the page cache in 0.28-0.34 ms
in one process in four, against 0.22 ms in the others. So each :class:`Balance` moves its cut after every read,
by the times both threads took, toward where the partner ends just before this thread (which then never sleeps).

>>> import io, numpy as np
>>> from xxhash import xxh3_64_hexdigest
>>> from jaxstow._format.split_reads import Balance, hashed_blocks, read_blocks_split
>>> from jaxstow._storage.opening import open_source
>>> data = np.random.default_rng(0).integers(0, 256, 3 << 20, dtype=np.uint8)
>>> into = np.empty_like(data)
>>> read_blocks_split(open_source(io.BytesIO(data.tobytes())), 0, into.data, Balance(0.5)) == hashed_blocks(data.data)
True
>>> bool((into == data).all())
True
"""

from __future__ import annotations

import time
from collections.abc import Callable

from xxhash import xxh3_64, xxh3_64_hexdigest

from jaxstow._format.block_checksums import BLOCK_BYTES
from jaxstow._format.source import ReadSource
from jaxstow._util.partner import two_at_once

__all__ = ["BLOCKS", "WHOLE", "Balance", "hashed_blocks", "read_and_hash_split", "read_blocks_split", "read_pieces"]

ReadInto = Callable[[int, memoryview], None]
#: Where a cut falls: on a page, so that each thread copies whole pages; within :data:`_SNAP` of a block's edge, on it.
_CUT_ALIGNMENT = 4096
_SNAP = BLOCK_BYTES // 8


class Balance:
    """The share of a tensor's bytes the partner reads, moved after each read toward where the partner's part ends a
    little (:attr:`LEAD`) before this thread's.

    Each read moves the share by the square root of the ratio of the times (a single slow read moves it little), kept
    between :attr:`LEAST` and :attr:`MOST`. Reads on several threads at once update it without a lock: each update is
    a whole assignment, and any one of them is a fair share.
    """

    LEAST, MOST, LEAD = 0.15, 0.85, 0.95

    def __init__(self, share: float) -> None:
        self.share = share

    def cut(self, nbytes: int) -> int:
        """Where this thread's part of ``nbytes`` ends and the partner's begins: both hold a page at least, and a cut
        near a block's edge moves onto it (a cut inside a block costs a read more)."""
        cut = round(nbytes * (1 - self.share))
        edge = round(cut / BLOCK_BYTES) * BLOCK_BYTES
        cut = edge if abs(cut - edge) <= _SNAP and 0 < edge < nbytes else cut // _CUT_ALIGNMENT * _CUT_ALIGNMENT
        return min(max(cut, _CUT_ALIGNMENT), nbytes - _CUT_ALIGNMENT)

    def learn(self, mine: float, theirs: float) -> None:
        """Take the seconds this thread's part and the partner's took from the same start (the partner's to its end,
        or to where this thread ended it, having taken it back)."""
        if mine > 0 and theirs > 0:
            moved = self.share * (self.LEAD * mine / theirs) ** 0.5
            self.share = min(max(moved, self.LEAST), self.MOST)


#: The balance of tensors read with the checksums of their blocks (each thread hashes its own blocks), and of those
#: read with the checksum of all their bytes alone (this thread hashes all of them, the partner only reads).
BLOCKS, WHOLE = Balance(0.5), Balance(0.6)


def _timed(start: float, part: Callable[[], str], ended: list[float]) -> Callable[[], str]:
    def run() -> str:
        found = part()
        ended.append(time.perf_counter() - start)
        return found

    return run


def _split(balance: Balance, mine: Callable[[], str], theirs: Callable[[], str]) -> tuple[str, str]:
    """``mine()`` on this thread and ``theirs()`` on the partner at once; ``balance`` learns the times they took."""
    mine_ended: list[float] = []
    theirs_ended: list[float] = []
    start = time.perf_counter()
    first, last = two_at_once(_timed(start, mine, mine_ended), _timed(start, theirs, theirs_ended))
    balance.learn(mine_ended[0], theirs_ended[0])
    return first, last


def read_blocks_split(source: ReadSource, offset: int, data: memoryview, balance: Balance = BLOCKS) -> str:
    """The checksums of the blocks of the bytes at ``offset`` read into ``data``, in two parts at once.

    This thread reads and hashes the blocks before the cut, then reads the block the cut falls in up to the cut; the
    partner reads the rest of that block, then reads and hashes the blocks after it; this thread hashes the rest of
    the block cut in two last, read by then.
    """
    cut = balance.cut(len(data))
    whole = cut // BLOCK_BYTES * BLOCK_BYTES  # the blocks before the cut end here
    end = min(whole + BLOCK_BYTES, len(data))  # the block cut in two ends here
    digest = xxh3_64()
    with source.reading() as read_into:

        def mine() -> str:
            found = _read_blocks(read_into, offset, data[:whole])
            read_pieces(read_into, offset + whole, data[whole:cut], digest)
            return found

        def theirs() -> str:
            read_into(offset + cut, data[cut:end])
            return _read_blocks(read_into, offset + end, data[end:])

        first, last = _split(balance, mine, theirs)
    digest.update(data[cut:end])
    return first + digest.hexdigest() + last


def read_and_hash_split(source: ReadSource, offset: int, data: memoryview, balance: Balance = WHOLE) -> str:
    """The xxh3 of the bytes at ``offset`` read into ``data`` in two parts at once: this thread reads and hashes the
    first, the partner reads the second, which this thread then hashes."""
    cut = balance.cut(len(data))
    digest = xxh3_64()
    with source.reading() as read_into:

        def mine() -> str:
            read_pieces(read_into, offset, data[:cut], digest)
            return ""

        def theirs() -> str:
            read_into(offset + cut, data[cut:])
            return ""

        _split(balance, mine, theirs)
    digest.update(data[cut:])
    return digest.hexdigest()


def read_pieces(read_into: ReadInto, offset: int, data: memoryview, digest: xxh3_64) -> None:
    """Read ``data`` from ``offset`` block by block, each block hashed into ``digest`` as soon as it is read, while it
    is still in the core's cache. Measured here, a 4 MiB leaf from the page cache on one thread in 0.221-0.226 ms, in
    reads of 512 KiB 0.229-0.234 ms, of 256 KiB 0.241-0.246 ms: a read costs more than it saves."""
    for start in range(0, len(data), BLOCK_BYTES):
        piece = data[start : start + BLOCK_BYTES]
        read_into(offset + start, piece)
        digest.update(piece)


def _read_blocks(read_into: ReadInto, offset: int, data: memoryview) -> str:
    """Read ``data`` from ``offset``, block by block, each hashed once read; its blocks' checksums."""
    found = []
    for start in range(0, len(data), BLOCK_BYTES):
        piece = data[start : start + BLOCK_BYTES]
        read_into(offset + start, piece)
        found.append(xxh3_64_hexdigest(piece))
    return "".join(found)


def hashed_blocks(data: memoryview) -> str:
    """The checksums of the blocks of ``data``, read already."""
    return "".join(xxh3_64_hexdigest(data[start : start + BLOCK_BYTES]) for start in range(0, len(data), BLOCK_BYTES))
