"""Work handed to a pool of threads, done on the caller's thread where the pool takes no more.

``concurrent.futures`` refuses new work once the interpreter has begun to exit (before the ``atexit`` handlers run)
and once a pool is shut down: a save or a restore made by an exit handler would fail on a ``RuntimeError`` that is
none of jaxstow's. :func:`submit` runs the job at once instead, and hands back its future, already done.

>>> from concurrent.futures import ThreadPoolExecutor
>>> from jaxstow._util.pools import submit
>>> pool = ThreadPoolExecutor(1)
>>> submit(pool, sum, [1, 2]).result()
3
>>> pool.shutdown()
>>> submit(pool, sum, [1, 2]).result()  # run on this thread
3
"""

from __future__ import annotations

import collections
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar

from jaxstow._util.signal_free import ThreadPool

__all__ = ["SharedPool", "submit"]

A = TypeVar("A")
T = TypeVar("T")


def submit(pool: Executor, job: Callable[..., T], *args: Any) -> Future[T]:
    """``pool.submit(job, *args)``, or ``job(*args)`` run on this thread where the pool takes no more work; its future.

    The job runs once: a pool may queue it and then refuse (a thread it could not start), and a thread of the pool may
    take it from the queue later; whichever of the two claims it first runs it.
    """
    done: Future[T] = Future()
    claim = threading.Lock()

    def run_once() -> None:
        if not (claim.acquire(blocking=False) and done.set_running_or_notify_cancel()):
            return  # run by the other, or cancelled before it began
        try:
            done.set_result(job(*args))
        except BaseException as error:
            done.set_exception(error)

    try:
        pool.submit(run_once)
    except RuntimeError:  # "cannot schedule new futures after (interpreter) shutdown", "can't start new thread"
        run_once()
    return done


class SharedPool:
    """The threads, ``size`` at most, that one purpose's short fan-outs share for the life of the process: made on
    first use, started as the fan-outs need them, kept idle between them (they end at the interpreter's exit), and
    made again in a process forked from this one, which has none of them.

    A fan-out's caller runs its jobs too, and waits only for jobs already begun, so a job that fans out on the same
    pool, or callers on many threads at once, cannot leave a job waiting for a thread.

    >>> from jaxstow._util.pools import SharedPool
    >>> [future.result() for future in SharedPool("doctest", 2).run_each(len, ["a", "bb", "ccc"])]
    [1, 2, 3]
    """

    def __init__(self, purpose: str, size: int) -> None:
        self.purpose = purpose
        self.size = size
        self.forget()
        _SHARED.add(self)

    def forget(self) -> None:
        """Drop the threads (a forked child has none of its parent's, and its lock may have been held at the fork)."""
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPool(self.size, thread_name_prefix=f"jaxstow-{self.purpose}")
            return self._pool

    def submit(self, job: Callable[..., T], *args: Any) -> Future[T]:
        """``job(*args)`` on one of the threads, or run on this thread where the pool takes no more work (see
        :func:`submit`); its future."""
        return submit(self._executor(), job, *args)

    def run_each(self, job: Callable[[A], T], args: Sequence[A], *, at_once: int | None = None) -> list[Future[T]]:
        """``job(arg)`` for each of ``args``, begun in their order, ``at_once`` at a time at most (``size`` by default),
        one of them on this thread: each one's future, in order, once all have ended. Interrupted, the jobs not begun
        are cancelled and those running waited for."""
        futures: list[Future[T]] = [Future() for _ in args]
        waiting = collections.deque(zip(args, futures, strict=True))

        def run_waiting() -> None:
            while begun := _next(waiting):
                arg, future = begun
                try:
                    future.set_running_or_notify_cancel()
                    future.set_result(job(arg))
                except BaseException as error:
                    future.set_exception(error)

        try:
            for _ in range(min(len(args), at_once or self.size, self.size) - 1):
                submit(self._executor(), run_waiting)
            run_waiting()
            wait(futures)
        except BaseException:
            while not_begun := _next(waiting):
                not_begun[1].cancel()
                not_begun[1].set_running_or_notify_cancel()  # done, for wait()
            wait([future for future in futures if future.running()])  # not one this thread took as it was interrupted
            raise
        return futures


def _next(waiting: collections.deque[tuple[A, Future[T]]]) -> tuple[A, Future[T]] | None:
    """The first of ``waiting``, taken from it (by one thread of several), or ``None`` once it is empty."""
    try:
        return waiting.popleft()
    except IndexError:
        return None


def _made_again_in_child() -> None:
    for pool in list(_SHARED):
        pool.forget()


_SHARED: weakref.WeakSet[SharedPool] = weakref.WeakSet()
os.register_at_fork(after_in_child=_made_again_in_child)
