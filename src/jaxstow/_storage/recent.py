"""The folders a :class:`~jaxstow._storage.remote_store.RemoteStore` committed, deleted or started last, kept in one
object at its root (:data:`RECENT`) that is read by key: what a listing that lags shows wrongly for a while.

A store may list a new object seconds after it holds it, and a deleted one for seconds after; an object asked for by
key is as the store holds it. The writer (the lock's holder) notes each folder it commits or deletes, after doing
so, and each new one before writing to it; a listing is then taken as it is for every folder but those it disagrees
with the note about, whose marker is asked for by key. So a folder committed a moment ago is found, one deleted a
moment ago is not, by any process, and the next writer finds the folders a killed one left unfinished.

>>> import fsspec, jaxstow
>>> fs, where = fsspec.filesystem("memory"), {"url": "memory://recent-doc", "transfer": jaxstow.Transfer()}
>>> note_change(fs, "/recent-doc/.jaxstow-recent.json", "2", COMMITTED, **where)
>>> note_change(fs, "/recent-doc/.jaxstow-recent.json", "1", DELETED, **where)
>>> changes = recent_changes(fs, "/recent-doc/.jaxstow-recent.json", **where)
>>> reconciled(["1"], changes, holds=lambda name: name == "2")
['2']
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from typing import Any

from jaxstow._storage.member_names import check_member_name
from jaxstow._storage.remote import storage_errors
from jaxstow._storage.small_reads import read_small
from jaxstow._storage.transfer import Transfer
from jaxstow.errors import StorageError

__all__ = ["COMMITTED", "DELETED", "RECENT", "WRITTEN", "Change", "note_change", "reconciled", "recent_changes"]

#: The object at a store's root that names the folders committed, deleted or started last.
RECENT = ".jaxstow-recent.json"

#: What became of a folder: committed (``true``), deleted (``false``), or started, being written (``null``).
Change = bool | None
COMMITTED: Change = True
DELETED: Change = False
WRITTEN: Change = None

#: The changes it keeps, the newest: far more than a store's listings lag behind.
_KEPT = 256

logger = logging.getLogger("jaxstow.storage")


def recent_changes(fs: Any, path: str, *, url: str, transfer: Transfer) -> dict[str, Change]:
    """The folders changed last, oldest first, each with its :data:`Change`; none where there is no such object (a
    store no writer of this version wrote) or it cannot be read as one (logged: the listing decides alone then). It
    is read under ``transfer``'s retry policy."""
    with storage_errors(url):
        try:
            data = read_small(fs, path, url=url, transfer=transfer)
        except FileNotFoundError:
            return {}
    try:
        changes = json.loads(data)["changes"]
        return {check_member_name(name, file=url): None if change is None else bool(change) for name, change in changes}
    except (ValueError, RecursionError, KeyError, TypeError) as error:  # a FormatError is a ValueError
        logger.warning("%s: not a list of changes (%s); the listing alone is read", url, error)
        return {}


def note_change(fs: Any, path: str, name: str, change: Change, *, url: str, transfer: Transfer) -> None:
    """Note that folder ``name`` was committed, deleted or started just now.

    A folder to be started is not where this fails (its :class:`StorageError` is raised). A commit or deletion made
    stays made: a failure to note it is logged, and other processes find the folder as their listing shows it.
    """
    try:
        changes = recent_changes(fs, path, url=url, transfer=transfer)
        changes.pop(name, None)
        changes[name] = change
        kept = list(changes.items())[-_KEPT:]
        with storage_errors(url):
            fs.pipe_file(path, json.dumps({"changes": kept}).encode())
    except StorageError as error:
        if change is WRITTEN:
            raise
        done = "committed" if change else "deleted"
        logger.warning(
            "%s: %s is %s, but noting so failed (other processes may see it late): %s", url, name, done, error
        )


def reconciled(listed: Iterable[str], changes: dict[str, Change], *, holds: Callable[[str], bool]) -> list[str]:
    """The committed folders: those ``listed`` and those ``changes`` says were committed, where they agree; where they
    do not, those whose marker the store ``holds``, asked for by key."""
    shown = set(listed)
    disputed = {name for name, change in changes.items() if (change is COMMITTED) != (name in shown)}
    return sorted({name for name in shown - disputed} | {name for name in disputed if holds(name)})
