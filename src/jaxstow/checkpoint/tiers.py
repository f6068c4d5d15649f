"""The local tier of a :class:`~jaxstow.CheckpointManager` given ``local=LocalTier(...)``: each process's fast storage.

Every step saved goes to the local tier first (each process writes its own files and commits its own folder with the
record process 0 made, :func:`~jaxstow.checkpoint.shared.commit_step`); peers keep copies of each process's files
(:mod:`jaxstow.checkpoint.peer_copies`); a step due in the persistent ``directory`` is copied there from the local
tier's files in the background, never from the devices again, and committed there by process 0 once every process
copied its own. Restoring picks the newest step held in full anywhere (:mod:`jaxstow.checkpoint.tier_restore`). See
docs/scaling.md ("Two tiers and peers").
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from typing import Literal

from jaxstow._coordination import Conversation, Coordinator
from jaxstow._steps.names import StepNames
from jaxstow._steps.record import RECORD_NAME, StepRecord
from jaxstow._storage.folders import LocalStore
from jaxstow._storage.lock import Lock, lock_store
from jaxstow._storage.store import Staging, Store
from jaxstow._write.background import BackgroundWriter
from jaxstow.checkpoint.left_pruning import prune_left
from jaxstow.checkpoint.peer_copies import PeerCopies
from jaxstow.checkpoint.schedule import SaveSchedule
from jaxstow.checkpoint.settings import LocalTier
from jaxstow.checkpoint.shared import Committed, commit_content, commit_step
from jaxstow.checkpoint.step_folder import StepFolder
from jaxstow.checkpoint.tier_holdings import Holdings, files_of
from jaxstow.checkpoint.tier_owner import check_not_stale, check_owner, claim, mark_copied, run_identity
from jaxstow.checkpoint.writing import StepContent
from jaxstow.errors import CheckpointError

__all__ = ["Tier", "Tiers"]

logger = logging.getLogger("jaxstow.checkpoint.manager")
Tier = Literal["local", "persistent"]
_COPY_CHUNK = 16 << 20


class Tiers:
    """The local tier of one manager in this process, its peers' copies and its copies to the persistent store;
    ``coordinator`` is the manager's, whose processes save together."""

    def __init__(self, settings: LocalTier, coordinator: Coordinator, *, directory: str, progress: bool) -> None:
        root = settings.root
        # Under jax.distributed each process keeps its tier in a folder of its own, so that processes of one host
        # may share one directory.
        if coordinator.many:
            root = os.path.join(root, f"process-{coordinator.index}")
        self.run = run_identity(directory)
        check_owner(root, self.run)
        self.store = LocalStore(root, marker=RECORD_NAME)
        self.names = StepNames("%d")
        self.folder = StepFolder(self.store, self.names)
        self.schedule = SaveSchedule(settings.save_every, option="LocalTier's save_every")
        self.keep_last = settings.keep_last
        self.coordinator = coordinator
        self.progress = progress
        self.uploads = BackgroundWriter(asynchronous=True)
        self._uploading: set[int] = set()
        self._pruning = threading.Lock()
        self._lock: Lock | None = None
        self._copied = False  # a step of this manager's reached the persistent directory (and the record says so)
        self._exchanged = threading.Event()  # set once the step of the copy in flight is sent to the peers
        replicas = (1 if coordinator.many else 0) if settings.replicas is None else settings.replicas
        self.peers: PeerCopies | None = None
        self.holdings = Holdings(self.store, coordinator.index, coordinator.count)
        if coordinator.many:
            self.peers = PeerCopies(coordinator, self.holdings, replicas=replicas)

    @property
    def directory(self) -> str:
        return self.store.root

    def check_not_stale(self, persistent_steps: Callable[[], list[int]]) -> None:
        """Refuse this tier if it holds an earlier run's steps: copied to the persistent directory, which holds none
        now (see :func:`~jaxstow.checkpoint.tier_owner.check_not_stale`); find the tiers of this run other processes
        left beside it (:meth:`~jaxstow.checkpoint.tier_holdings.Holdings.find_left`), refusing them alike."""
        check_not_stale(self.store.root, self.run, persistent_steps, has_steps=bool(self.steps()))
        if self.coordinator.many:
            self.holdings.find_left(self.run, persistent_steps)

    def steps(self) -> list[int]:
        """The steps committed in this process's local tier (its own files and the record)."""
        return self.folder.committed()

    def held(self) -> dict[int, StepFolder]:
        """The local steps this process holds, each with the folder to read its record from: those of its local tier,
        then those the tiers other processes left in its local directory hold, as a restore counts them."""
        held = dict.fromkeys(self.steps(), self.folder)
        for step, store in self.holdings.left_held().items():
            held.setdefault(step, StepFolder(store, self.names))
        return held

    def held_steps(self) -> list[int]:
        """The steps of :meth:`held`, in increasing order."""
        return sorted(self.held())

    def save(
        self,
        content: StepContent,
        *,
        talk: Conversation,
        persistent: Callable[[StepRecord], None] | None,
        decided: Callable[[StepRecord], None],
    ) -> None:
        """Write ``content`` as a local step, every process together on ``talk`` (``decided`` hears that process 0
        decided it committed); hand its record to ``persistent`` (the copy to ``directory``, run on the upload
        thread) when the step is due there, send copies to the peers and prune the local tier."""
        self._take_lock()
        step = content.step
        folder, what = self.names.name(step), f"step {step} of {self.directory}"
        record = commit_content(
            talk, self.store, folder, content, what, self.progress, shared=False, replace=True, decided=decided
        ).record
        if persistent is not None:
            self.uploads.wait()  # one copy in flight at a time, in the same order in every process
            self._exchanged = threading.Event()
            self._uploading.add(step)

            def upload() -> None:
                try:
                    persistent(record)
                    if not self._copied:
                        mark_copied(self.store.root, self.run)
                        self._copied = True
                finally:
                    self._uploading.discard(step)
                    self._prune()

            self.uploads.submit(upload, what=f"copying step {step} from {self.directory}")
        try:
            if self.peers is not None:
                self.peers.exchange(record, keep_last=self.keep_last)
        finally:
            self._exchanged.set()
        self._prune()

    def copy_to(
        self,
        store: Store,
        record: StepRecord,
        *,
        talk: Conversation,
        decided: Callable[[StepRecord], None],
        after: Callable[[StepRecord], Iterator[int]],
        replace: bool = False,
    ) -> Committed:
        """Copy this process's local files of ``record``'s step into ``store``, every process together on ``talk``;
        process 0 commits the step there with the same record once every process copied its own (``decided``
        hears it; ``replace``: in place of the step there), then runs ``after`` (the keep policy).

        A replacing copy that fails (a full disk) deletes the step's new values from the local tiers too, once they
        are sent to the peers: the step keeps its old values in both tiers, as a failed save leaves a step."""
        step, me = record.step, self.coordinator.index
        folder = self.names.name(step)
        where = store.url(folder)

        def copy(staging: Staging) -> int:
            for file in files_of(record, me):
                with open(self.store.path(folder, file), "rb") as source, staging.open(file) as (stored, sink):
                    if stored != file:
                        raise CheckpointError(f"{where} stores {file} as {stored}", file=where)
                    shutil.copyfileobj(source, sink, _COPY_CHUNK)
            return step

        try:
            return commit_step(
                talk,
                store,
                folder,
                step,
                copy,
                lambda _: record,
                shared=True,
                replace=replace,
                decided=decided,
                after=after,
            )
        except BaseException:
            if replace:
                self._exchanged.wait()
                self.delete(step, last_persistent=False)
            raise

    def delete(self, step: int, *, last_persistent: bool) -> None:
        """Delete ``step`` from this process's local tier, the copies of other processes' files of it kept here, and
        the tiers other processes left here; ``last_persistent``: no other step is left in the persistent directory,
        so that the tier's steps are not taken for an earlier run's when the manager is opened again."""
        self._take_lock()
        folder = self.names.name(step)
        copies = [self.peers.store(owner) for owner in self.coordinator.others] if self.peers is not None else []
        with self._pruning:
            for store in [self.store, *copies]:
                if folder in store.committed():
                    store.delete(folder)
            self.holdings.delete(step)
        if last_persistent:
            mark_copied(self.store.root, self.run, copied=False)
            self._copied = False

    def _take_lock(self) -> None:
        if self._lock is None:
            self._lock = lock_store(self.store)
            claim(self.store.root, self.run)
            self.store.cleanup(lambda name: self.names.step(name) is not None)

    def _prune(self) -> None:
        """Delete the local steps older than the newest ``keep_last``, but for one being copied (it goes once
        copied); from the tiers other processes left in the local directory, those older than the newest
        ``keep_last`` that this process holds (:mod:`~jaxstow.checkpoint.left_pruning`)."""
        with self._pruning:
            steps = self.steps()
            for step in steps[: -self.keep_last]:
                if step not in self._uploading:
                    self.store.delete(self.names.name(step))
                    logger.info("%s: deleted local step %d (its keep_last)", self.directory, step)
            kept = self.held_steps()[-self.keep_last :] if self.holdings.left else []
            if kept:
                prune_left(self.holdings, kept[0])

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
