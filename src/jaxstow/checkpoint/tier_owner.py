"""Whose steps a local tier holds: the persistent directory of the run that first wrote it, kept in a small file
beside the steps.

A local tier's directory is often a fixed path in a cluster's job settings (``/mnt/ssd/checkpoints``), the same for
every run. A manager whose persistent directory is not the one a local tier was first written for refuses the tier,
naming both, rather than restore the other run's steps or take them for its own progress. A tier written before it
held this file is taken as this run's; so is one moved or copied together with its persistent directory (the record
holds the path from one to the other too). Once one of its steps reached the persistent directory, the record says
so: a tier whose run's persistent directory has since lost every step (deleted, and a new run started at its path)
is refused too, rather than resumed as the new run's.

>>> import os, tempfile
>>> from jaxstow.checkpoint.tier_owner import check_owner, claim
>>> local = tempfile.mkdtemp()
>>> claim(local, "/runs/a")
>>> check_owner(local, "/runs/a")  # the same run: nothing to say
>>> check_owner(local, "/runs/b")
Traceback (most recent call last):
...
jaxstow.errors.CheckpointError: the local tier ... holds the steps of the run saved to /runs/a, not to /runs/b: ...
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from jaxstow._steps.names import StepNames
from jaxstow._steps.record import RECORD_NAME
from jaxstow._storage.atomic import atomic_write
from jaxstow._storage.failures import storage_failures
from jaxstow._storage.folders import LocalStore
from jaxstow.errors import CheckpointError, CorruptFileError

__all__ = ["OWNER_NAME", "check_not_stale", "check_owner", "claim", "mark_copied", "owned_by", "run_identity"]

#: The file in a local tier's directory that names the persistent directory whose run wrote the tier.
OWNER_NAME = ".jaxstow-tier.json"
_KEYS = ("persistent", "from_tier")
#: The key of the record that says a step of the tier's run reached its persistent directory.
_COPIED = "copied"


def run_identity(location: str) -> str:
    """The persistent directory as a run is told by: a URL as it is, a local path with its links resolved."""
    return location if "://" in location else os.path.realpath(location)


def _record(root: str, persistent: str) -> dict[str, Any]:
    """What the local tier ``root`` records of the run saved to ``persistent``: the directory, and a local one's path
    from ``root`` too, which still leads there once both folders were moved or copied together."""
    if "://" in persistent:
        return {"persistent": persistent}
    return {"persistent": persistent, "from_tier": os.path.relpath(persistent, root)}


def _owner(root: str) -> dict[str, Any] | None:
    """The record of the run whose steps the local tier ``root`` holds; ``None`` when it has none."""
    path = os.path.join(root, OWNER_NAME)
    try:
        with storage_failures(path, doing="read it"), open(path, "rb") as file:
            text = file.read()
    except FileNotFoundError:
        return None
    try:
        record = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested past what Python's parser goes down
        record = None
    if not isinstance(record, dict) or not all(isinstance(record.get(key, ""), str) for key in _KEYS):
        record = None
    if record is not None and not isinstance(record.get(_COPIED, False), bool):
        record = None
    if record is None or not isinstance(record.get("persistent"), str):
        raise CorruptFileError(
            "is not the record of a local tier's run (a JSON object with a string 'persistent'): delete it, with the "
            "steps beside it if they are not this run's",
            file=path,
        )
    return {key: record[key] for key in (*_KEYS, _COPIED) if key in record}


def _is_owner(root: str, owner: dict[str, Any], persistent: str) -> bool:
    if owner["persistent"] == persistent:
        return True
    relative = owner.get("from_tier")
    return relative is not None and "://" not in persistent and run_identity(os.path.join(root, relative)) == persistent


def check_owner(root: str, persistent: str) -> None:
    """Refuse the local tier ``root`` if another run's persistent directory wrote it.

    Raises:
        CheckpointError: ``root`` holds the steps of the run saved to another persistent directory.
        CorruptFileError: Its record is not one.
    """
    owner = _owner(root)
    if owner is not None and not _is_owner(root, owner, persistent):
        lost = _only_here(root, persistent)
        moved = (
            f"; deleting it loses steps {lost}, which {persistent} does not hold: if that is the run's directory "
            f"moved, move it back to {owner['persistent']} to resume from them"
            if lost
            else " (or if its persistent directory was moved: its steps are there)"
        )
        raise CheckpointError(
            f"the local tier {root} holds the steps of the run saved to {owner['persistent']}, not to {persistent}: "
            f"give each run a local directory of its own, or delete {root} if that run is over{moved}"
        )


def _only_here(root: str, persistent: str) -> list[int]:
    """The steps of the local tier ``root`` that the local directory ``persistent`` does not hold (for a URL: all)."""
    steps = StepNames("%d").steps(LocalStore(root, marker=RECORD_NAME).committed())
    if "://" in persistent:
        return steps
    return [step for step in steps if not os.path.isfile(os.path.join(persistent, str(step), RECORD_NAME))]


def owned_by(root: str, persistent: str) -> bool:
    """Whether the local tier ``root`` records that the run saved to ``persistent`` wrote it (``False`` for a tier
    without a record, or with a corrupt one: its steps are not known to be that run's)."""
    try:
        owner = _owner(root)
    except CorruptFileError:
        return False
    return owner is not None and _is_owner(root, owner, persistent)


def check_not_stale(root: str, persistent: str, persistent_steps: Callable[[], list[int]], has_steps: bool) -> None:
    """Refuse the local tier ``root`` if its run copied steps to ``persistent``, which now holds none.

    ``persistent_steps()`` lists them, called only when ``has_steps`` (the tier holds steps) and the record says a
    step was copied.

    Raises:
        CheckpointError: The tier's steps are those of an earlier run whose persistent directory was emptied.
    """
    owner = _owner(root)
    if not (has_steps and owner is not None and owner.get(_COPIED)) or persistent_steps():
        return
    raise CheckpointError(
        f"the local tier {root} holds the steps of an earlier run saved to {persistent}, which has lost every step "
        f"since (deleted, and a run started again at its path?): delete {root} to start afresh, or, to go on from "
        f"the tier's steps, delete {os.path.join(root, OWNER_NAME)}"
    )


def claim(root: str, persistent: str) -> None:
    """Record in the local tier ``root`` that its steps are those of the run saved to ``persistent``."""
    record = _record(root, persistent)
    owner = _owner(root)
    if owner is not None and owner.get(_COPIED):
        record[_COPIED] = True
    if owner != record:
        _write(root, record)


def mark_copied(root: str, persistent: str, *, copied: bool = True) -> None:
    """Record in the local tier ``root`` that a step of its run reached ``persistent`` (once), or, ``copied=False``,
    that its manager deleted the last step there: its steps are then this run's as before any step was copied."""
    owner = _owner(root)
    if owner is None or bool(owner.get(_COPIED)) != copied:
        _write(root, {**_record(root, persistent), **({_COPIED: True} if copied else {})})


def _write(root: str, record: dict[str, Any]) -> None:
    os.makedirs(root, exist_ok=True)
    with atomic_write(os.path.join(root, OWNER_NAME)) as file:
        file.write(json.dumps(record).encode())
