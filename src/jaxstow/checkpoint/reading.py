"""Reading the committed steps of a checkpoint directory: listing them, their metrics and metadata, the best one,
restoring one (or the newest intact one), and finding damage. :class:`~jaxstow.CheckpointManager` adds saving.

>>> import tempfile, numpy as np
>>> from jaxstow import CheckpointManager
>>> with CheckpointManager(tempfile.mkdtemp(), metric="loss") as manager:
...     for step, loss in ((1, 0.5), (2, 0.2), (3, 0.4)):
...         manager.save(step, {"w": np.full(2, step)}, metrics={"loss": loss})
...     print(manager.steps(), manager.latest_step(), manager.best_step(), manager.best_step("loss", mode="max"))
[1, 2, 3] 3 2 1
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, Literal, Unpack

from jaxstow._read.options import LoadOptions
from jaxstow._steps.keep import KeepPolicy
from jaxstow._steps.record import StepRecord
from jaxstow._util.progress import require_progress_bar
from jaxstow.checkpoint import recovery
from jaxstow.checkpoint.processes import Processes
from jaxstow.checkpoint.restoring import restore_step
from jaxstow.checkpoint.step_folder import StepFolder
from jaxstow.checkpoint.together import restore_together
from jaxstow.errors import ArgumentError, StepNotFoundError

__all__ = ["StepReading"]


class StepReading:
    """The reading half of a checkpoint manager, over the committed steps of ``folder``; ``policy`` holds the metric
    that :meth:`best_step` ranks by. Subclasses wait for their save in flight in :meth:`_settle`."""

    def __init__(self, folder: StepFolder, policy: KeepPolicy, *, progress: bool) -> None:
        self._folder = folder
        self._policy = policy
        self._progress = progress
        #: The step the last :meth:`restore` read and the steps it skipped (``fallback=True``); ``None`` before one.
        self.restored: recovery.Restored | None = None
        #: The processes that restore together, in a ``jax.distributed`` run.
        self._together: Processes | None = None

    @property
    def directory(self) -> str:
        """The directory, as given (a path or a URL)."""
        return self._folder.store.location

    def _settle(self) -> None:
        """Wait until every save made before is visible (nothing to wait for here)."""

    def _url(self, step: int, *parts: str) -> str:
        return self._folder.url(step, *parts)

    def _committed_steps(self) -> list[int]:
        return self._folder.committed()

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
        return recovery.damaged(self._folder, self._committed_steps(), verify=verify, progress=self._bar(progress))

    def latest_intact_step(self, *, verify: recovery.Verify = "data", progress: bool | None = None) -> int | None:
        """The newest committed step that is not damaged (see :meth:`damaged_steps`), or ``None``; steps older than
        the one found are not read. To restore it in one pass, use ``restore(fallback=True)``."""
        self._settle()
        verify = recovery.check_verify(verify)
        return recovery.newest_intact(
            self._folder, lambda: self._committed_steps()[::-1], verify=verify, progress=self._bar(progress)
        )

    def _bar(self, progress: bool | None) -> bool:
        if progress:
            require_progress_bar()
        return self._progress if progress is None else progress

    def steps(self) -> list[int]:
        """The committed steps, in increasing order (waits for the save in flight)."""
        self._settle()
        return self._committed_steps()

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

        Another process may save here meanwhile, and its keep policy delete the step being read: without ``step``
        the newest step then is restored instead (a step deleted is passed over up to 8 times in a row; locally the
        step's files are opened before any is read, and stay readable). A ``step`` that is not in the directory, or is
        deleted before it is read, raises a :class:`~jaxstow.errors.StepNotFoundError` naming the steps that are.

        Under ``jax.distributed`` call it in every process, as :meth:`save`: process 0 picks the step, and every
        process restores it or every process raises a :class:`~jaxstow.errors.CheckpointError` naming the step and
        each process that failed or did not report within the manager's ``process_timeout``
        (:mod:`jaxstow.checkpoint.together`).
        """
        options.setdefault("progress", self._progress)

        def restore(chosen: int) -> Any:
            return restore_step(self._folder, chosen, like, items, options)

        if self._together is not None and self._together.many:

            def choose() -> list[int]:
                newest = self._existing(step)
                return [older for older in reversed(self._committed_steps()) if older <= newest]

            tree, self.restored = restore_together(self._together, self._folder, choose, restore, fallback=fallback)
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
                return [older for older in reversed(self._committed_steps()) if step is None or older <= bound]

            tree, self.restored = recovery.restore_newest_intact(self._folder, candidates, restore)
            return tree
        # The newest step is restored; if the keep policy of the process that saves here deletes it meanwhile, a newer
        # one has been committed, and that one is restored instead.
        self._settle()
        trees: list[Any] = []

        def accept(chosen: int) -> bool:
            trees.append(restore(chosen))
            return True

        newest = recovery.newest_accepted(lambda: self._committed_steps()[::-1], accept)
        if newest is None:
            raise StepNotFoundError(f"{self.directory} holds no committed step to restore")
        self.restored = recovery.Restored(newest)
        return trees[0]
