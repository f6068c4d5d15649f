"""Saves that finish in the background: one writer thread, jobs in order, errors carried back to the caller.

>>> import io, jax.numpy as jnp, jaxstow
>>> from jaxstow._write.background import BackgroundWriter
>>> from jaxstow._write.held import hold
>>> buffer = io.BytesIO()
>>> held = hold({"w": jnp.ones(2)})
>>> writer = BackgroundWriter()
>>> writer.submit(lambda: held.encode().write(buffer), what="writing the buffer")
>>> writer.close()
>>> _ = buffer.seek(0)
>>> jaxstow.load(buffer)
{'w': Array([1., 1.], dtype=float32)}
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from jaxstow.errors import CheckpointError

__all__ = ["BackgroundWriter"]

logger = logging.getLogger(__name__)


class BackgroundWriter:
    """Runs jobs one at a time, in order, on one background thread (or at once, with ``asynchronous=False``).

    At most one job is in flight: :meth:`submit` first waits for the previous one. An error of a background job is
    logged when it happens and raised, as a :class:`~jaxstow.errors.CheckpointError` whose ``__cause__`` is the
    original error, by the next :meth:`submit`, :meth:`wait` or :meth:`close`. Without ``asynchronous`` jobs run on
    the caller's thread and their errors propagate unchanged.

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
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="jaxstow-writer") if asynchronous else None
        self._pending: tuple[Future[None], str] | None = None
        self._lock = threading.Lock()

    def submit(self, job: Callable[[], None], *, what: str) -> None:
        """Run ``job`` after the previous one; ``what`` names it in logs and errors (``"saving step 3 to /ckpt"``)."""
        with self._lock:
            self._raise_pending()
            if self._pool is None:
                job()
                return
            future = self._pool.submit(_logged, job, what)
            self._pending = (future, what)

    def idle(self) -> None:
        """Wait until no job runs, keeping any error for the next :meth:`submit`, :meth:`wait` or :meth:`close`."""
        pending = self._pending
        if pending is not None:
            pending[0].exception()

    def wait(self) -> None:
        """Wait until no job runs; raise the error of the last one, if it failed."""
        with self._lock:
            self._raise_pending()

    def close(self) -> None:
        """Wait for the last job, stop the thread, and raise the last job's error, if any."""
        try:
            self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown()

    def _raise_pending(self) -> None:
        if self._pending is None:
            return
        future, what = self._pending
        error = future.exception()
        self._pending = None
        if error is not None:
            raise CheckpointError(f"{what} failed in the background: {type(error).__name__}: {error}") from error


def _logged(job: Callable[[], None], what: str) -> None:
    try:
        job()
    except BaseException:
        logger.exception("%s failed in the background; the error is raised again by the next save, wait or close", what)
        raise
