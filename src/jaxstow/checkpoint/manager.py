"""``CheckpointManager``: the numbered steps of a run, kept by policy, saved in the background, safe against crashes.

See docs/checkpointing.md; a step's folder and its ``checkpoint.json``: docs/format.md ("Checkpoint folders").
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Unpack

from jaxstow._coordination import Conversation, Coordinator
from jaxstow._read.options import LoadOptions
from jaxstow._steps.keep import KeepPolicy
from jaxstow._steps.names import StepNames
from jaxstow._steps.record import StepRecord, check_metadata, check_metrics
from jaxstow._storage.settings import storage_settings
from jaxstow._storage.store import Store
from jaxstow._storage.transfer import Transfer
from jaxstow._util.progress import require_progress_bar
from jaxstow._util.serialized import serialized
from jaxstow._write.background import BackgroundWriter
from jaxstow._write.held import hold
from jaxstow._write.host_budget import HostBudget, checked_limit
from jaxstow.checkpoint import recovery
from jaxstow.checkpoint.choosing import restore_chosen
from jaxstow.checkpoint.exiting import close_on_exit
from jaxstow.checkpoint.orbax_names import OrbaxNames
from jaxstow.checkpoint.paired_saves import paired_save
from jaxstow.checkpoint.preemption import PreemptionNotice, end_process
from jaxstow.checkpoint.queries import StepQueries
from jaxstow.checkpoint.restoring import restore_step
from jaxstow.checkpoint.schedule import AgreedSteps, SaveSchedule, agree_steps
from jaxstow.checkpoint.settings import LocalTier, check_flags, check_ranked, checked_broadcast, grouped_settings
from jaxstow.checkpoint.shared import Committed, abandon, commit_content
from jaxstow.checkpoint.step_folder import StepFolder, check_step
from jaxstow.checkpoint.steps_store import open_steps
from jaxstow.checkpoint.tiers import Tiers
from jaxstow.checkpoint.writer_lock import WriterLock
from jaxstow.checkpoint.writing import EXTENSION, StepContent, split_items
from jaxstow.errors import CheckpointError

__all__ = ["CheckpointManager"]

logger = logging.getLogger(__name__)


class CheckpointManager(StepQueries, OrbaxNames):
    """Saves and restores the numbered steps of a run in a directory (a path or an fsspec URL such as ``s3://...``).

    :meth:`save` returns once the arrays are held; a background thread writes the files and the step appears whole.
    Older steps are deleted by the keep policy (none: keep all) only after a newer save committed. One process
    writes (the first save takes the lock), any number read. See docs/checkpointing.md.

    >>> import tempfile, jax.numpy as jnp
    >>> from jaxstow import KeepPolicy
    >>> with CheckpointManager(tempfile.mkdtemp(), keep=KeepPolicy(keep_last=2)) as manager:
    ...     for step in range(4):
    ...         tree = {"params": {"w": jnp.full(2, step, jnp.int32)}, "epoch": step // 2}
    ...         manager.save(step, tree, metrics={"loss": 1 / (1 + step)})
    ...     print(manager.steps(), manager.metrics(3), manager.restore())
    [2, 3] {'loss': 0.25} {'epoch': 1, 'params': {'w': Array([3, 3], dtype=int32)}}
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        save_every: int = 1,
        keep: KeepPolicy | None = None,
        local: LocalTier | None = None,
        progress: bool = False,
        storage_options: Mapping[str, Any] | None = None,
        transfer: Transfer | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        host_memory_limit: int | None = None,
        process_timeout: float = 600.0,
        broadcast_restore: bool | None = None,
        preemption_signals: Iterable[int | signal.Signals] = (),
        **shortcuts: Any,
    ) -> None:
        """Make the manager of ``directory`` (a local path or an fsspec URL); its lock is taken by the first save.

        Args:
            save_every: :meth:`should_save` picks every ``save_every``-th step (and the first of a run).
            keep: The steps kept (:class:`~jaxstow.KeepPolicy`: latest k, every n-th, best k by a metric, one per
                interval; its ``metric`` and ``mode`` rank :meth:`best_step` too); ``None`` keeps every step.
            local: Each process's fast storage as a first tier (:class:`~jaxstow.LocalTier`, docs/scaling.md).
            progress: Draw progress bars (needs ``tqdm``); progress is always logged to the ``jaxstow`` logger.
            storage_options, transfer, cache_dir: For a URL ``directory``, as :func:`jaxstow.load` takes them.
            host_memory_limit: Bytes a save may hold on the host at once (default: a quarter of the memory the process may use).
            process_timeout: Seconds each wait on the other processes may last under ``jax.distributed``.
            broadcast_restore: Under jax.distributed, a box that several processes restore is read once, in ranges,
                and gathered over jax's collectives: ``None`` where it pays (an object store, a network file system),
                ``True`` or ``False`` always or never (docs/scaling.md).
            preemption_signals: Signals (e.g. ``[signal.SIGTERM]``) after which a save ends the process
                (docs/checkpointing.md#preemption).
            **shortcuts: Earlier versions' keywords (``keep_last=``, ...), deprecated: each warns with its replacement.

        Raises:
            ArgumentError: A setting that is not valid, or one set twice (a shortcut and its grouped setting).
        """
        policy, local, asynchronous = grouped_settings(keep, local, shortcuts, directory=str(directory))
        self._schedule = SaveSchedule(save_every)
        if progress:
            require_progress_bar()
        self._store: Store = open_steps(directory, storage_settings(storage_options, transfer, cache_dir))
        self._names, self._policy, self._progress = StepNames("%d"), policy, progress
        self._folder = StepFolder(self._store, self._names)
        #: The step the last :meth:`restore` read and the steps it skipped (``fallback=True``); ``None`` before one.
        self.restored: recovery.Restored | None = None
        self._writer = BackgroundWriter(asynchronous=asynchronous)
        self._host_memory_limit = checked_limit(host_memory_limit)
        self._lock: WriterLock | None = None  # process 0's, from its first save or deletion
        self._calls = threading.RLock()  # save, delete and close: one at a time, whichever threads call them
        self._coordinator = Coordinator(self._store.identity, timeout=process_timeout)
        self._closed, self._broadcast_restore = False, checked_broadcast(broadcast_restore)
        self._agreed: AgreedSteps | None = None
        self._tiers = (
            Tiers(local, self._coordinator, directory=self._store.location, progress=progress) if local else None
        )
        if self._tiers is not None:
            self._tiers.check_not_stale(self._folder.committed)
        self._notice: PreemptionNotice | None = None
        self._raised: str | None = None  # what the block of a with statement raised, after a preemption signal
        if self._coordinator.many and preemption_signals:
            logger.info("%s: under jax.distributed, jax's preemption sync point decides", self.directory)
        elif preemption_signals:
            self._notice = self._schedule.notice = PreemptionNotice(preemption_signals)

    @property
    def policy(self) -> KeepPolicy:
        """The keep policy, as given."""
        return self._policy

    @property
    def directory(self) -> str:
        """The directory, as given (a path or a URL)."""
        return self._folder.store.location

    def restore(
        self,
        step: int | None = None,
        like: Any = None,
        *,
        items: Sequence[str] | None = None,
        fallback: bool = False,
        **options: Unpack[LoadOptions],
    ) -> Any:
        """Restore ``step`` (the latest committed one by default) as it was saved: a dict of items, or one tree.

        Under ``jax.distributed`` call it in every process: all restore the step process 0 picks, or all raise.

        Args:
            step: The step to restore; with ``fallback``, the newest one to try.
            like: A target tree to fit the leaves into, all or nothing (see docs/restoring.md); for named items, a
                dict from item names to trees or ``None``. Without it every tree is rebuilt, as by :func:`jaxstow.load`.
            items: Restore only these named items.
            fallback: Skip damaged steps (with a warning on the ``jaxstow`` logger) and restore the newest intact
                one; :attr:`restored` then names the step restored and those skipped.
            **options: Those of :func:`jaxstow.load` (:class:`jaxstow.LoadOptions`); with named items, paths start
                with the item's name (``select=["params/**"]``) and a ``sharding`` dict may be keyed by item.

        Returns:
            The restored dict of items, or the one tree.

        Raises:
            StepNotFoundError: ``step`` is not committed, or there is no committed step.
            CheckpointError: The step cannot be restored, in any process (each one that failed is named).
        """
        options.setdefault("progress", self._progress)
        self._settle()
        tree, self.restored = restore_chosen(
            self._folder,
            step,
            lambda chosen, folder: restore_step(folder, chosen, like, items, options),
            fallback=fallback,
            coordinator=self._coordinator,
            tiers=self._tiers,
            broadcast=self._broadcast_restore,
            items=items,
        )
        return tree

    def __repr__(self) -> str:
        return f"CheckpointManager({self.directory!r}, {self._policy})"

    def _settle(self) -> None:
        self._writer.idle()
        if self._tiers is not None:
            self._tiers.uploads.idle()

    # -- saving ---------------------------------------------------------------------------------------------------

    def should_save(self, step: int) -> bool:
        """Whether ``step`` is one to save; it never waits for a save in flight.

        After the newest step saved (in either tier): the first of a run, every ``save_every``-th (or the local
        tier's ``save_every``-th) and a preemption's step (see :meth:`reached_preemption`). Call it at every step, in
        every process of a ``jax.distributed`` run: what is saved already is agreed by every process at the first
        call (or save), so every process answers the same, whatever its own folders hold.

        >>> import tempfile
        >>> with CheckpointManager(tempfile.mkdtemp(), save_every=10) as manager:
        ...     for step in range(1, 25):
        ...         if manager.should_save(step):
        ...             manager.save(step, {"step": step})
        ...     print(manager.steps())
        [1, 10, 20]
        """
        step = self._asked(step)
        newest = self._agree().newest
        wanted = self._schedule.should_save(step, newest=newest)
        return (self._tiers is not None and self._tiers.schedule.should_save(step, newest=newest)) or wanted

    def reached_preemption(self, step: int) -> bool:
        """Whether ``step`` is the step to save before a preemption.

        In one process: the first step asked about after one of ``preemption_signals`` arrived; under
        ``jax.distributed``: jax's ``reached_preemption_sync_point(step)``. See docs/checkpointing.md#preemption.

        >>> import signal, tempfile
        >>> with CheckpointManager(tempfile.mkdtemp(), preemption_signals=[signal.SIGTERM]) as manager:
        ...     print(manager.reached_preemption(1))  # no SIGTERM has come
        False
        """
        return self._schedule.reached_preemption(self._asked(step))

    @serialized
    def save(
        self,
        step: int,
        items: Any,
        *,
        metrics: Mapping[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        force: bool = False,
        copy: bool = False,
    ) -> None:
        """Save ``items`` as ``step``: a dict of named pytrees (one file each) or any other pytree (one file).

        It returns once the arrays are held; under ``jax.distributed``, once every process called it with the same
        step, or raises where another saves a later step (docs/many-processes.md). After one of ``preemption_signals``,
        it ends the process once committed.

        Args:
            step: A non-negative Python, numpy or 0-d jax integer.
            items: A dict of named pytrees, or one pytree (a dict of another class, such as an ``OrderedDict``, is
                one pytree, and comes back as it was).
            metrics: Numbers (e.g. ``{"loss": 0.1}``) that rank steps for ``keep_best``; back from :meth:`metrics`.
            metadata: Any JSON-able dict of at most 16 MiB (as the step's record holds it); back from :meth:`metadata`.
            force: Replace an existing step atomically.
            copy: Copy the arrays before returning, for numpy buffers or torch tensors that the caller changes in
                place (a torch optimizer's step does), which are otherwise written as they are when the writer reads
                them. Other objects in the tree are saved as they are at the call.

        Raises:
            CheckpointError: The step exists (without ``force``), another writer holds the lock, the last save failed.
            ArgumentError: ``keep_best`` needs ``metrics`` naming its metric, or metrics/metadata are not valid.
        """
        self._check_open()
        step = self._asked(step)
        named, single = split_items(items)
        checked_metrics, checked_metadata = check_metrics(metrics, step=step), check_metadata(metadata, step=step)
        check_ranked(self._policy, checked_metrics, step=step)
        check_flags(force=force, copy=copy)
        self._writer.wait(refused=(what := f"saving step {step} to {self.directory}"))
        if force and self._tiers is not None:
            self._tiers.uploads.wait()  # whether the step is in ``directory`` already, where it is to be replaced
        me, agreed = self._coordinator.index, self._agree()
        if agreed.holds(step) and not force:
            damaged = step in self._folder.damaged or step in (self.restored.skipped if self.restored else {})
            raise CheckpointError(
                f"step {step} already exists in {self.directory}{', damaged' * damaged}; pass force=True to replace it",
                file=self._folder.url(step),
            )
        talk = paired_save(self._coordinator, step, where=self._folder.url(step))  # every process saves step
        due = self._tiers is not None and self._schedule.should_save(step, newest=agreed.newest)
        replacing = force and self._tiers is not None and agreed.persistent(step)  # new values where the old ones are
        copy_talk = self._coordinator.conversation("copy") if due or replacing else None
        agreed.issued(step)  # in every process alike, whether this one's part then fails now or in the background
        try:  # a failure here (the lock is process 0's alone) fails the step in every process
            if self._lock is None and me == 0:
                self._take_lock()
            budget = HostBudget(self._host_memory_limit)
            file = functools.partial(self._folder.url, step)
            part = me if self._coordinator.many else None
            held = {n: hold(t, copy=copy, file=file(n + EXTENSION), part=part, budget=budget) for n, t in named.items()}
        except BaseException as error:
            abandon(talk, error)
            raise
        content = StepContent(step, held, single, checked_metrics, checked_metadata, dataclasses.asdict(self._policy))
        write: Callable[[], None] = functools.partial(self._write, content, talk=talk, replace=force)
        if self._tiers is not None:
            upload = functools.partial(self._copy, talk=copy_talk, replace=replacing) if copy_talk else None
            tiers, decided = self._tiers, self._decided(False)
            write = functools.partial(tiers.save, content, talk=talk, persistent=upload, decided=decided)
        self._writer.submit(write, what=what, until=budget.fetched)
        if self._notice is not None and self._notice.received is not None and self._notice.settle():
            self.close()  # ends the process, every manager that caught the signal having saved its step

    def _asked(self, step: int) -> int:
        """``step`` checked; after this manager's preemption save, the next question or save ends the process."""
        if self._notice is not None and self._notice.settled:
            self.close()
        return check_step(step)

    @serialized
    def delete(self, step: int) -> None:
        """Delete a committed step now, whatever the keep policy says (after the save, and the copy, in flight): from
        ``directory`` and, with a local tier, from every process's tier and the copies its peers keep."""
        self._check_open()
        self.wait()  # the save and the copy in flight: a copy would commit the step again
        step = self._held(step)
        self._agreed = None  # what is saved is agreed again at the next question or save
        if self._tiers is not None:  # each process its own
            self._tiers.delete(step, last_persistent=not [kept for kept in self._folder.committed() if kept != step])
        if self._coordinator.index != 0 or step not in self._folder.committed():  # process 0 deletes for all
            return
        if self._lock is None:
            self._take_lock()
        self._store.delete(self._names.name(step))
        self._folder.forget(step)
        logger.info("%s: deleted step %d", self.directory, step)

    def _check_open(self) -> None:
        if self._closed:
            raise CheckpointError(f"the checkpoint manager of {self.directory} is closed")
        if self._lock is not None:
            self._lock.check_here(self.directory)

    def _take_lock(self) -> None:
        self._lock = WriterLock(self._store, lambda name: self._names.step(name) is not None)
        self._folder.cache = True  # no one else can replace a step now

    def _agree(self) -> AgreedSteps:
        """The steps saved already, agreed by every process at the first question or save."""
        if self._agreed is None:
            tiers = self._tiers
            local, keep_local = (tiers.held_steps, tiers.keep_last) if tiers is not None else (None, None)
            self._agreed = agree_steps(
                self._coordinator, self._folder.committed, local, where=self.directory, keep_local=keep_local
            )
        return self._agreed

    def _write(self, content: StepContent, *, talk: Conversation, replace: bool) -> None:
        """The background half of a save without a local tier: every process writes its files, process 0 commits."""
        committed = commit_content(
            talk,
            self._store,
            self._names.name(content.step),
            content,
            f"step {content.step} of {self.directory}",
            self._progress,
            shared=True,
            replace=replace,
            decided=self._decided(True),
            after=self._after_commit,
            held=None if self._lock is None else self._lock.check_held,  # process 0's: it commits and deletes
        )
        self._committed(committed)

    def _copy(self, record: StepRecord, *, talk: Conversation, replace: bool) -> None:
        """Copy a local step to ``directory`` (``replace``: the step there, of a forced save), then keep by policy."""
        if self._tiers is not None:
            committed = self._tiers.copy_to(
                self._store, record, talk=talk, decided=self._decided(True), after=self._after_commit, replace=replace
            )
            self._committed(committed)

    def _decided(self, persistent: bool) -> Callable[[StepRecord], None]:
        """What every process notes once process 0 decided a step committed: to ``directory`` or the local tiers."""

        def note(record: StepRecord) -> None:
            if self._agreed is not None:
                self._agreed.committed(record.step, persistent=persistent)

        return note

    def _after_commit(self, record: StepRecord) -> Iterator[int]:
        """In process 0, once a step is committed: remember its record, apply the keep policy; each step deleted."""
        self._folder.remember(record)
        yield from self._folder.prune(self._policy, saved=record.step)

    def _committed(self, committed: Committed) -> None:
        """In every process, once a step is committed: forget the steps process 0 deleted."""
        for step in committed.deleted:
            self._folder.forget(step)
        if self._agreed is not None:
            self._agreed.deleted(committed.deleted)

    # -- lifetime -------------------------------------------------------------------------------------------------

    def wait(self) -> None:
        """Wait for the save in flight; raise its error (with the original as ``__cause__``) if it failed."""
        self._writer.wait()
        if self._tiers is not None:
            self._tiers.uploads.wait()

    @serialized
    def close(self) -> None:
        """Finish the save in flight, release the lock and raise the save's error, if any (idempotent).

        After one of ``preemption_signals``, the process ends instead: as the signal would, or, where the save failed,
        with status 120 and the error in one line.
        """
        if self._closed:
            return
        self._closed = True
        failure = None
        try:
            try:
                self._writer.close()
            finally:
                if self._tiers is not None:
                    self._tiers.close()
        except CheckpointError as error:
            if self._preempted() is None:
                raise
            failure = " ".join(str(error).splitlines())
        finally:
            if self._lock is not None:
                self._lock.release()
                self._lock = None
                self._folder.stop_caching()  # a manager closed still answers, from what is stored now
            preempted = self._preempted()  # read last, so that a signal that came during the wait counts
            if self._notice is not None:
                self._notice.close()
        if preempted is not None:
            end_process(preempted, failure=failure or self._raised)

    def _preempted(self) -> signal.Signals | None:  # the preemption signal that arrived, if any
        return self._notice.received if self._notice is not None else None

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if error is not None and self._preempted() is not None:  # the steps after the signal failed: none was saved
            logger.error("the run raised %s after a preemption signal", type(error).__name__, exc_info=error)
            self._raised = f"the run raised {type(error).__name__}: {error}"
        close_on_exit(self.close, error)
