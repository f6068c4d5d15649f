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

import queue
import threading
from collections.abc import Callable

__all__ = ["BackgroundWriter"]


class BackgroundWriter:
    """Runs submitted jobs in order on a daemon thread, at most ``max_pending`` waiting at a time.

    After a job fails, later jobs are dropped (so that :meth:`submit` never blocks for ever) and :meth:`submit`
    and :meth:`wait` raise the failure.
    """

    def __init__(self, name: str, max_pending: int = 8) -> None:
        self._jobs: queue.Queue[Callable[[], object]] = queue.Queue(max_pending)
        self._error: Exception | None = None
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                if self._error is None:
                    job()
            except Exception as error:
                self._error = error
            finally:
                self._jobs.task_done()

    def _raise_failure(self) -> None:
        if self._error is not None:
            raise self._error

    def submit(self, job: Callable[[], object]) -> None:
        """Queue ``job``; raise the failure of an earlier job instead, if there was one."""
        self._raise_failure()
        self._jobs.put(job)

    def wait(self) -> None:
        """Wait until every queued job has run; raise the first failure, if any."""
        self._jobs.join()
        self._raise_failure()
