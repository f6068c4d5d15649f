"""Whether a copy of one process's files of a local step, taken from a tier another process left or from a peer, is
the one saved: each file's header checked against the step's record and every tensor of that process's against its
checksum, before the copy is committed into the process's own tier, so that a damaged copy is never committed; and,
once a restore met damage, which of the copies a process read from are damaged, so that the step is read again from
the other copies. See docs/scaling.md ("Two tiers and peers").
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable

from jaxstow._read.reader import open_parts
from jaxstow._read.verifying import verify_part
from jaxstow._steps.record import check_item_header
from jaxstow._storage.opening import open_source
from jaxstow.checkpoint.peer_reads import PeerStep
from jaxstow.checkpoint.recovery import described
from jaxstow.errors import FormatError

__all__ = ["copy_damage", "held_damage"]

logger = logging.getLogger("jaxstow.checkpoint.manager")


def copy_damage(step: PeerStep, process: int, copy: Callable[[str], str]) -> str | None:
    """Why the copy of ``process``'s files of ``step`` (each at ``copy(file)``) is not the one saved, or ``None``.
    The other processes' files are opened (their headers read) where ``step`` reads them, never read whole."""
    record = step.record
    for item in sorted(record.files):
        files = record.item_files(item)
        where = copy(files[process])
        try:
            own = open_source(where)
            try:
                check_item_header(record, item, files[process], own, where)
                sources = [own if k == process else step.source(step.name, file) for k, file in enumerate(files)]
            except BaseException:
                own.close()
                raise
            with open_parts(sources) as reader:
                damage = verify_part(reader, process)
        except FormatError as error:
            if error.file != where:  # another process's file: not this copy's damage
                raise
            return str(error)
        if damage:
            return described(damage)
    return None


def held_damage(step: PeerStep) -> dict[str, str]:
    """The damage of each folder holding a process's files of ``step`` that this process read them from (its own
    tier's, a peer's copy it keeps, a tier another process left here), by folder; each also named in a warning. Damage
    of another process's file, met opening this one's, is that process's to find."""
    found: dict[str, str] = {}
    for owner, folder in step.held().items():
        try:
            damage = copy_damage(step, owner, functools.partial(os.path.join, folder))
        except FormatError:
            continue
        if damage is not None:
            logger.warning(
                "%s: its copy of process %d's files of step %d is damaged, not restored from: %s",
                folder,
                owner,
                step.record.step,
                damage,
            )
            found[folder] = damage
    return found
