"""The HDF5 files that the :class:`~jaxstow.io.HDF5Collector`\\ s of this process write, each under its
:class:`~jaxstow.io.swmr.WriterLock`, and the taking over of a file from a collector that was dropped.

A run that fails (an exception inside ``jax.jit``) leaves its collector with writes still queued, which hold it, and
with them its lock, until they are done. The newest collector of the file waits for them: a collector that nothing
else holds (the caller dropped it, as a retry loop or a notebook cell run again does) is then gone, its file closed
and its lock released, and the new collector takes the file over, continuing from the last checkpoint. One that the
caller still holds may still be running, and is refused: one writer at a time. The refusal says how to close it
where the caller has no name for it (:func:`close_writer`).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import weakref
from collections.abc import Callable
from typing import Any

from jaxstow._storage.failures import storage_failures
from jaxstow.errors import CheckpointError, IsAFolderError
from jaxstow.io.hdf5_layout import checkpoint_path
from jaxstow.io.job_queue import JobQueue
from jaxstow.io.swmr import WriterLock, open_appending, open_writer

__all__ = ["close_writer", "opened_again", "opened_first"]

#: Per file (its real path): the collector of this process that opened it last, its queued writes, and the waits for
#: the blocks on their way to it (none of which holds the collector).
_HOLDERS: dict[str, tuple[weakref.ref[Any], JobQueue, list[Callable[[], None]]]] = {}


def opened_first(
    path: str | os.PathLike[str],
    checkpoint_dir: str | None,
    collector: Any,
    writes: JobQueue,
    senders: list[Callable[[], None]],
) -> tuple[Any, WriterLock]:
    """Open the HDF5 file at ``path`` for a new ``collector`` (see :func:`~jaxstow.io.swmr.open_writer`), whose
    checkpoints go to ``checkpoint_dir``, which queues its writes on ``writes`` and waits for ``senders`` before it
    closes the file; return the file and its lock."""
    name = os.path.abspath(path)  # later runs open it again: the same file, whatever the working directory
    if os.path.isdir(name):
        raise IsAFolderError("is a folder: HDF5Collector needs the path of an HDF5 file to write", file=name)
    opening = functools.partial(open_writer, name, checkpoint_path(name, checkpoint_dir))
    return _taken_over(name, opening, collector, writes, senders)


def opened_again(
    name: str, collector: Any, writes: JobQueue, senders: list[Callable[[], None]]
) -> tuple[Any, WriterLock]:
    """Open the HDF5 file ``name``, which ``collector`` closed when its last run ended, again for its next run (see
    :func:`~jaxstow.io.swmr.open_appending`); return the file and its lock."""
    return _taken_over(name, functools.partial(open_appending, name), collector, writes, senders)


def _taken_over(
    name: str,
    opening: Callable[[], tuple[Any, WriterLock]],
    collector: Any,
    writes: JobQueue,
    senders: list[Callable[[], None]],
) -> tuple[Any, WriterLock]:
    """Open the file with ``opening``; refused by the lock of a collector of this process that nothing holds but its
    queued writes, open it again once they are done and that collector is gone."""
    key = os.path.realpath(name)
    with storage_failures(name, hdf5=True):
        try:
            opened = opening()
        except CheckpointError as refused:
            if not _dropped(key):
                if key not in _HOLDERS:
                    raise
                raise CheckpointError(
                    f"{refused}; where nothing names that collector (the traceback of the exception that stopped its "
                    "run holds it, as IPython's sys.last_exc, pdb or an exception object kept do), run "
                    f"import jaxstow; jaxstow.io.hdf5_writers.close_writer({name!r})",
                    file=name,
                ) from None
            opened = opening()
    _HOLDERS[key] = (weakref.ref(collector), writes, senders)
    return opened


def _dropped(key: str) -> bool:
    """Whether the collector of this process that opened the file last is gone once its writes are done."""
    if key not in _HOLDERS:
        return False  # the lock is held by another process, or by io.run_chains
    holder, writes, senders = _HOLDERS[key]
    for wait in senders:
        with contextlib.suppress(Exception):  # a failure of the dropped run: its own
            wait()
    writes.finish(None)  # a write that failed: the dropped run's, printed when the program ends
    if holder() is not None:
        gc.collect()  # a collector held only in a reference cycle (a failed run's frames may leave one)
    return holder() is None


def close_writer(path: str | os.PathLike[str]) -> None:
    """Close the :class:`~jaxstow.io.HDF5Collector` of this process that writes the file at ``path``, as its
    ``close()`` does (its queued writes waited for, its file closed, its lock released), for a collector whose run
    failed and that is held where the caller has no name for it: the traceback of the exception that stopped the run
    (IPython's ``sys.last_exc``, pdb, an exception object kept). A file that no collector of this process writes is
    left as it is."""
    held = _HOLDERS.get(os.path.realpath(path))
    collector = None if held is None else held[0]()
    if collector is not None:
        collector.close()
