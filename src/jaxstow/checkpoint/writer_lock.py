"""The writer's lock of a checkpoint directory as a manager holds it: taken by its first save, in one process.

A process forked from the one that took it (``os.fork``, :mod:`multiprocessing`'s fork start method) inherits the
manager, and the lock with it, but none of its threads: a save there would write beside the parent's saves, and its
keep policy delete the parent's steps. :meth:`WriterLock.check_here` refuses that, naming the parent; and a local
directory given through a link that leads to another folder since the lock was taken, whose steps another manager may
be writing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from jaxstow._storage.folders import LocalStore
from jaxstow._storage.lock import lock_store
from jaxstow._storage.store import Store
from jaxstow.errors import CheckpointError

__all__ = ["WriterLock"]

logger = logging.getLogger("jaxstow.checkpoint.manager")


class WriterLock:
    """The lock of ``store``'s directory, taken in this process, the leftovers of interrupted saves (the names that
    ``leftover`` owns) removed once it is held."""

    def __init__(self, store: Store, leftover: Callable[[str], bool]) -> None:
        self._lock = lock_store(store)
        self.pid = os.getpid()
        self._root = store.root if isinstance(store, LocalStore) else None
        self._locked = _real_folder(self._root)  # the folder whose lock this is
        try:
            removed = store.cleanup(leftover)
        except BaseException:  # a folder it cannot clean up (a damaged record): no writer holds the lock then
            self._lock.release()
            raise
        if removed:
            logger.info("%s: removed leftovers of interrupted saves: %s", store.location, ", ".join(removed))

    def check_here(self, directory: str) -> None:
        """Raise a :class:`~jaxstow.errors.CheckpointError` in a process forked from the one that took the lock, or
        where the lock was lost (an object store's, taken over after this process renewed it no more)."""
        if os.getpid() != self.pid:
            raise CheckpointError(
                f"the checkpoint manager of {directory} writes there from process {self.pid}, which this process "
                f"({os.getpid()}) was forked from: a forked process cannot save or delete steps with its parent's "
                "manager, whose saves and keep policy are the parent's. Save from the parent process (a forked "
                "process may still restore steps), or give this process a CheckpointManager of a directory of its own"
            )
        now = _real_folder(self._root)
        if now is not None and self._locked is not None and now != self._locked:
            raise CheckpointError(
                f"{directory} now leads to {now}, not to {self._locked}, the folder whose writer's lock this manager "
                "holds (a link in its path was changed since): its saves and keep policy would act on another folder, "
                "which another manager may be writing. Close this manager, and open one of the folder to write to"
            )
        self.check_held()

    def check_held(self) -> None:
        """Raise a :class:`~jaxstow.errors.CheckpointError` where the lock was lost (an object store's, taken over)."""
        self._lock.check_held()

    def release(self) -> None:
        """Release the lock; in a forked process, leave it to the parent (see :mod:`jaxstow._storage.lock`)."""
        self._lock.release()


def _real_folder(root: str | None) -> str | None:
    """The folder a local directory leads to now, its links resolved; ``None`` for a store or a folder gone (a save
    then says that it is gone)."""
    return os.path.realpath(root) if root is not None and os.path.isdir(root) else None
