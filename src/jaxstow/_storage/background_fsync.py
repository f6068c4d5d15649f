"""Files of a folder fsynced and closed on a pool's threads while the next files are written.

Writing a file and then waiting for its fsync leaves the disk idle while the next file is written, and the writer
idle while the disk takes the last one: a step of many files took the sum of both. Here each file, once written and
flushed, is handed over: a thread of a pool shared by every save fsyncs it through the descriptor that wrote it (a
later descriptor may not see a write-back error) and closes it, while the caller writes the next. At most
``at_once`` files are in flight (the oldest is waited for before one more is handed over), so that few descriptors
are open; where the pool takes no more work (the interpreter is exiting), the caller fsyncs the file itself.
:meth:`Fsyncs.wait` returns once every file is closed, and raises the first failure, naming its file.

>>> import os, tempfile
>>> from jaxstow._storage.background_fsync import Fsyncs
>>> fsyncs, folder = Fsyncs(at_once=2), tempfile.mkdtemp()
>>> for name in "abc":
...     sink = open(os.path.join(folder, name), "wb")
...     _ = sink.write(b"data")
...     fsyncs.hand_over(sink, name)
>>> fsyncs.wait()
>>> sink.closed
True
"""

from __future__ import annotations

import collections
import os
from concurrent.futures import Future
from typing import BinaryIO

from jaxstow._util.pools import SharedPool

__all__ = ["FsyncFailed", "Fsyncs"]

_FSYNCS = SharedPool("fsync", 8)


class FsyncFailed(Exception):
    """A handed-over file's fsync or close failed: ``name`` says which, ``error`` (the cause too) why."""

    def __init__(self, name: str, error: BaseException) -> None:
        super().__init__(name, error)
        self.name, self.error = name, error


def _fsync_and_close(sink: BinaryIO) -> None:
    try:
        sink.flush()
        os.fsync(sink.fileno())
    finally:
        sink.close()


class Fsyncs:
    """Handed-over files, fsynced and closed in the background, ``at_once`` at most in flight."""

    def __init__(self, at_once: int = 8) -> None:
        self.at_once = at_once
        self._in_flight: collections.deque[tuple[Future[None], str]] = collections.deque()
        self._failure: FsyncFailed | None = None
        self._pid = os.getpid()

    def hand_over(self, sink: BinaryIO, name: str) -> None:
        """Fsync and close ``sink`` (written; its buffer flushed or not) in the background; ``name`` names it in a
        failure. Waits for the oldest file first where ``at_once`` are in flight."""
        while len(self._in_flight) >= self.at_once:
            self._settle_oldest()
        self._in_flight.append((_FSYNCS.submit(_fsync_and_close, sink), name))

    def wait(self) -> None:
        """Return once every file handed over is closed; raise :class:`FsyncFailed` for the first that failed."""
        while self._in_flight:
            self._settle_oldest()
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure from failure.error

    def _settle_oldest(self) -> None:
        """Wait for the oldest file in flight (which stays in flight should the wait be interrupted)."""
        future, name = self._in_flight[0]
        if os.getpid() != self._pid:  # a forked child: the thread fsyncing it is its parent's
            error: BaseException | None = RuntimeError("its fsync was left to the process this one was forked from")
        else:
            error = future.exception()
        self._in_flight.popleft()
        if error is not None and self._failure is None:
            self._failure = FsyncFailed(name, error)
