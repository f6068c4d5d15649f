"""``CheckpointManager``: the numbered steps of a run, kept by policy, saved in the background, safe against crashes.

A directory (local path or fsspec URL) holds one folder per committed step::

    <directory>/<step>/params.safetensors     one jaxstow file per item; jaxstow.load opens each on its own
    <directory>/<step>/opt_state.safetensors
    <directory>/<step>/checkpoint.json        step, time, metrics, metadata, files; written last
    <directory>/.jaxstow.lock                 the writer's process and host, while it writes

>>> import tempfile, jax.numpy as jnp
>>> from jaxstow import CheckpointManager
>>> with CheckpointManager(tempfile.mkdtemp(), keep_last=2) as manager:
...     for step in range(4):
...         manager.save(step, {"params": {"w": jnp.full(2, step)}, "epoch": step // 2}, metrics={"loss": 1 / (1 + step)})
...     print(manager.steps(), manager.metrics(3), manager.restore())
[2, 3] {'loss': 0.25} {'epoch': 1, 'params': {'w': Array([3, 3], dtype=int32)}}
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import logging
import os
import signal
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, Unpack

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
from jaxstow._write.save_report import SaveReport
from jaxstow.checkpoint import recovery
from jaxstow.checkpoint.preemption import PreemptionNotice, end_process
from jaxstow.checkpoint.processes import Processes
from jaxstow.checkpoint.restoring import restore_step
from jaxstow.checkpoint.schedule import SaveSchedule
from jaxstow.checkpoint.shared import save_shared
from jaxstow.checkpoint.step_folder import StepFolder, check_step
from jaxstow.checkpoint.together import restore_together
from jaxstow.checkpoint.writing import EXTENSION, StepContent, split_items, write_step
from jaxstow.errors import ArgumentError, CheckpointError, StepNotFoundError

__all__ = ["CheckpointManager"]

logger = logging.getLogger(__name__)


class CheckpointManager:
    """Saves and restores the numbered steps of a run in ``directory`` (a path or an fsspec URL such as ``s3://...``).

    Keep policies combine: the latest ``keep_last`` steps, every step divisible by ``keep_every``, one step per
    ``keep_every_seconds`` of save time (seconds or a ``datetime.timedelta``), and the ``keep_best`` steps by the
    metric ``metric`` (lowest first with ``mode="min"``, highest with ``"max"``). The newest step is kept until a newer
    one is committed; older steps are deleted only after a save has committed. With no policy every step is kept.
    ``save_every`` is what :meth:`should_save` asks of a step (every step by default); :meth:`save` saves whatever it
    is given.

    ``preemption_signals`` (e.g. ``[signal.SIGTERM]``, none by default) are the signals with which a scheduler says
    it will stop the job: while the manager is open (made in the main thread) they are caught, and :meth:`should_save`
    is true at the next step asked about, where :meth:`reached_preemption` is true too. The first :meth:`save` after
    the signal ends the process once that step is committed (and the save before it, if still in flight); the lock
    is released first, and the process ends as the signal would have ended it (``SIGTERM``: exit status -15 to a
    parent, 143 in a shell). A signal that arrives with no save after it ends the process at :meth:`close`. A save
    that fails then is printed before the process ends. Under ``jax.distributed`` the signals are left to jax, whose
    preemption sync point decides (see :meth:`reached_preemption`).

    With ``async_save`` (the default), :meth:`save` returns once the arrays are held on the host and the files are
    written on a background thread, one save at a time; an error there is raised, with its cause, by the next
    :meth:`save`, :meth:`wait`, :meth:`close` or the end of a ``with`` block. Reads (:meth:`steps`, :meth:`restore`,
    ...) first wait for the save in flight, so they see every save made before them. ``progress=True`` draws a progress
    bar (needs ``tqdm``); progress is always logged to the ``jaxstow`` logger.

    A URL ``directory`` (``s3://bucket/run``, any fsspec URL) is reached with ``storage_options`` (to fsspec, whose
    configuration and environment variables fill in the rest); ``transfer`` (a :class:`jaxstow.Transfer`) sets the
    requests in flight, their size and a bandwidth cap of every upload and restore; ``cache_dir`` keeps a local copy
    of each file restored, read again instead of the store while its header checksum is the one the step's record
    names. Under ``jax.distributed``, every wait of a save or restore on the other processes is bounded by
    ``process_timeout`` seconds (see :meth:`save` and :meth:`restore`).

    A save in flight when the interpreter exits is committed before the process ends, or printed with its step and
    exit status 1 (:mod:`jaxstow._write.at_exit`: ``JAXSTOW_EXIT_WAIT`` seconds at most, a second Ctrl-C stops it).

    The first save takes the directory's lock (a second writer gets a :class:`~jaxstow.errors.CheckpointError` naming
    the first; the lock of a dead writer is taken over) and removes what interrupted saves left. Reading takes no lock,
    so another process may restore while this one writes.
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
    ) -> None:
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
        self._lock: Lock | None = None
        self._closed = False
        self._processes = Processes(self._store.location, timeout=process_timeout)
        self._notice: PreemptionNotice | None = None
        if self._processes.many:
            if preemption_signals:
                logger.info("%s: under jax.distributed, jax's preemption sync point decides", self.directory)
        elif preemption_signals:
            self._notice = self._schedule.notice = PreemptionNotice(preemption_signals)

    @property
    def policy(self) -> KeepPolicy:
        return self._policy

    @property
    def directory(self) -> str:
        """The directory, as given (a path or a URL)."""
        return self._folder.store.location

    def _record(self, step: int) -> StepRecord:
        return self._folder.record(step)

    def damaged_steps(self, *, verify: recovery.Verify = "data", progress: bool | None = None) -> dict[int, str]:
        """The committed steps that cannot be restored as saved, each with the reason (waits for the save in flight).

        With ``verify="data"`` (the default) every leaf of every step is read and checked against its checksum, as
        ``jaxstow verify`` does, so this finds a flipped byte anywhere: in a record, a header or the data. With
        ``verify="headers"`` only the records, the item files' presence and their headers are checked, which reads a
        few kB per file. ``progress`` (the manager's setting by default) draws a bar of the bytes read per step.
        """
        self._settle()
        verify = recovery.check_verify(verify)
        return recovery.damaged(self._folder, self._folder.committed(), verify=verify, progress=self._bar(progress))

    def latest_intact_step(self, *, verify: recovery.Verify = "data", progress: bool | None = None) -> int | None:
        """The newest committed step that is not damaged (see :meth:`damaged_steps`), or ``None``; steps older than
        the one found are not read. To restore it in one pass, use ``restore(fallback=True)``."""
        self._settle()
        verify = recovery.check_verify(verify)
        return recovery.newest_intact(
            self._folder, lambda: self._folder.committed()[::-1], verify=verify, progress=self._bar(progress)
        )

    def _bar(self, progress: bool | None) -> bool:
        if progress:
            require_progress_bar()
        return self._progress if progress is None else progress

    def steps(self) -> list[int]:
        """The committed steps, in increasing order (waits for the save in flight)."""
        self._settle()
        return self._folder.committed()

    def latest_step(self) -> int | None:
        """The newest committed step, or ``None`` if there is none."""
        steps = self.steps()
        return steps[-1] if steps else None

    def best_step(self, metric: str | None = None, *, mode: Literal["min", "max"] | None = None) -> int | None:
        """The committed step with the best value of ``metric`` (the manager's ``metric`` and ``mode`` by default):
        the lowest for ``mode="min"``, the highest for ``"max"``, the newest of equals. Steps without a finite value
        of it are left out; ``None`` if no step has one."""
        metric = metric or self._policy.metric
        if metric is None:
            raise ArgumentError("best_step needs a metric: pass best_step('loss') or make the manager with metric=...")
        values = {}
        for step in self.steps():
            with contextlib.suppress(StepNotFoundError):  # deleted since it was listed
                values[step] = self._record(step).metric(metric)
        return KeepPolicy(keep_best=1, metric=metric, mode=mode or self._policy.mode).best(values)

    def _existing(self, step: int | None) -> int:
        self._settle()
        return self._folder.existing(step)

    def metrics(self, step: int) -> dict[str, float | None] | None:
        """The metrics saved with ``step`` (non-finite values read back as ``None``)."""
        return self._record(self._existing(step)).metrics

    def metadata(self, step: int) -> dict[str, Any] | None:
        """The metadata saved with ``step``."""
        return self._record(self._existing(step)).metadata

    def items(self, step: int) -> list[str] | None:
        """The names of the items of ``step``, or ``None`` if it was saved as one tree."""
        record = self._record(self._existing(step))
        return None if record.single else sorted(record.files)

    def restore(
        self,
        step: int | None = None,
        like: Any = None,
        *,
        items: Sequence[str] | None = None,
        fallback: bool = False,
        **options: Unpack[LoadOptions],
    ) -> Any:
        """Restore ``step`` (the latest committed one by default), as it was saved: a dict of items, or one tree.

        Without ``like`` every tree is rebuilt from its file, as :func:`jaxstow.load` does. With ``like``, leaves are
        fitted into its structure, all or nothing (dtype and shape checked, the sharding of its arrays applied); for
        named items ``like`` is a dict from item names to trees, or to ``None`` to rebuild that item. ``items`` restores
        only the named ones. A manager made with ``progress=True`` draws a bar for each item read. The options are
        those of :func:`jaxstow.load` (:class:`jaxstow.LoadOptions`); with named items, paths start with the item's
        name (``select=["params/**"]``), and a ``sharding`` dict keyed by item names gives each item its own.

        ``fallback=True`` restores the newest step (from ``step`` down) whose record, headers and restored data check:
        a damaged step is skipped, with a warning on the ``jaxstow`` logger that names it and the damage. Afterwards
        :attr:`restored` tells which step was restored and which were skipped, and why.

        If another process's keep policy deletes the step being read, the newest step then is restored instead (up to
        8 times in a row); a ``step`` asked for that is gone raises :class:`~jaxstow.errors.StepNotFoundError`.

        Under ``jax.distributed`` call it in every process, as :meth:`save`: process 0 picks the step, and every
        process restores it or every process raises a :class:`~jaxstow.errors.CheckpointError` naming the step and
        each process that failed or did not report within the manager's ``process_timeout``
        (:mod:`jaxstow.checkpoint.together`).
        """
        options.setdefault("progress", self._progress)

        def restore(chosen: int) -> Any:
            return restore_step(self._folder, chosen, like, items, options)

        if self._processes.many:

            def choose() -> list[int]:
                newest = self._existing(step)
                return [older for older in reversed(self._folder.committed()) if older <= newest]

            tree, self.restored = restore_together(self._processes, self._folder, choose, restore, fallback=fallback)
            return tree
        if step is not None and not fallback:
            chosen = self._existing(step)
            tree = restore(chosen)
            self.restored = recovery.Restored(chosen)
            return tree
        if fallback:
            bound = self._existing(step)

            def candidates() -> list[int]:
                """The steps to try, newest first; without ``step``, one committed meanwhile comes first."""
                return [older for older in reversed(self._folder.committed()) if step is None or older <= bound]

            tree, self.restored = recovery.restore_newest_intact(self._folder, candidates, restore)
            return tree
        # The newest step is restored; if the keep policy of the process that saves here deletes it meanwhile, a newer
        # one has been committed, and that one is restored instead.
        self._settle()
        trees: list[Any] = []

        def accept(chosen: int) -> bool:
            trees.append(restore(chosen))
            return True

        newest = recovery.newest_accepted(lambda: self._folder.committed()[::-1], accept)
        if newest is None:
            raise StepNotFoundError(f"{self.directory} holds no committed step to restore")
        self.restored = recovery.Restored(newest)
        return trees[0]

    def __repr__(self) -> str:
        return f"CheckpointManager({self.directory!r}, {self._policy})"

    def _settle(self) -> None:
        self._writer.idle()

    # -- saving ---------------------------------------------------------------------------------------------------

    def should_save(self, step: int) -> bool:
        """Whether ``step`` is one to save: after the newest step saved (committed or in flight), the first of a run,
        every ``save_every``-th, or a preemption's step (see :meth:`reached_preemption`; call this at every step, in
        every process of a ``jax.distributed`` run). It never waits for a save in flight.

        >>> import tempfile
        >>> with CheckpointManager(tempfile.mkdtemp(), save_every=10) as manager:
        ...     for step in range(1, 25):
        ...         if manager.should_save(step):
        ...             manager.save(step, {"step": step})
        ...     print(manager.steps())
        [1, 10, 20]
        """
        return self._schedule.should_save(check_step(step), committed=self._folder.committed)

    def reached_preemption(self, step: int) -> bool:
        """Whether ``step`` is the step to save before a preemption. In a single process, with ``preemption_signals``:
        the first step asked about (here or by :meth:`should_save`) after one of the signals arrived; without them,
        never. In a ``jax.distributed`` run: whether every process has reached the preemption sync point at ``step``
        (after a preemption notice, SIGTERM by default, to any process, jax picks a step every process reaches, so
        that all save it before they are stopped; jax's ``multihost_utils.reached_preemption_sync_point``).

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
        """Save ``items`` as ``step`` (a Python, numpy or 0-d jax integer): a dict of named pytrees (one file each) or
        any other pytree (one file).

        ``metrics`` (numbers, e.g. ``{"loss": 0.1}``) rank steps for ``keep_best`` and come back from
        :meth:`metrics`; ``metadata`` is any JSON-able dict, back from :meth:`metadata`. A step that exists raises a
        :class:`~jaxstow.errors.CheckpointError` unless ``force=True``, which replaces it atomically. ``copy=True``
        copies the arrays before returning, for numpy buffers that the caller changes in place.

        After one of ``preemption_signals`` arrived, this save ends the process once it is committed (see the class).
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
        exists = step in self._folder.committed()
        if exists and not force:
            raise CheckpointError(
                f"step {step} already exists in {self.directory}; pass force=True to replace it",
                file=self._folder.url(step),
            )
        part = self._processes.index if self._processes.many else None
        held = {
            name: hold(tree, copy=copy, file=self._folder.url(step, name + EXTENSION), part=part)
            for name, tree in named.items()
        }
        content = StepContent(step, held, single, checked_metrics, checked_metadata)
        write: Callable[[], StepRecord | None]
        if self._processes.many:
            write = functools.partial(self._write_shared, content, exists, key=self._processes.next_exchange("save"))
        else:
            keep_policy = dataclasses.asdict(self._policy)
            folder = self._names.name(step)
            write = functools.partial(
                write_step,
                self._store,
                folder,
                content,
                replace=exists,
                keep_policy=keep_policy,
                progress=self._progress,
            )
        self._writer.submit(lambda: self._committed(write()), what=f"saving step {step} to {self.directory}")
        self._schedule.saved(step)
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

    def _write_shared(self, content: StepContent, replace: bool, *, key: str) -> StepRecord | None:
        """The background half of a save made by every process together (see :mod:`jaxstow.checkpoint.shared`); the
        committed record in process 0."""
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

    def close(self) -> None:
        """Finish the save in flight, release the lock and raise the save's error, if any (idempotent). After one of
        ``preemption_signals`` arrived, print the error instead and end the process as the signal would have."""
        if self._closed:
            return
        self._closed = True
        try:
            self._writer.close()
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
