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

from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

__all__ = ["submit"]

T = TypeVar("T")


def submit(pool: Executor, job: Callable[..., T], *args: Any) -> Future[T]:
    """``pool.submit(job, *args)``, or ``job(*args)`` run on this thread where the pool takes no more work."""
    try:
        return pool.submit(job, *args)
    except RuntimeError:  # "cannot schedule new futures after (interpreter) shutdown", or a broken pool
        done: Future[T] = Future()
        try:
            done.set_result(job(*args))
        except BaseException as error:
            done.set_exception(error)
        return done
