"""Which processes' files of which local steps this process holds, and where: its own local tier, the copies it keeps
of its peers' files, and the tiers other processes of the run left in its local directory.

Under ``jax.distributed`` each process keeps its tier in ``LOCAL_DIRECTORY/process-{index}``. After a restart on
other hosts, a process may find there the folder of another rank (``process-1`` beside its own ``process-0``): those
files, and the copies that folder keeps, are held too, and restored from, as a peer's copies are; they are read,
and written only to delete a step the run deletes or prunes (:mod:`jaxstow.checkpoint.left_pruning`). Each held
step is known by whose files it holds (the folder it is in: ``process-{k}`` or ``peer-copies/p{k}``, every one of
the files the record lists for that process present) and by its record's version (the save it belongs to), so a
restore never takes one process's files for another's, nor mixes two saves of one step. See docs/scaling.md ("Two tiers and peers").
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Callable, Container

from jaxstow._format.checksum import checksum_bytes
from jaxstow._steps.names import StepNames
from jaxstow._steps.record import RECORD_NAME, StepRecord
from jaxstow._storage.folders import LocalStore
from jaxstow.checkpoint.tier_owner import check_not_stale, owned_by
from jaxstow.errors import CheckpointError, JaxstowError

__all__ = ["COPIES", "Holdings", "files_of", "version_of"]

logger = logging.getLogger("jaxstow.checkpoint.manager")
#: The folder of a local directory that holds other processes' files.
COPIES = "peer-copies"
_TIER = re.compile(r"process-([0-9]+)")


def files_of(record: StepRecord, process: int) -> list[str]:
    """The files ``process`` wrote of the step ``record`` describes."""
    return [record.item_files(item)[process] for item in sorted(record.files)]


def version_of(record: StepRecord) -> str:
    """The save ``record`` is the record of: the same in every folder holding that save's files."""
    return checksum_bytes(record.to_json())


class Holdings:
    """The folders of process ``me``'s local directory (its tier ``local``, in ``process-{me}``) that hold files of
    local steps, for a run of ``count`` processes."""

    def __init__(self, local: LocalStore, me: int, count: int) -> None:
        self.local, self.me, self.count = local, me, count
        self.names = StepNames("%d")
        self.left: dict[int, str] = {}  # the tiers other processes left in the local directory, by process
        self._found: dict[tuple[int, int, str], str] = {}  # (owner, step, version): the folder, at the last inventory

    def copies(self, owner: int) -> LocalStore:
        """The copies this process keeps of ``owner``'s files, one committed folder per step."""
        return LocalStore(os.path.join(self.local.root, COPIES, f"p{owner}"), marker=RECORD_NAME)

    def find_left(self, run: str, persistent_steps: Callable[[], list[int]]) -> None:
        """Find the tiers other processes of the run saved to ``run`` left beside this process's own; one whose run
        copied steps to ``run``, which holds none now, is refused as this process's own would be."""
        parent = os.path.dirname(self.local.root)
        try:
            names = sorted(os.listdir(parent))
        except OSError:
            names = []
        for name in names:
            match = _TIER.fullmatch(name)
            root = os.path.join(parent, name)
            if match is None or int(match[1]) in (self.me, *self.left) or not owned_by(root, run):
                continue
            held = LocalStore(root, marker=RECORD_NAME).committed()
            check_not_stale(root, run, persistent_steps, has_steps=bool(self.names.steps(held)))
            self.left[int(match[1])] = root

    def stores(self, owner: int) -> list[LocalStore]:
        """Where this process may hold ``owner``'s files: its own tier, or the copies it keeps, then the tiers left."""
        first = self.local if owner == self.me else self.copies(owner)
        return [first] + [
            LocalStore(root if process == owner else os.path.join(root, COPIES, f"p{owner}"), marker=RECORD_NAME)
            for process, root in sorted(self.left.items())
        ]

    def delete(self, step: int) -> None:
        """Delete ``step``, which the run deletes, from the tiers left in the local directory (where another process
        deletes it at the same moment, it is gone once)."""
        folder = self.names.name(step)
        left = {store.root: store for owner in range(self.count) for store in self.stores(owner)[1:]}
        for store in left.values():
            if folder in store.committed():
                with contextlib.suppress(FileNotFoundError):
                    store.delete(folder)

    def inventory(self, bound: int | None, damaged: Container[str] = ()) -> dict[str, list[list[object]]]:
        """For each process whose files this process holds, ``[step, version, time]`` of each step it holds (at most
        ``bound``) in full: every file the step's record lists for that process; a folder in ``damaged`` (found so by
        the restore under way) holds none.

        Raises:
            CheckpointError: This process's own tier holds a step without its files (another process's folder
                moved here, or a damaged step): the message says which.
        """
        found: dict[tuple[int, int, str], str] = {}
        held: dict[str, list[list[object]]] = {}
        for owner in range(self.count):
            for store in self.stores(owner):
                for step in self.names.steps(store.committed()):
                    if (bound is not None and step > bound) or store.path(self.names.name(step)) in damaged:
                        continue
                    record = self._holds(store, owner, step)
                    if isinstance(record, str):
                        logger.warning("%s: not restored from: %s", store.url(self.names.name(step)), record)
                    elif record is not None and (owner, step, version := version_of(record)) not in found:
                        found[owner, step, version] = store.path(self.names.name(step))
                        held.setdefault(str(owner), []).append([step, version, record.time])
        self._found = found
        return held

    def left_held(self) -> dict[int, LocalStore]:
        """The steps of which the tiers left in the local directory hold some process's files in full, as
        :meth:`inventory` counts them, each with the first folder holding it."""
        held: dict[int, LocalStore] = {}
        for owner in range(self.count):
            for store in self.stores(owner)[1:]:
                for step in self.names.steps(store.committed()):
                    if step not in held and isinstance(self._holds(store, owner, step), StepRecord):
                        held[step] = store
        return held

    def _holds(self, store: LocalStore, owner: int, step: int) -> StepRecord | str | None:
        """The record of ``step`` in ``store`` if its folder holds every file of ``owner``'s, else why not (``None``:
        saved by a run of another size, which the persistent tier restores)."""
        folder = self.names.name(step)
        try:
            record = StepRecord.from_json(store.read_marker(folder), where=store.url(folder, RECORD_NAME))
        except JaxstowError as error:
            return str(error)
        if _processes(record) != self.count:
            return None
        missing = _missing(store, folder, record, owner)
        if not missing:
            return record
        moved = [k for k in range(_processes(record)) if k != owner and not _missing(store, folder, record, k)]
        if moved and store is self.local:
            raise CheckpointError(
                f"{store.url(folder)} is step {step} of process {owner}'s local tier, but holds process {moved[0]}'s "
                f"files instead of its own ({', '.join(missing)}): is {store.location} the tier of process "
                f"{moved[0]}, renamed? rename it back to process-{moved[0]} (a process restores from the tiers other "
                "processes left in its local directory too)",
                file=store.url(folder),
            )
        return f"it lacks {', '.join(missing)}"

    def locate(self, owner: int, step: int, file: str, version: str) -> str:
        """Where this process holds ``owner``'s ``file`` of ``step`` as saved by ``version``, as the last inventory
        found it; a FileNotFoundError where it holds none."""
        folder = self._found.get((owner, step, version))
        if folder is None:
            raise FileNotFoundError(f"process {self.me} holds no files of process {owner}'s step {step} ({version})")
        return os.path.join(folder, file)

    def holds_own(self, step: int, version: str) -> bool:
        """Whether this process's own tier holds its files of ``step`` as saved by ``version``."""
        return self._found.get((self.me, step, version)) == self.local.path(self.names.name(step))

    def restored(self, step: int, version: str) -> None:
        """Note this process's own files of ``step`` as saved by ``version`` committed to its own tier."""
        self._found[self.me, step, version] = self.local.path(self.names.name(step))


def _processes(record: StepRecord) -> int:
    """How many processes saved the step ``record`` describes."""
    return max((len(record.item_files(item)) for item in record.files), default=0)


def _missing(store: LocalStore, folder: str, record: StepRecord, process: int) -> list[str]:
    """The files of ``process``'s that ``record`` lists and ``folder`` of ``store`` lacks."""
    return [file for file in files_of(record, process) if not os.path.isfile(store.path(folder, file))]
