"""One thread of the process's, kept to take half of a short job off its caller, handed and waited for with plain
locks: a pool's future, work queue and thread count cost more than the job's half saves. Measured here, a 4 MiB
leaf read in halves through a pool in 0.26-0.29 ms, through the partner in 0.24-0.25 ms.

The partner runs one job at a time, and one more may wait for it. :func:`hand` gives ``None`` while one waits (or the
thread cannot start), and the caller does that work itself; a job not begun can be taken back (:meth:`Handed.cancel`),
so that no caller waits on another's job. The thread is started as jaxstow starts its threads (every asynchronous
signal blocked), on first use and again in a forked child, and ends with the interpreter.

>>> from jaxstow._util.partner import hand
>>> handed = hand(lambda: sum(range(10)))
>>> handed is None or handed.cancel() or handed.result() == 45
True
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from jaxstow._util.signal_free import start_thread

__all__ = ["Handed", "hand", "two_at_once"]

A = TypeVar("A")
T = TypeVar("T")


class Handed(Generic[T]):
    """A job handed to the partner: taken back before it begins (:meth:`cancel`), or waited for (:meth:`result`)."""

    __slots__ = ("_begun", "_done", "_error", "_job", "_value")

    def __init__(self, job: Callable[[], T]) -> None:
        self._job: Callable[[], T] | None = job
        self._value: T | None = None
        self._error: BaseException | None = None
        self._done = threading.Lock()
        self._done.acquire()  # released once the job has run or was taken back
        self._begun = False  # set by the partner, under its state lock, as it takes the job

    def cancel(self) -> bool:
        """Take the job back if the partner has not begun it; whether it was taken back (the caller then runs it)."""
        return _PARTNER.take_back(self)

    def result(self) -> T:
        """Wait for the job; its value, or the error it raised."""
        with self._done:
            pass
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]  # set by run(), which ran

    def settle(self) -> None:
        """Take the job back or wait for it to end, whatever it raised: no thread touches what it was given after.
        Safe on a job never handed; a further interrupt in the wait is raised once it ends."""
        if self.cancel() or not _PARTNER.begun(self):
            return
        interrupted = None
        while True:
            try:
                self._done.acquire()
                self._done.release()
                break
            except BaseException as error:  # a second Ctrl-C: the partner still writes into what it was given
                interrupted = error
        if interrupted is not None:
            raise interrupted

    def run(self) -> None:
        """Run the job, on the partner's thread, keeping its value or its error, then let go of the job."""
        job, self._job = self._job, None
        try:
            self._value = job()  # type: ignore[misc]  # run once, by the thread that took it
        except BaseException as error:
            self._error = error
        finally:
            self._done.release()


class _Partner:
    """The thread and the locks it is handed jobs with; made anew in a forked child (which has no thread)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """No thread yet, and locks of its own (in a forked child, whose parent's locks its threads may hold)."""
        self._lock = threading.Lock()  # held while the thread is started
        self._running = False
        self._pending = False  # from a job's handing until the thread has taken it or found it gone
        self._go = threading.Lock()  # released once for each job handed
        self._go.acquire()
        self._state = threading.Lock()  # guards the job waiting to be begun
        self._waiting: Handed[Any] | None = None

    def hand(self, job: Callable[[], T]) -> Handed[T] | None:
        handed = Handed(job)
        return handed if self.give(handed) else None

    def give(self, handed: Handed[Any]) -> bool:
        """Hand ``handed`` over; interrupted anywhere, the state says whether it was (:meth:`Handed.settle`)."""
        if not (self._running or self._start()):
            return False
        with self._state:
            if self._pending:
                return False
            try:  # interrupted between these lines (a signal's handler raising), the partner is woken all the same
                self._pending = True  # cleared by the partner once it wakes
                self._waiting = handed
            finally:
                self._go.release()
        return True

    def begun(self, handed: Handed[Any]) -> bool:
        with self._state:
            return handed._begun

    def take_back(self, handed: Handed[Any]) -> bool:
        with self._state:
            if self._waiting is not handed:
                return False
            self._waiting = None  # the thread, woken, finds no job and frees itself
        handed._done.release()
        return True

    def _start(self) -> bool:
        with self._lock:
            if not self._running:
                if sys.is_finalizing():  # a thread started now never runs (3.11: start() waits for it forever)
                    return False
                try:
                    start_thread(threading.Thread(target=self._serve, name="jaxstow-partner", daemon=True))
                except RuntimeError:  # the interpreter is exiting, or no thread can be started now
                    return False
                self._running = True
        return True

    def _serve(self) -> None:
        while True:
            self._go.acquire()
            with self._state:
                handed, self._waiting = self._waiting, None
                self._pending = False  # the next job may be handed while this one runs
                if handed is not None:
                    handed._begun = True
            if handed is not None:
                handed.run()
                handed = None


_PARTNER = _Partner()
if hasattr(os, "register_at_fork"):  # a forked child has no partner thread, and locks its parent's threads held
    os.register_at_fork(after_in_child=_PARTNER.reset)


def hand(job: Callable[[], T]) -> Handed[T] | None:
    """``job`` handed to the partner thread, begun within microseconds, or after the job it runs; ``None`` where a
    job waits for it already, and the caller runs ``job`` itself."""
    return _PARTNER.hand(job)


def two_at_once(mine: Callable[[], A], theirs: Callable[[], T]) -> tuple[A, T]:
    """``mine()`` on this thread while the partner runs ``theirs()``, which this thread runs next where the partner
    had not begun it (busy); both results. Whatever either raises (an interrupt in the wait included) is raised once
    the partner is done with ``theirs`` or it is taken back: nothing it was given is touched after.

    >>> two_at_once(lambda: "a", lambda: "b")
    ('a', 'b')
    """
    handed = Handed(theirs)
    try:
        given = _PARTNER.give(handed)
        first = mine()
        if not given or handed.cancel():
            return first, theirs()
        return first, handed.result()
    except BaseException:
        handed.settle()  # whatever was interrupted, handing included: the state tells what to wait for
        raise
