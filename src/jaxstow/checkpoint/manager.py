"""``CheckpointManager``: the numbered steps of a run, kept by policy, saved in the background, safe against crashes.

See docs/checkpointing.md; a step's folder and its ``checkpoint.json``: docs/format.md ("Checkpoint folders").
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import logging
import os
import signal
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, Unpack

from jaxstow._coordination import Coordinator
from jaxstow._read.options import LoadOptions
from jaxstow._steps.keep import KeepPolicy
from jaxstow._steps.names import StepNames
from jaxstow._steps.record import RECORD_NAME, StepRecord, check_metadata, check_metrics
from jaxstow._storage.lock import Lock, lock_store
from jaxstow._storage.settings import storage_settings
from jaxstow._storage.store import Store, open_store
from jaxstow._storage.transfer import Transfer
from jaxstow._util.progress import require_progress_bar
from jaxstow._write.background import BackgroundWriter
from jaxstow._write.held import hold
from jaxstow._write.host_budget import HostBudget, checked_limit
from jaxstow._write.save_report import SaveReport
from jaxstow.checkpoint import recovery
from jaxstow.checkpoint.choosing import restore_chosen
from jaxstow.checkpoint.preemption import PreemptionNotice, end_process
from jaxstow.checkpoint.processes import Processes
from jaxstow.checkpoint.queries import StepQueries
from jaxstow.checkpoint.restoring import restore_step
from jaxstow.checkpoint.schedule import SaveSchedule
from jaxstow.checkpoint.shared import save_shared
from jaxstow.checkpoint.step_folder import StepFolder, check_step
from jaxstow.checkpoint.tiers import local_tier
from jaxstow.checkpoint.writing import EXTENSION, StepContent, split_items, write_step
from jaxstow.errors import ArgumentError, CheckpointError

__all__ = ["CheckpointManager"]

logger = logging.getLogger(__name__)


class CheckpointManager(StepQueries):
    """Saves and restores the numbered steps of a run in a directory (a path or an fsspec URL such as ``s3://...``).

    :meth:`save` returns once the arrays are held; a background thread writes the files and the step appears whole.
    Older steps are deleted by the keep policies (none: keep all) only after a newer save committed. One process
    writes (the first save takes the lock), any number read. See docs/checkpointing.md.

    >>> import tempfile, jax.numpy as jnp
    >>> with CheckpointManager(tempfile.mkdtemp(), keep_last=2) as manager:
    ...     for step in range(4):
    ...         tree = {"params": {"w": jnp.full(2, step)}, "epoch": step // 2}
    ...         manager.save(step, tree, metrics={"loss": 1 / (1 + step)})
    ...     print(manager.steps(), manager.metrics(3), manager.restore())
    [2, 3] {'loss': 0.25} {'epoch': 1, 'params': {'w': Array([3, 3], dtype=int32)}}
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        keep_last: int | None = None,
        keep_every: int | None = None,
        keep_best: int | None = None,
        metric: str | None = None,
        mode: Literal["min", "max"] = "min",
        keep_every_seconds: float | datetime.timedelta | None = None,
        save_every: int = 1,
        async_save: bool = True,
        progress: bool = False,
        storage_options: Mapping[str, Any] | None = None,
        transfer: Transfer | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        process_timeout: float = 600.0,
        preemption_signals: Iterable[int | signal.Signals] = (),
        local_directory: str | os.PathLike[str] | None = None,
        local_save_every: int | None = None,
        local_keep_last: int | None = None,
        local_replicas: int | None = None,
        broadcast_restore: bool | None = None,
        host_memory_limit: int | None = None,
    ) -> None:
        """Make the manager of ``directory``; the directory's lock is taken by the first save.

        Args:
            directory: A local path or an fsspec URL (``s3://bucket/run``).
            keep_last: Keep the latest ``keep_last`` steps.
            keep_every: Keep every step divisible by ``keep_every``.
            keep_best: Keep the ``keep_best`` steps best by ``metric``.
            metric: The metric that ``keep_best`` and :meth:`best_step` rank steps by.
            mode: ``"min"`` ranks the lowest value first, ``"max"`` the highest.
            keep_every_seconds: Keep one step per this much save time (seconds or a ``datetime.timedelta``).
            save_every: :meth:`should_save` picks every ``save_every``-th step.
            async_save: Write on a background thread, whose error the next :meth:`save` or :meth:`close` raises.
            progress: Draw progress bars (needs ``tqdm``); progress is always logged to the ``jaxstow`` logger.
            storage_options: Passed to fsspec for a URL ``directory``.
            transfer: A :class:`jaxstow.Transfer`: requests in flight, their size, a bandwidth cap.
            cache_dir: Keeps a local copy of each file restored, read again while its header checksum matches.
            process_timeout: Seconds each wait on the other processes may last under ``jax.distributed``.
            preemption_signals: Signals (e.g. ``[signal.SIGTERM]``) after which a save ends the process (see
                docs/checkpointing.md#preemption).
            local_directory: Each process's fast storage (a local path, may differ per process; under
                jax.distributed each process uses ``process-{index}`` in it): every step saved goes there first, ``directory`` gets the steps due there, copied from it (docs/scaling.md).
            local_save_every: :meth:`should_save` also picks every ``local_save_every``-th step (1), for the local tier.
            local_keep_last: The local tier keeps its newest ``local_keep_last`` steps (2).
            local_replicas: Other processes that keep a copy of each process's local files (1 under jax.distributed).
            broadcast_restore: Under jax.distributed, a box that several processes restore is read once, in
                ranges, and gathered over jax's collectives: ``None`` where it pays (an object store, a network file
                system), ``True`` or ``False`` always or never (docs/scaling.md).
            host_memory_limit: Bytes a save may hold on the host at once (default: a quarter of physical memory).

        Raises:
            ArgumentError: A keep policy or ``save_every`` that is not valid, an option of the local tier without
                ``local_directory``.
        """
        policy = KeepPolicy(keep_last, keep_every, keep_best, metric, mode, keep_every_seconds)
        self._schedule = SaveSchedule(save_every)
        if progress:
            require_progress_bar()
        settings = storage_settings(storage_options, transfer, cache_dir)
        self._store: Store = open_store(directory, marker=RECORD_NAME, settings=settings)
        self._names = StepNames("%d")
        self._folder = StepFolder(self._store, self._names)
        self._policy = policy
        self._progress = progress
        #: The step the last :meth:`restore` read and the steps it skipped (``fallback=True``); ``None`` before one.
        self.restored: recovery.Restored | None = None
        self._writer = BackgroundWriter(asynchronous=async_save)
        self._host_memory_limit = checked_limit(host_memory_limit)
        self._lock: Lock | None = None
        self._closed = False
        self._processes = Processes(self._store.location, timeout=process_timeout)
        self._coordinator = Coordinator(self._store.location, timeout=process_timeout)
        self._broadcast_restore = broadcast_restore
        self._tiers = local_tier(
            local_directory,
            self._processes,
            directory=self._store.location,
            save_every=local_save_every,
            keep_last=local_keep_last,
            replicas=local_replicas,
            progress=progress,
        )
        self._notice: PreemptionNotice | None = None
        if self._processes.many:
            if preemption_signals:
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

        def restore(chosen: int, folder: StepFolder) -> Any:
            return restore_step(folder, chosen, like, items, options)

        self._settle()
        tree, self.restored = restore_chosen(
            self._folder,
            step,
            restore,
            fallback=fallback,
            coordinator=self._coordinator,
            tiers=self._tiers,
            broadcast=self._broadcast_restore,
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

        After the newest step saved (in either tier): the first of a run, every ``save_every``-th (or
        ``local_save_every``-th) and a preemption's step (see :meth:`reached_preemption`). Call it at every step, in
        every process of a ``jax.distributed`` run.

        >>> import tempfile
        >>> with CheckpointManager(tempfile.mkdtemp(), save_every=10) as manager:
        ...     for step in range(1, 25):
        ...         if manager.should_save(step):
        ...             manager.save(step, {"step": step})
        ...     print(manager.steps())
        [1, 10, 20]
        """
        wanted = self._schedule.should_save(check_step(step), committed=self._listed)
        if self._tiers is None:
            return wanted
        return self._tiers.schedule.should_save(step, committed=self._listed) or wanted

    def reached_preemption(self, step: int) -> bool:
        """Whether ``step`` is the step to save before a preemption.

        In one process: the first step asked about after one of ``preemption_signals`` arrived; under
        ``jax.distributed``: jax's ``reached_preemption_sync_point(step)``. See docs/checkpointing.md#preemption.

        >>> import signal, tempfile
        >>> with CheckpointManager(tempfile.mkdtemp(), preemption_signals=[signal.SIGTERM]) as manager:
        ...     print(manager.reached_preemption(1))  # no SIGTERM has come
        False
        """
        return self._schedule.reached_preemption(check_step(step))

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

        It returns once the arrays are held. After one of ``preemption_signals``, it ends the process once committed.

        Args:
            step: A non-negative Python, numpy or 0-d jax integer.
            items: A dict of named pytrees, or one pytree.
            metrics: Numbers (e.g. ``{"loss": 0.1}``) that rank steps for ``keep_best``; back from :meth:`metrics`.
            metadata: Any JSON-able dict; back from :meth:`metadata`.
            force: Replace an existing step atomically.
            copy: Copy the arrays before returning, for numpy buffers that the caller changes in place.

        Raises:
            CheckpointError: The step exists (without ``force``), another writer holds the lock, the last save failed.
            ArgumentError: ``keep_best`` needs ``metrics`` naming its metric, or metrics/metadata are not valid.
        """
        self._check_open()
        step = check_step(step)
        named, single = split_items(items)
        checked_metrics = check_metrics(metrics, step=step)
        if self._policy.ranks and self._policy.metric not in (checked_metrics or {}):
            raise ArgumentError(
                f"keep_best ranks steps by the metric {self._policy.metric!r}, so save(step={step}) needs "
                f"metrics={{{self._policy.metric!r}: ...}}"
            )
        checked_metadata = check_metadata(metadata, step=step)
        self._writer.wait()
        if self._lock is None and self._processes.index == 0:
            self._take_lock()
        exists = step in self._listed()
        if exists and not force:
            raise CheckpointError(
                f"step {step} already exists in {self.directory}; pass force=True to replace it",
                file=self._folder.url(step),
            )
        part = self._processes.index if self._processes.many else None
        budget = HostBudget(self._host_memory_limit)
        held = {
            name: hold(tree, copy=copy, file=self._folder.url(step, name + EXTENSION), part=part, budget=budget)
            for name, tree in named.items()
        }
        content = StepContent(step, held, single, checked_metrics, checked_metadata)
        write: Callable[[], StepRecord | None]
        keep = dataclasses.asdict(self._policy)
        due = self._tiers is None or self._schedule.should_save(step, committed=self._listed)
        if self._tiers is not None:
            upload = functools.partial(self._copy, key=self._processes.next_exchange("copy")) if due else None
            write = functools.partial(
                self._tiers.save, content, key=self._processes.next_exchange("local"), persistent=upload, keep=keep
            )
        elif self._processes.many:
            write = functools.partial(self._write_shared, content, exists, key=self._processes.next_exchange("save"))
        else:
            folder = self._names.name(step)
            write = functools.partial(
                write_step, self._store, folder, content, replace=exists, keep_policy=keep, progress=self._progress
            )
        what = f"saving step {step} to {self.directory}"
        self._writer.submit(lambda: self._committed(write()), what=what, until=budget.fetched)
        self._schedule.saved(step)
        if self._tiers is not None:
            self._tiers.schedule.saved(step)
        if self._preempted() is not None:
            self.close()  # ends the process

    def delete(self, step: int) -> None:
        """Delete a committed step now, whatever the keep policy says (after the save in flight)."""
        self._check_open()
        self._writer.wait()
        step = self._existing(step)
        self._schedule.forget()
        if self._processes.index != 0:  # process 0 deletes for all
            return
        if self._lock is None:
            self._take_lock()
        self._store.delete(self._names.name(step))
        self._folder.forget(step)
        logger.info("%s: deleted step %d", self.directory, step)

    def _check_open(self) -> None:
        if self._closed:
            raise CheckpointError(f"the checkpoint manager of {self.directory} is closed")

    def _take_lock(self) -> None:
        self._lock = lock_store(self._store)
        self._folder.cache = True  # no one else can replace a step now
        removed = self._store.cleanup(lambda name: self._names.step(name) is not None)
        if removed:
            logger.info("%s: removed leftovers of interrupted saves: %s", self.directory, ", ".join(removed))

    def _committed(self, record: StepRecord | None) -> None:
        """After the background half of a save: remember the step this process committed, apply the keep policy."""
        if record is not None:
            self._folder.remember(record)
            self._prune()

    def _copy(self, record: StepRecord, *, key: str) -> None:
        """Copy a local step to ``directory`` (on the local tier's upload thread), then apply the keep policy."""
        self._committed(self._tiers.copy_to(self._store, record, key=key) if self._tiers is not None else None)

    def _write_shared(self, content: StepContent, replace: bool, *, key: str) -> StepRecord | None:
        """The background half of a save made by every process together: the committed record in process 0."""
        progress = SaveReport(f"step {content.step} of {self.directory}", total=0, bar=self._progress)
        record = save_shared(
            self._processes,
            self._store,
            key=key,
            step=content.step,
            folder=self._names.name(content.step),
            items=content.held,
            extension=EXTENSION,
            single=content.single,
            metrics=content.metrics,
            metadata=content.metadata,
            replace=replace,
            progress=progress,
            keep_policy=dataclasses.asdict(self._policy),
        )
        progress.finish()
        return record

    def _prune(self) -> None:
        steps = self._folder.committed()
        policy = self._policy
        records = {step: self._folder.unchecked_record(step) for step in steps} if policy.ranks or policy.times else {}
        metric = policy.metric or ""
        values = {step: record.metric(metric) if record else None for step, record in records.items()}
        times = {step: record.time for step, record in records.items() if record is not None}
        for step in policy.to_delete(steps, values, times):
            self._store.delete(self._names.name(step))
            self._folder.forget(step)
            logger.info("%s: deleted step %d (keep policy)", self.directory, step)

    # -- lifetime -------------------------------------------------------------------------------------------------

    def wait(self) -> None:
        """Wait for the save in flight; raise its error (with the original as ``__cause__``) if it failed."""
        self._writer.wait()
        if self._tiers is not None:
            self._tiers.uploads.wait()

    def close(self) -> None:
        """Finish the save in flight, release the lock and raise the save's error, if any (idempotent).

        After one of ``preemption_signals``, the error is printed instead and the process ends as the signal would.
        """
        if self._closed:
            return
        self._closed = True
        try:
            try:
                self._writer.close()
            finally:
                if self._tiers is not None:
                    self._tiers.close()
        except CheckpointError as error:
            if self._preempted() is None:
                raise
            logger.error("%s", error, exc_info=error)
        finally:
            if self._lock is not None:
                self._lock.release()
                self._lock = None
            preempted = self._preempted()  # read last, so that a signal that came during the wait counts
            if self._notice is not None:
                self._notice.close()
        if preempted is not None:
            end_process(preempted)

    def _preempted(self) -> signal.Signals | None:
        """The preemption signal that arrived, if any."""
        return self._notice.received if self._notice is not None else None

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()
