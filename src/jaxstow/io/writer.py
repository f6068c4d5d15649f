"""A background writer: jobs run in order on one thread, and the first error comes back to the caller.

>>> from jaxstow.io.writer import BackgroundWriter
>>> done = []
>>> writer = BackgroundWriter("example")
>>> writer.submit(lambda: done.append(1))
>>> writer.submit(lambda: done.append(1 / 0))
>>> try:
...     writer.wait()
... except ZeroDivisionError as error:
...     print("raised:", error)
raised: division by zero
>>> done
[1]
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import threading
import weakref
from collections.abc import Callable

__all__ = ["BackgroundWriter"]

#: Writers whose thread is alive. The thread is a daemon, so that an idle writer never keeps a process from
#: ending; its queued jobs are run before the interpreter shuts down (see :func:`_finish_queued_jobs`).
_live: weakref.WeakSet[BackgroundWriter] = weakref.WeakSet()


class BackgroundWriter:
    """Runs submitted jobs in order on a thread of its own, with at most ``max_pending`` waiting at a time.

    The thread starts with the first job and ends after ``linger`` seconds without one. After a job fails, later
    jobs are dropped (so that :meth:`submit` never blocks for ever) and :meth:`submit` and :meth:`wait` raise the
    failure. Jobs still queued when the program ends are run before the interpreter shuts down, so none is cut off
    in the middle.
    """

    def __init__(self, name: str, max_pending: int = 8, linger: float = 1.0) -> None:
        self._name = name
        self._max_pending = max_pending
        self._linger = linger
        self._jobs: collections.deque[Callable[[], object]] = collections.deque()
        self._running = False  # a job is being run
        self._thread_alive = False
        self._error: Exception | None = None
        self._changed = threading.Condition()

    def _run(self) -> None:
        while True:
            with self._changed:
                if not self._jobs:
                    self._changed.wait(self._linger)
                if not self._jobs:
                    self._thread_alive = False
                    return
                job = self._jobs.popleft()
                self._running = True
                self._changed.notify_all()
            try:
                if self._error is None:
                    job()
            except Exception as error:
                self._error = error
            finally:
                with self._changed:
                    self._running = False
                    self._changed.notify_all()

    def _raise_failure(self) -> None:
        if self._error is not None:
            raise self._error

    def submit(self, job: Callable[[], object]) -> None:
        """Queue ``job``, waiting while too many are queued; raise the failure of an earlier job instead, if any."""
        with self._changed:
            self._raise_failure()
            while len(self._jobs) >= self._max_pending:
                self._changed.wait()
            self._jobs.append(job)
            self._changed.notify_all()
            if not self._thread_alive:
                self._thread_alive = True
                _live.add(self)
                threading.Thread(target=self._run, name=self._name, daemon=True).start()

    def wait(self) -> None:
        """Wait until every queued job has run; raise the first failure, if any."""
        with self._changed:
            while self._jobs or self._running:
                self._changed.wait()
        self._raise_failure()


@atexit.register
def _finish_queued_jobs() -> None:
    """Let every writer run its queued jobs to their end while the interpreter can still run them.

    Daemon threads are stopped wherever they are when the interpreter shuts down, which inside a native library
    can abort the process. A failure was the caller's to collect; here it is left alone.
    """
    for writer in list(_live):
        with contextlib.suppress(Exception):
            writer.wait()
