"""Files of a folder fsynced and closed on threads of their own while the next files are written.

Writing a file and then waiting for its fsync leaves the disk idle while the next file is written, and the writer idle
while the disk takes the last one: a step of many files took the sum of both. Here each file, once written, is handed
over: a thread fsyncs it through the descriptor that wrote it (a later descriptor may not see a write-back error) and
closes it, while the caller writes the next. At most ``at_once`` files are in flight (the oldest is waited for before
one more is handed over), so open descriptors stay few. :meth:`Fsyncs.wait` returns once every file is closed, with
the first failure, if any, and the name of its file.

>>> import os, tempfile
>>> from jaxstow._storage.background_fsync import Fsyncs
>>> fsyncs = Fsyncs(at_once=2)
>>> folder = tempfile.mkdtemp()
>>> for name in "abc":
...     sink = open(os.path.join(folder, name), "wb")
...     _ = sink.write(b"data")
...     fsyncs.hand_over(sink, name)
>>> fsyncs.wait()
"""

from __future__ import annotations

import collections
import os
import threading
from typing import BinaryIO

__all__ = ["FsyncFailed", "Fsyncs"]


class FsyncFailed(Exception):
    """A handed-over file's fsync or close failed: ``name`` says which, ``error`` (the cause too) why."""

    def __init__(self, name: str, error: BaseException) -> None:
        super().__init__(name, error)
        self.name, self.error = name, error


class _InFlight:
    """One file being fsynced and closed on a thread; :meth:`join` its outcome."""

    def __init__(self, sink: BinaryIO, name: str) -> None:
        self.name = name
        self._sink = sink
        self._error: BaseException | None = None
        self._done = False
        self._thread = threading.Thread(target=self._run, name="jaxstow-fsync", daemon=False)
        self._thread.start()

    def _run(self) -> None:
        try:
            try:
                self._sink.flush()
                os.fsync(self._sink.fileno())
            finally:
                self._sink.close()
        except BaseException as error:  # told by join, on the caller's thread
            self._error = error
        self._done = True

    def join(self) -> BaseException | None:
        """Wait until the file is closed; its failure, if any."""
        self._thread.join()
        if not self._done and self._error is None:  # a thread of the parent in a forked child: not synced here
            return RuntimeError("its fsync ran in another process")
        return self._error


class Fsyncs:
    """Handed-over files, fsynced and closed in the background, ``at_once`` at most in flight."""

    def __init__(self, at_once: int = 8) -> None:
        self.at_once = at_once
        self._in_flight: collections.deque[_InFlight] = collections.deque()
        self._failure: FsyncFailed | None = None

    def hand_over(self, sink: BinaryIO, name: str) -> None:
        """Fsync and close ``sink`` (written, its buffer flushed or not) in the background; ``name`` names it in a
        failure. Waits for the oldest file first where ``at_once`` are in flight."""
        while len(self._in_flight) >= self.at_once:
            self._settle(self._in_flight.popleft())
        self._in_flight.append(_InFlight(sink, name))

    def wait(self) -> None:
        """Return once every file handed over is closed; raise :class:`FsyncFailed` for the first that failed."""
        while self._in_flight:
            self._settle(self._in_flight.popleft())
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure from failure.error

    def _settle(self, file: _InFlight) -> None:
        error = file.join()
        if error is not None and self._failure is None:
            self._failure = FsyncFailed(file.name, error)
