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
from jaxstow.checkpoint.tiers import Tiers
from jaxstow.errors import FormatError

__all__ = ["copies_of", "restore_intact_copy"]

logger = logging.getLogger("jaxstow.checkpoint.manager")
T = TypeVar("T")


def copies_of(step: int, persistent: StepFolder, tiers: Tiers) -> list[StepFolder]:
    """The folders that hold ``step`` in one process, the local tier's first (the faster read)."""
    held = [tiers.folder] if step in tiers.steps() else []
    return held + ([persistent] if step in persistent.committed() else [])


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
