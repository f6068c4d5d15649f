"""The keep policy of the tiers other processes of the run left in a process's local directory (``process-{k}``
beside its own, with the copies they kept: :attr:`~jaxstow.checkpoint.tier_holdings.Holdings.left`): their steps
older than those the run's local tier keeps are deleted, as the process's own are, and a left tier that holds
nothing more is removed. See docs/scaling.md ("Two tiers and peers").

A left tier is pruned only while this process holds its writer's lock, the one a manager holds on its own tier: the
tier of a live process that shares the local directory, or one another process prunes at that moment, is passed
over. The tiers of another run are never among those left (see ``Holdings.find_left``).
"""

from __future__ import annotations

import contextlib
import logging
import os

from jaxstow._steps.names import StepNames
from jaxstow._steps.record import RECORD_NAME
from jaxstow._storage.failures import storage_error
from jaxstow._storage.folders import LocalStore, remove_leftovers
from jaxstow._storage.lock import LOCK_NAME, FileLock, Holder
from jaxstow.checkpoint.tier_holdings import COPIES, Holdings
from jaxstow.checkpoint.tier_owner import OWNER_NAME
from jaxstow.errors import CheckpointError, StorageError

__all__ = ["prune_left"]

logger = logging.getLogger("jaxstow.checkpoint.manager")


def prune_left(holdings: Holdings, before: int) -> None:
    """Delete from each tier left in the local directory of ``holdings`` its steps (its own and the copies it kept)
    before ``before``, then remove each that holds nothing more: no step, no leftover of a save, no copy."""
    removed = []
    for root in holdings.left.values():
        if not _due(root, holdings.names, before):
            continue
        lock = _lock(root)
        if lock is None:
            continue
        try:
            for store in _stores(root):
                for step in holdings.names.steps(store.committed()):
                    if step < before:
                        with contextlib.suppress(FileNotFoundError):  # deleted by another process of the directory
                            store.delete(holdings.names.name(step))
                        logger.info("%s: deleted step %d of a tier left here (its keep_last)", store.root, step)
                remove_leftovers(store.root)
            emptied = _emptied(root)
        finally:
            lock.release()
        if emptied:
            with contextlib.suppress(OSError):  # something written there meanwhile stays
                os.rmdir(root)
            removed.append(root)
            logger.info("%s: removed a tier left here, which holds no step any more", root)
    if removed:
        holdings.left = {process: root for process, root in holdings.left.items() if root not in removed}


def _stores(root: str) -> list[LocalStore]:
    """The folders of the left tier ``root`` that hold steps: its own, and each of the copies it kept."""
    copies = os.path.join(root, COPIES)
    return [LocalStore(root, marker=RECORD_NAME)] + [
        LocalStore(os.path.join(copies, name), marker=RECORD_NAME) for name in _listed(copies)
    ]


def _due(root: str, names: StepNames, before: int) -> bool:
    """Whether the left tier ``root`` holds a step before ``before``, or none at all."""
    steps = [step for store in _stores(root) for step in names.steps(store.committed())]
    return not steps or min(steps) < before


def _lock(root: str) -> FileLock | None:
    """The writer's lock of the left tier ``root``; ``None`` where another process holds it or it cannot be taken."""

    def held(holder: Holder | None) -> CheckpointError:
        return CheckpointError(f"{root} is in use ({holder.describe() if holder else 'by another process'})")

    try:
        return FileLock(os.path.join(root, LOCK_NAME), held, of=root)
    except CheckpointError:  # a live process's own tier, or one another process prunes now
        return None
    except StorageError as error:
        logger.warning("%s: a tier left here is not pruned (delete its old steps by hand): %s", root, error)
        return None


def _emptied(root: str) -> bool:
    """Remove the emptied folders of copies of the left tier ``root``, then its record if it holds nothing more;
    whether it held nothing more."""
    copies = os.path.join(root, COPIES)
    for name in _listed(copies):
        with contextlib.suppress(OSError):  # one that holds something stays
            os.rmdir(os.path.join(copies, name))
    with contextlib.suppress(OSError):
        os.rmdir(copies)
    if set(_listed(root)) - {OWNER_NAME, LOCK_NAME}:
        return False
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(root, OWNER_NAME))
    return True


def _listed(folder: str) -> list[str]:
    """The names in ``folder``; none where it is not there."""
    try:
        return sorted(os.listdir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as error:
        raise storage_error(error, folder, doing="list it") from error
