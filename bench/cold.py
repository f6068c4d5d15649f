"""Cold-cache reads: dropping the page cache, and the parallel-read limit of the disk under a file.

Dropping the page cache (``sync; echo 3 > /proc/sys/vm/drop_caches``) needs root and affects the whole machine;
:func:`cannot_drop` says why it cannot be done here, if it cannot. The parallel-read limit is what several threads
reading disjoint ranges of a file with ``preadv`` reach on a cold cache, with the page cache (``buffered``) or
without it (``O_DIRECT``).
"""

from __future__ import annotations

import mmap
import os
import time
from concurrent.futures import ThreadPoolExecutor

__all__ = ["cannot_drop", "drop_caches", "parallel_read"]

_CONTROL = "/proc/sys/vm/drop_caches"
_PAGE = 4096


def cannot_drop() -> str | None:
    """Why the page cache cannot be dropped here (``None``: it can)."""
    if os.geteuid() != 0:
        return "dropping the page cache needs root"
    try:
        drop_caches()
    except OSError as error:
        return f"{_CONTROL} refused: {error}"
    return None


def drop_caches() -> None:
    """Write every dirty page back and drop the page cache, dentries and inodes of the whole machine."""
    os.sync()
    with open(_CONTROL, "w") as control:
        control.write("3")


def parallel_read(path: str, threads: int, piece: int, *, direct: bool = False, fresh: bool = False) -> float:
    """Seconds to read the whole file with ``threads`` threads, each ``preadv`` reading ``piece`` bytes at a time
    into a page-aligned buffer (``direct``: with ``O_DIRECT``, bypassing the page cache).

    The buffer's pages are touched before the clock starts, unless ``fresh``: then the reads land in memory never
    touched, as a restore's new arrays do, and the first touch of every page is timed with them.
    """
    size = os.path.getsize(path)
    descriptor = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    started = time.perf_counter()
    buffer = mmap.mmap(-1, size + piece)
    view = memoryview(buffer)
    if not fresh:
        view[::_PAGE] = b"\1" * len(range(0, len(view), _PAGE))  # touched before the clock

    def read(start: int) -> None:
        length = min(piece, size - start)
        if direct:
            length = -(-length // _PAGE) * _PAGE
        os.preadv(descriptor, [view[start : start + length]], start)

    try:
        if not fresh:
            started = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            for _ in pool.map(read, range(0, size, piece)):
                pass
        return time.perf_counter() - started
    finally:
        view.release()
        buffer.close()
        os.close(descriptor)
