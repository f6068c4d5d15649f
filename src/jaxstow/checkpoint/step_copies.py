"""The copies of a step in one process with a local tier: the local tier's, and the persistent directory's where it
holds the step too. A restore reads the first copy that is intact (a damaged local copy does not hide an intact
persistent one), and a query of damage checks every copy (a damaged persistent copy is what a new host would read).

>>> import tempfile, numpy as np
>>> from jaxstow import CheckpointManager, LocalTier
>>> persistent, local = tempfile.mkdtemp(), tempfile.mkdtemp()
>>> with CheckpointManager(persistent, local=LocalTier(local)) as manager:
...     manager.save(1, {"w": np.ones(2)})
...     manager.wait()
...     [folder.store.location == local for folder in copies_of(1, manager._folder, manager._tiers)]
[True, False]
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from jaxstow.checkpoint.step_folder import StepFolder
from jaxstow.checkpoint.tier_holdings import version_of
from jaxstow.checkpoint.tiers import Tiers
from jaxstow.errors import FormatError

__all__ = ["copies_of", "newer_save", "restore_intact_copy"]

logger = logging.getLogger("jaxstow.checkpoint.manager")
T = TypeVar("T")


def copies_of(step: int, persistent: StepFolder, tiers: Tiers) -> list[StepFolder]:
    """The folders that hold ``step``'s latest save in one process, the local tier's first (the faster read): where
    the two hold other saves of it (one replaced it with ``force=True``, or a run on another host saved it again),
    only the one saved last, whose values are the step's."""
    held = [tiers.folder] if step in tiers.steps() else []
    if step not in persistent.committed():
        return held
    if held and (newer := newer_save(step, tiers.folder, persistent)) is not None:
        return [newer]
    return [*held, persistent]


def newer_save(step: int, local: StepFolder, persistent: StepFolder) -> StepFolder | None:
    """Of two folders holding ``step``, the one holding its later save where they hold other saves of it (by their
    records' times; the local one where those are equal); ``None`` where they hold the same save, or a record of
    either cannot be read (reading it says why)."""
    mine, kept = local.unchecked_record(step), persistent.unchecked_record(step)
    if mine is None or kept is None or version_of(mine) == version_of(kept):
        return None
    return local if mine.time >= kept.time else persistent


def restore_intact_copy(step: int, copies: list[StepFolder], restore: Callable[[int, StepFolder], T]) -> T:
    """``restore(step, folder)`` of the first of ``copies`` whose data is intact: the damage of each copy passed over
    is logged as a warning; the last copy's damage is raised."""
    *others, last = copies
    for number, folder in enumerate(others):
        try:
            return restore(step, folder)
        except FormatError as error:  # damage its checksums found
            where = copies[number + 1].store.location
            logger.warning("%s: step %d is damaged there, read from %s: %s", folder.store.location, step, where, error)
    return restore(step, last)
