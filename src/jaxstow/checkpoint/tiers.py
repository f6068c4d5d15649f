"""The local tier of a :class:`~jaxstow.CheckpointManager` given ``local_directory``: each process's fast storage.

Every step saved goes to the local tier first (each process writes its own files and commits its own folder with the
step's record); peers keep copies of each process's files (:mod:`jaxstow.checkpoint.peer_copies`); a step due in the
persistent ``directory`` is copied there from the local tier's files in the background, never from the devices
again. Restoring picks the newest step held in full anywhere (:mod:`jaxstow.checkpoint.tier_restore`). See
docs/scaling.md ("Two tiers and peers").
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
from collections.abc import Callable
from typing import Any, Literal

from jaxstow._steps.names import StepNames
from jaxstow._steps.record import RECORD_NAME, StepRecord
from jaxstow._storage.folders import LocalStore
from jaxstow._storage.lock import Lock, lock_store
from jaxstow._storage.paths import local_path
from jaxstow._storage.store import Store
from jaxstow._write.background import BackgroundWriter
from jaxstow._write.save_report import SaveReport
from jaxstow.checkpoint.peer_copies import PeerCopies, files_of
from jaxstow.checkpoint.processes import Processes
from jaxstow.checkpoint.schedule import SaveSchedule
from jaxstow.checkpoint.shared import _write_files, record_of
from jaxstow.checkpoint.step_folder import StepFolder
from jaxstow.checkpoint.writing import EXTENSION, StepContent, write_step
from jaxstow.errors import ArgumentError, CheckpointError

__all__ = ["Tier", "Tiers", "local_tier"]

logger = logging.getLogger("jaxstow.checkpoint.manager")
Tier = Literal["local", "persistent"]
_COPY_CHUNK = 16 << 20


def local_tier(
    local_directory: str | os.PathLike[str] | None,
    processes: Processes,
    *,
    directory: str,
    save_every: int | None,
    keep_last: int | None,
    replicas: int | None,
    progress: bool,
) -> Tiers | None:
    """The local tier of the manager of ``directory`` given ``local_directory`` and its options (``None``: their
    defaults), or ``None`` without one; an option of the local tier given without ``local_directory`` is an
    :class:`~jaxstow.errors.ArgumentError` naming it, never ignored.

    >>> from jaxstow.checkpoint.processes import Processes
    >>> processes = Processes("run", timeout=60)
    >>> local_tier(None, processes, directory="run", save_every=5, keep_last=None, replicas=None, progress=False)
    Traceback (most recent call last):
    ...
    jaxstow.errors.ArgumentError: local_save_every=5 sets the local tier, but the manager of run has no local_directory: ...
    """
    if local_directory is None:
        options = {"local_save_every": save_every, "local_keep_last": keep_last, "local_replicas": replicas}
        given = " and ".join(f"{name}={value!r}" for name, value in options.items() if value is not None)
        if given:
            raise ArgumentError(
                f"{given} {'set' if ' and ' in given else 'sets'} the local tier, but the manager of {directory} has "
                "no local_directory: pass local_directory=... (each process's fast storage, such as a local SSD) "
                f"to save there too, or leave {given} out (save_every is the schedule of {directory} itself)"
            )
        return None
    return Tiers(
        local_directory,
        processes,
        directory=directory,
        save_every=1 if save_every is None else save_every,
        keep_last=2 if keep_last is None else keep_last,
        replicas=replicas,
        progress=progress,
    )


class Tiers:
    """The local tier of one manager in this process, its peers' copies and its copies to the persistent store."""

    def __init__(
        self,
        local_directory: str | os.PathLike[str],
        processes: Processes,
        *,
        directory: str,
        save_every: int,
        keep_last: int,
        replicas: int | None,
        progress: bool,
    ) -> None:
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
            raise ArgumentError(f"local_keep_last must be a positive integer, not {keep_last!r}")
        if replicas is not None and (isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0):
            raise ArgumentError(f"local_replicas must be a non-negative integer, not {replicas!r}")
        root = local_path(local_directory)
        if root is None:
            raise ArgumentError(f"local_directory must be a local path, not {local_directory!r}")
        # Under jax.distributed each process keeps its tier in a folder of its own, so that processes of one host
        # may share one local_directory.
        root = os.path.abspath(root)
        if processes.many:
            root = os.path.join(root, f"process-{processes.index}")
        self.store = LocalStore(root, marker=RECORD_NAME)
        self.names = StepNames("%d")
        self.folder = StepFolder(self.store, self.names)
        self.schedule = SaveSchedule(save_every, option="local_save_every")
        self.keep_last = keep_last
        self.processes = processes
        self.progress = progress
        self.uploads = BackgroundWriter(asynchronous=True)
        self._uploading: set[int] = set()
        self._pruning = threading.Lock()
        self._lock: Lock | None = None
        replicas = (1 if processes.many else 0) if replicas is None else replicas
        self.peers: PeerCopies | None = None
        if processes.many:
            name = f"tiers/{hashlib.sha256(directory.encode()).hexdigest()[:16]}/{processes.next_exchange('peers')}"
            self.peers = PeerCopies(processes, self.store, replicas=replicas, name=name)

    @property
    def directory(self) -> str:
        return self.store.root

    def steps(self) -> list[int]:
        """The steps committed in this process's local tier (its own files and the record)."""
        return self.folder.committed()

    def save(
        self, content: StepContent, *, key: str, persistent: Callable[[StepRecord], None] | None, keep: dict[str, Any]
    ) -> None:
        """Write ``content`` as a local step, hand its record to ``persistent`` (the copy to ``directory``, run on the
        upload thread) when the step is due there, send copies to the peers and prune the local tier."""
        if self._lock is None:
            self._lock = lock_store(self.store)
            self.store.cleanup(lambda name: self.names.step(name) is not None)
        step = content.step
        replace = step in self.steps()
        if self.processes.many:
            record = self._write_shared(content, key=key, replace=replace, keep=keep)
        else:
            record = write_step(
                self.store, self.names.name(step), content, replace=replace, keep_policy=keep, progress=self.progress
            )
        if persistent is not None:
            self.uploads.wait()  # one copy in flight at a time, in the same order in every process
            self._uploading.add(step)

            def upload() -> None:
                try:
                    persistent(record)
                finally:
                    self._uploading.discard(step)
                    self._prune()

            self.uploads.submit(upload, what=f"copying step {step} from {self.directory}")
        if self.peers is not None:
            self.peers.exchange(record, keep_last=self.keep_last)
        self._prune()

    def _write_shared(self, content: StepContent, *, key: str, replace: bool, keep: dict[str, Any]) -> StepRecord:
        """Every process writes its files into its own local folder; process 0 checks that all saved the same step
        of the same tree and sends the record, which each process commits its folder with."""
        processes, step = self.processes, content.step
        where = self.store.url(self.names.name(step))
        staging = self.store.stage(self.names.name(step), replace=replace)
        try:
            report = SaveReport(f"step {step} of {self.directory}", total=0, bar=self.progress)
            summary = _write_files(staging, processes.index, step, content.held, EXTENSION, report)
        except BaseException as error:
            staging.abort()
            processes.send(f"{key}/done/{processes.index}", json.dumps({"error": f"{type(error).__name__}: {error}"}))
            raise
        processes.send(f"{key}/done/{processes.index}", json.dumps(summary))
        if processes.index == 0:
            try:
                reports = processes.gather(
                    {k: f"{key}/done/{k}" for k in processes.others}, what=f"its local files of step {step}"
                )
                record = record_of(
                    processes,
                    summary,
                    reports,
                    step,
                    content.single,
                    content.metrics,
                    content.metadata,
                    keep,
                    where=where,
                )
                message = record.to_json().decode()
            except BaseException as error:
                message = json.dumps({"error": str(error)})
            processes.send(f"{key}/record", message)
        else:
            message = processes.receive(
                f"{key}/record", sender=0, what=f"the record of local step {step}", timeout=processes.timeout * 2
            )
        if message.startswith('{"error"'):
            staging.abort()
            raise CheckpointError(f"local step {step} is not committed: {json.loads(message)['error']}", file=where)
        staging.commit(message.encode())
        return StepRecord.from_json(message.encode(), where=where)

    def copy_to(self, store: Store, record: StepRecord, *, key: str) -> StepRecord | None:
        """Copy this process's local files of ``record``'s step into ``store``; process 0 commits the step there
        with the same record once every process copied its own, and returns it."""
        processes, step = self.processes, record.step
        folder = self.names.name(step)
        where = store.url(folder)
        if processes.index == 0:
            staging = store.stage(folder, replace=False)
            if processes.many:
                processes.send(f"{key}/staging", staging.token)
        else:
            token = processes.receive(f"{key}/staging", sender=0, what=f"the folder of step {step} ({where})")
            staging = store.stage(folder, replace=False, token=token)
        me = processes.index
        try:
            for file in files_of(record, me) if processes.many else _all_files(record):
                with open(self.store.path(folder, file), "rb") as source, staging.open(file) as (stored, sink):
                    if stored != file:
                        raise CheckpointError(f"{where} stores {file} as {stored}", file=where)
                    shutil.copyfileobj(source, sink, _COPY_CHUNK)
            staging.complete()
        except BaseException as error:
            staging.abort()
            if processes.many:
                problem = f"process {me} failed: {type(error).__name__}: {error}"
                processes.send(f"{key}/done/{me}", problem)
                if me == 0:
                    processes.send(f"{key}/outcome", problem)
            raise
        if not processes.many:
            staging.commit(record.to_json())
            return record
        processes.send(f"{key}/done/{me}", "ok")
        if me != 0:
            verdict = processes.receive(
                f"{key}/outcome", sender=0, what=f"the commit of step {step} ({where})", timeout=processes.timeout * 2
            )
            if verdict != "committed":
                raise CheckpointError(f"step {step} was not copied: {verdict}", file=where)
            return None
        try:
            reports = processes.gather({k: f"{key}/done/{k}" for k in processes.others}, what=f"its copy of {step}")
            failed = [report for report in reports.values() if report != "ok"]
            if failed:
                raise CheckpointError(f"step {step} was not copied: {'; '.join(failed)}", file=where)
            staging.commit(record.to_json())
        except BaseException as error:
            staging.abort()
            processes.send(f"{key}/outcome", str(error))
            raise
        processes.send(f"{key}/outcome", "committed")
        return record

    def _prune(self) -> None:
        """Delete the local steps older than the newest ``local_keep_last``, but for one being copied (it goes once
        copied)."""
        with self._pruning:
            steps = self.steps()
            for step in steps[: -self.keep_last]:
                if step not in self._uploading:
                    self.store.delete(self.names.name(step))
                    logger.info("%s: deleted local step %d (local_keep_last)", self.directory, step)

    def close(self) -> None:
        """Finish the copy in flight (raising its error) and stop the transport."""
        try:
            self.uploads.close()
        finally:
            if self.peers is not None:
                self.peers.close()
            if self._lock is not None:
                self._lock.release()
                self._lock = None


def _all_files(record: StepRecord) -> list[str]:
    return [file for item in sorted(record.files) for file in record.item_files(item)]
