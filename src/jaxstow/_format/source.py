"""What the format layer reads from: random-access bytes with a name and a size, and how to read them in parallel.

The storage layer provides the sources (local files, file objects, objects in a store); the containers, readers and
record checks of this layer only ever see this protocol. A source that serves several reads at once says how in its
:class:`Parallel`: pieces of at most ``piece`` bytes, ``readers`` at a time, on one pool of threads shared by every
source read the same way (so that several files read together still have ``readers`` reads in flight, not more).

>>> import io
>>> from jaxstow._format.source import Parallel, ReadSource
>>> from jaxstow._storage.opening import open_source
>>> isinstance(open_source(io.BytesIO(b"abc")), ReadSource)
True
>>> plan = Parallel(readers=4, piece=1 << 20, threshold=4 << 20)
>>> plan.pool() is plan.pool(), plan.pool()._max_workers
(True, 4)
"""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

from jaxstow._util.signal_free import ThreadPool

__all__ = ["Parallel", "ReadSource", "SourceFile", "in_pool"]

_threads = threading.local()


def in_pool() -> bool:
    """Whether this thread is one of a :class:`Parallel`'s pool (whose jobs must not wait for the pool)."""
    return getattr(_threads, "pooled", False)


def _mark_pooled() -> None:
    _threads.pooled = True


class Parallel:
    """How a source is read in parallel.

    ``readers`` reads at once of at most ``piece`` bytes each, for reads of at least ``threshold`` bytes (smaller ones
    run on the caller's thread, faster than a hand-over).
    """

    def __init__(self, *, readers: int, piece: int, threshold: int) -> None:
        self.readers = readers
        self.piece = piece
        self.threshold = threshold
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._pid = 0

    def pool(self) -> ThreadPoolExecutor:
        """The shared pool of ``readers`` threads, made on first use.

        Made again in a forked child, which has none of its parent's threads.
        """
        with self._lock:
            if self._pool is None or self._pid != os.getpid():
                self._pool = ThreadPool(self.readers, thread_name_prefix="jaxstow-read", initializer=_mark_pooled)
                self._pid = os.getpid()
            return self._pool

    def __repr__(self) -> str:
        return f"Parallel(readers={self.readers}, piece={self.piece}, threshold={self.threshold})"


@runtime_checkable
class ReadSource(Protocol):
    """Random-access bytes: a local file, a file object or an object in a store."""

    name: str
    size: int

    @property
    def parallel(self) -> Parallel | None:
        """How several threads read it at once; ``None``: one read at a time."""

    def read_into(self, offset: int, buffer: memoryview) -> None:
        """Fill ``buffer`` with the bytes at ``offset``; raise :class:`~jaxstow.errors.TruncatedFileError` if the source ends first."""

    def read_scatter(self, offset: int, buffers: Sequence[memoryview]) -> None:
        """Fill ``buffers``, one after another, with the bytes from ``offset`` on (one request where the source can)."""

    def reading(self) -> AbstractContextManager[Callable[[int, memoryview], None]]:
        """A function that reads as :meth:`read_into` does, for the reads of one block, from any thread: a source that
        checks what each read got (a local file, that it was not written since it was opened) checks once, when the
        block ends."""

    def read(self, offset: int, length: int) -> bytes:
        """The ``length`` bytes at ``offset``."""

    def close(self) -> None:
        """Release the source."""

    def describe_size(self) -> str:
        """The size in words, for error messages."""


class SourceFile(io.RawIOBase):
    """A read-only, seekable file object over a :class:`ReadSource` (for ``zipfile``, or as the body of a request)."""

    def __init__(self, source: ReadSource) -> None:
        self._source = source
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._source.size}[whence]
        self._position = max(0, base + offset)
        return self._position

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        count = max(0, min(len(view), self._source.size - self._position))
        if count:
            self._source.read_into(self._position, view[:count])
        self._position += count
        return count
