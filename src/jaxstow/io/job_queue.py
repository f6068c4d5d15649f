"""A queue of jobs run in order on one thread of its own (a collector's deliveries), the first error coming back to the caller.

>>> from jaxstow.io.job_queue import JobQueue
>>> done = []
>>> writer = JobQueue("example")
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

import collections
import threading
from collections.abc import Callable

from jaxstow._write import at_exit

__all__ = ["JobQueue"]


class JobQueue:
    """Runs submitted jobs in order on a thread of its own, with at most ``max_pending`` waiting at a time.

    The thread starts with the first job and ends after ``linger`` seconds without one. After a job fails, later
    jobs are dropped (so that :meth:`submit` never blocks for ever) and :meth:`submit` and :meth:`wait` raise the
    failure. Jobs still queued when the program ends are run before the interpreter shuts down, so none is cut off
    in the middle; a failure that no :meth:`submit` or :meth:`wait` raised is then printed and the process exits
    with a non-zero status (see :mod:`jaxstow._write.at_exit`). Jobs submitted after that point run at once, on the
    caller's thread.
    """

    def __init__(self, name: str, max_pending: int = 8, linger: float = 1.0) -> None:
        self._name = name
        self._max_pending = max_pending
        self._linger = linger
        self._jobs: collections.deque[Callable[[], object]] = collections.deque()
        self._running = False  # a job is being run
        self._thread_alive = False
        self._error: BaseException | None = None
        self._raised = False  # the error has reached a caller
        self._changed = threading.Condition()

    @property
    def what(self) -> str:
        """What the writer does, for the message of a failure at exit."""
        return f"the queued writes of {self._name}"

    def _run(self) -> None:
        while True:
            with self._changed:
                if not self._jobs:
                    self._changed.wait(self._linger)
                if not self._jobs:
                    self._thread_alive = False
                    if self._error is None:
                        at_exit.untrack(self)
                    return
                job = self._jobs.popleft()
                self._running = True
                self._changed.notify_all()
            try:
                if self._error is None:
                    job()
            except BaseException as error:  # SystemExit too: a thread that ended would leave submit waiting for ever
                self._error = error
            finally:
                del job  # what the job holds is freed now, not when the next one comes
                with self._changed:
                    self._running = False
                    self._changed.notify_all()

    def _raise_failure(self) -> None:
        if self._error is not None:
            self._raised = True
            at_exit.untrack(self)
            raise self._error

    def submit(self, job: Callable[[], object]) -> None:
        """Queue ``job``, waiting while too many are queued; raise the failure of an earlier job instead, if any."""
        with self._changed:
            self._raise_failure()
            while len(self._jobs) >= self._max_pending:
                self._changed.wait()
            if not at_exit.track(self):  # the interpreter is exiting and waits for no thread: run it here, in turn
                self._changed.wait_for(lambda: not (self._jobs or self._running))
                job()
                return
            self._jobs.append(job)
            self._changed.notify_all()
            if not self._thread_alive:
                self._thread_alive = True
                # A plain thread, not one of jaxstow's that block signals (jaxstow._util.signal_free): its jobs run
                # the program's collectors, and a process one of them starts gets the signals this thread blocks.
                threading.Thread(target=self._run, name=self._name, daemon=True).start()

    def wait(self, *, again: bool = True) -> None:
        """Wait until every queued job has run; raise the first failure, if any (``again=False``: unless it was
        raised before)."""
        self.finish(None)
        if again or not self._raised:
            self._raise_failure()

    def finish(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` seconds (``None``: for ever) until every queued job has run; whether they have."""
        with self._changed:
            return self._changed.wait_for(lambda: not (self._jobs or self._running), timeout)

    def uncollected_error(self) -> BaseException | None:
        """The failure of a job, if no :meth:`submit` or :meth:`wait` has raised it."""
        return None if self._raised else self._error
