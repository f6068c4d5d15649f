"""Saves that finish in the background: one writer thread, jobs in order, errors carried back to the caller.

A job runs on a thread of its own, not in a ``concurrent.futures`` pool, so that it can still start threads while the
interpreter shuts down; a job in flight at exit is finished first (:mod:`jaxstow._write.at_exit`). A process forked
while a job was in flight has no thread running it: the job is its parent's, which waits for it and reports it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from jaxstow._util.signal_free import start_thread
from jaxstow._write import at_exit
from jaxstow.errors import CheckpointError, JaxstowError, failed

__all__ = ["BackgroundWriter"]

logger = logging.getLogger(__name__)


class BackgroundWriter:
    """Runs jobs one at a time, in order, each on a background thread of its own.

    At most one job is in flight: :meth:`submit` first waits for the previous one. An error of a background job is
    logged when it happens (one line, no traceback) and raised, as a :class:`~jaxstow.errors.CheckpointError` whose
    ``__cause__`` is the original error, by the next :meth:`submit`, :meth:`wait` or :meth:`close`; a storage
    failure as a :class:`~jaxstow.errors.CheckpointStorageError`, also a ``StorageError``. With
    ``asynchronous=False`` jobs run on the caller's thread and their errors propagate unchanged.

    >>> from jaxstow._write.background import BackgroundWriter
    >>> writer = BackgroundWriter()
    >>> writer.submit(lambda: 1 / 0, what="dividing")
    >>> try:
    ...     writer.wait()
    ... except Exception as error:
    ...     print(error, "<-", repr(error.__cause__))
    dividing failed in the background: ZeroDivisionError: division by zero <- ZeroDivisionError('division by zero')
    >>> writer.close()
    """

    def __init__(self, *, asynchronous: bool = True) -> None:
        self._asynchronous = asynchronous
        self._pending: _Job | None = None
        self._lock = threading.Lock()

    def submit(self, job: Callable[[], None], *, what: str, until: threading.Event | None = None) -> None:
        """Run ``job`` after the previous one; ``what`` names it in logs and errors (``"saving step 3 to /ckpt"``).

        With ``until``, return once the job has set it (or has ended), not as soon as the job has started.
        """
        with self._lock:
            self._raise_pending(refused=what)
            if not self._asynchronous:
                job()
                return
            pending = _Job(job, what, until)
            if not at_exit.track(pending):  # the interpreter is exiting: nothing would wait for a thread
                job()
                return
            self._pending = pending
            start_thread(threading.Thread(target=pending.run, name="jaxstow-writer", daemon=True))
            if until is not None:
                until.wait()

    def idle(self) -> None:
        """Wait until no job runs, keeping any error for the next :meth:`submit`, :meth:`wait` or :meth:`close`."""
        pending = self._own()
        if pending is not None:
            pending.done.wait()

    def wait(self, *, refused: str | None = None) -> None:
        """Wait until no job runs; raise the error of the last one, if it failed (``refused`` names the job the caller
        then does not start, for the error to say so).

        Every thread waiting while the job ran gets its error; a wait that starts after it was raised does not.
        """
        pending = self._own()
        if pending is not None:
            pending.done.wait()
        with self._lock:
            if pending is not None and pending is not self._pending and pending.error is not None:
                raise _failure(pending, refused) from pending.error  # another waiter took it: this one's too
            self._raise_pending(refused=refused)

    def close(self) -> None:
        """Wait for the last job and raise its error, if any."""
        self.wait()

    def _own(self) -> _Job | None:
        """The last job, unless this process was forked from the one that submitted it (forgotten then)."""
        if self._pending is not None and self._pending.pid != os.getpid():
            self._pending = None
        return self._pending

    def _raise_pending(self, *, refused: str | None = None) -> None:
        """Raise the error of the last job, if it failed; ``refused`` names the job that then does not start."""
        pending = self._own()
        if pending is None:
            return
        pending.done.wait()  # the job stays pending until it ended: a Ctrl-C here leaves it for the next wait
        self._pending = None
        at_exit.untrack(pending)
        if pending.error is not None:
            raise _failure(pending, refused) from pending.error


def _failure(pending: _Job, refused: str | None = None) -> JaxstowError:
    """The error :meth:`BackgroundWriter.wait` raises for a job that failed; ``refused`` names the job submitted
    after it, which does not start."""
    assert pending.error is not None
    message = f"{pending.what} failed in the background: {_described(pending.error)}"
    if refused is not None:
        message += f" (so {refused} did not start: ask for it again)"
    return failed(CheckpointError, message, pending.error)


class _Job:
    """One job on its thread: whether it has ended, and its error.

    Waited for at exit until it ends well or its error is collected.
    """

    def __init__(self, job: Callable[[], None], what: str, until: threading.Event | None = None) -> None:
        self._job: Callable[[], None] | None = job
        self._until = until
        self.what = what
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.pid = os.getpid()  # the process whose thread runs it

    def run(self) -> None:
        assert self._job is not None
        try:
            self._job()
        except BaseException as error:
            self.error = error
            if not at_exit.exiting():  # else the exit prints it
                logger.error(
                    "%s failed in the background; the error is raised again by the next save, wait or close: %s",
                    self.what,
                    _described(error),
                )
        else:
            at_exit.untrack(self)
        finally:
            self._job = None  # the job holds the arrays being saved: let them go now
            if self._until is not None:
                self._until.set()
            self.done.set()

    def finish(self, timeout: float) -> bool:
        return self.done.wait(timeout)

    def uncollected_error(self) -> BaseException | None:
        return self.error


def _described(error: BaseException) -> str:
    """An error in one line: jaxstow's own as it is (it names its file), another with its type."""
    text = str(error) if isinstance(error, JaxstowError) else f"{type(error).__name__}: {error}"
    return " ".join(text.split("\n"))
