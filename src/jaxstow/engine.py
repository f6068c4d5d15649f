"""Moving bytes for saves that finish in the background: freezing trees, one writer thread, progress, carried errors.

A background save has two halves. :func:`freeze` runs on the caller's thread and does only what cannot wait: it takes
the tree's structure and holds every array on the host (zero-copy for CPU arrays, which also keeps a later donation
from reusing their buffers). :meth:`Frozen.snapshot` and the writing run later on the :class:`BackgroundWriter`'s
thread, which hands any error back to the caller at the next :meth:`~BackgroundWriter.submit`,
:meth:`~BackgroundWriter.wait` or :meth:`~BackgroundWriter.close`.

>>> import io, jax.numpy as jnp, jaxstow
>>> from jaxstow.engine import BackgroundWriter, freeze
>>> buffer = io.BytesIO()
>>> frozen = freeze({"w": jnp.ones(2)})
>>> writer = BackgroundWriter()
>>> writer.submit(lambda: frozen.snapshot().write(buffer), what="writing the buffer")
>>> writer.close()
>>> _ = buffer.seek(0)
>>> jaxstow.load(buffer)
{'w': Array([1., 1.], dtype=float32)}
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, BinaryIO

import jax
import numpy as np

from jaxstow.errors import CheckpointError
from jaxstow.format.leaves import is_sharded
from jaxstow.progress import Bar, counted, format_bytes
from jaxstow.snapshot import Snapshot, snapshot

__all__ = ["BackgroundWriter", "Frozen", "Progress", "freeze"]

logger = logging.getLogger(__name__)


class Frozen:
    """A tree held for a later :func:`~jaxstow.snapshot.snapshot`: its structure and its leaves, arrays on the host."""

    def __init__(self, tree: Any, *, copy: bool, file: str, part: int | None = None) -> None:
        self._file = file
        self._part = part
        self._ready: Snapshot | None = None
        if copy:
            # Copies are taken now; the core's snapshot already knows how to copy every kind of stored leaf.
            self._ready = snapshot(tree, copy=True, file=file, part=part)
            return
        leaves, self._treedef = jax.tree_util.tree_flatten(tree)
        self._leaves = _hold_on_host(leaves)
        # Typed PRNG keys stay JAX arrays (they keep their kind in the file); a host view of their data keeps a
        # later donation from reusing their buffers all the same.
        self._guards = [np.asarray(jax.random.key_data(leaf)) for leaf in leaves if _is_key(leaf)]

    def snapshot(self) -> Snapshot:
        """The tree's :class:`~jaxstow.snapshot.Snapshot`; errors in the tree (an unsaveable leaf) surface here."""
        if self._ready is not None:
            return self._ready
        tree = jax.tree_util.tree_unflatten(self._treedef, self._leaves)
        return snapshot(tree, file=self._file, part=self._part)


def freeze(tree: Any, *, copy: bool = False, file: str = "", part: int | None = None) -> Frozen:
    """Hold ``tree`` for a background save; only this part has to run on the caller's thread.

    JAX arrays are immutable: without ``copy`` they are held as host views, with no copy on CPU. ``copy=True`` copies
    every array now, for trees whose numpy buffers the caller will change. ``file`` names the destination in errors;
    ``part`` is this process's share of a tree saved by several (see :func:`~jaxstow.snapshot.snapshot`).

    >>> import numpy as np
    >>> from jaxstow.engine import freeze
    >>> weights = np.zeros(2)
    >>> frozen = freeze({"w": weights}, copy=True)
    >>> weights[:] = 1
    >>> frozen.snapshot().leaves[0].array
    array([0., 0.])
    """
    return Frozen(tree, copy=copy, file=file, part=part)


def _is_plain_array(leaf: Any) -> bool:
    """A JAX array of a numpy dtype: not a typed PRNG key or another extended dtype, which numpy cannot hold."""
    return isinstance(leaf, jax.Array) and isinstance(leaf.dtype, np.dtype)


def _is_key(leaf: Any) -> bool:
    return (
        isinstance(leaf, jax.Array)
        and not isinstance(leaf.dtype, np.dtype)
        and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)
    )


def _hold_on_host(leaves: list[Any]) -> list[Any]:
    """Leaves with every plain JAX array on one device replaced by its host array; transfers from accelerators
    overlap. Sharded arrays stay as they are (immutable), to be saved shard by shard."""
    if jax.default_backend() != "cpu":
        for leaf in leaves:
            if _is_plain_array(leaf):
                leaf.copy_to_host_async()
    return [np.asarray(leaf) if _is_plain_array(leaf) and not is_sharded(leaf) else leaf for leaf in leaves]


class BackgroundWriter:
    """Runs jobs one at a time, in order, on one background thread (or at once, with ``asynchronous=False``).

    At most one job is in flight: :meth:`submit` first waits for the previous one. An error of a background job is
    logged when it happens and raised, as a :class:`~jaxstow.errors.CheckpointError` whose ``__cause__`` is the
    original error, by the next :meth:`submit`, :meth:`wait` or :meth:`close`. Without ``asynchronous`` jobs run on
    the caller's thread and their errors propagate unchanged.

    >>> from jaxstow.engine import BackgroundWriter
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


class Progress:
    """Progress of one job that writes ``total`` bytes of arrays (plus headers): logged, and drawn as a bar if ``bar``.

    Wrap each sink with :meth:`sink` so that its writes are counted.

    >>> import io
    >>> from jaxstow.engine import Progress
    >>> progress = Progress("saving step 1", total=5)
    >>> _ = progress.sink(io.BytesIO()).write(b"hello")
    >>> progress.written
    5
    >>> seconds = progress.finish()
    """

    def __init__(self, what: str, *, total: int, bar: bool = False) -> None:
        self.what = what
        self._start = time.perf_counter()
        self._bar = Bar(total, what, enabled=bar)
        logger.info("%s: saving %s of arrays", what, format_bytes(total))

    @property
    def written(self) -> int:
        """Bytes written so far."""
        return self._bar.done

    def sink(self, file: BinaryIO) -> BinaryIO:
        """``file``, with every write counted."""
        return counted(file, self._bar)

    def finish(self) -> float:
        """Log the end of the job; returns its duration in seconds."""
        seconds = time.perf_counter() - self._start
        self._bar.close()
        rate = format_bytes(self.written / seconds) if seconds > 0 else "-"
        logger.info("%s: done, %s written in %.2f s (%s/s)", self.what, format_bytes(self.written), seconds, rate)
        return seconds
