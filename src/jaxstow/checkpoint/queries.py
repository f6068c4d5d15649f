"""What a :class:`~jaxstow.CheckpointManager` tells about its committed steps: which there are, their metrics,
metadata, items, the best one by a metric and the damaged ones.

With a local tier (``local=LocalTier(...)``) a step counts wherever it is held, in this process's local tier or in the
persistent ``directory``: a new host whose local tier is empty sees the steps of ``directory``, and a step held only
locally (not due in ``directory``, or its copy still to come) is listed, ranked and described like any other.

Under ``jax.distributed`` the queries answer from what this process sees: they start no agreement with the other
processes, so that a query made in one process only (a log line of process 0's) waits for no one; a local step
counts where this process's local directory holds files of it (its tier, or a tier another process left there after
a restart on other hosts), as a restore counts it. What a run decides
from (which step is due, whether a step exists) is agreed (:mod:`jaxstow.checkpoint.schedule`), and
:meth:`~jaxstow.CheckpointManager.restore` agrees on the step it restores.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Literal

from jaxstow._steps.keep import KeepPolicy
from jaxstow._steps.record import StepRecord
from jaxstow._util.progress import require_progress_bar
from jaxstow.checkpoint import recovery
from jaxstow.checkpoint.step_copies import copies_of
from jaxstow.checkpoint.step_folder import StepFolder, check_step
from jaxstow.checkpoint.tiers import Tier, Tiers
from jaxstow.errors import ArgumentError, StepNotFoundError

__all__ = ["StepQueries"]


class StepQueries:
    """The questions about committed steps that a manager answers from its folder and keep policy."""

    _folder: StepFolder
    _tiers: Tiers | None
    _policy: KeepPolicy
    _progress: bool

    def _settle(self) -> None:
        """Wait for the save in flight (the manager's own)."""
        raise NotImplementedError

    def steps(self, tier: Tier | None = None) -> list[int]:
        """The committed steps, in increasing order (waits for the save in flight); with ``local_directory``, those
        of either tier, or of ``tier`` (``"local"``: this process's local tier and the tiers other processes left in
        its local directory, as a restore counts them; ``"persistent"``: ``directory``).

        Raises:
            ArgumentError: ``tier`` is not one of these, or is ``"local"`` for a manager without ``local_directory``.
        """
        if tier not in (None, "local", "persistent"):
            raise ArgumentError(f"tier must be 'local', 'persistent' or None (either tier), not {tier!r}")
        if tier == "local" and self._tiers is None:
            raise ArgumentError(
                f"the manager of {self._folder.store.location} has no local tier, so steps(tier='local') has nothing "
                "to list: make it with local=LocalTier(...), or ask steps() for the steps of its directory"
            )
        self._settle()
        return self._listed(tier)

    def latest_step(self, tier: Tier | None = None) -> int | None:
        """The newest committed step (of ``tier``, see :meth:`steps`), or ``None`` if there is none."""
        steps = self.steps(tier)
        return steps[-1] if steps else None

    def _listed(self, tier: Tier | None = None) -> list[int]:
        """The committed steps of ``tier`` (of either by default), without waiting for the save in flight."""
        persistent = self._folder.committed() if tier != "local" else []
        local = self._tiers.held_steps() if self._tiers is not None and tier != "persistent" else []
        return sorted({*persistent, *local})

    def _record(self, step: int) -> StepRecord:
        """The record of a committed step, from the local tier where it holds the step (its record's checksum
        checked: under jax.distributed it holds only this process's files), else from ``directory``."""
        local = self._tiers.held().get(step) if self._tiers is not None else None
        return local.checked_record(step) if local is not None else self._folder.record(step)

    def _held(self, step: int) -> int:
        """``step`` once the save in flight is done, if a tier holds it; else a :class:`StepNotFoundError`."""
        self._settle()
        step = check_step(step)
        if self._tiers is None:
            return self._folder.existing(step)
        steps = self._listed()
        if step not in steps:
            raise StepNotFoundError(
                f"step {step} is neither in {self._folder.store.location} nor in the local tier "
                f"{self._tiers.directory}; their committed steps are {steps}"
            )
        return step

    def damaged_steps(self, *, verify: recovery.Verify = "data", progress: bool | None = None) -> dict[int, str]:
        """The committed steps that cannot be restored as saved, each with the reason (waits for the save in flight):
        with a local tier (in one process), each step with a damaged copy, in the local tier or in ``directory``
        (a new host reads the latter); a restore reads the other copy of a step held in both while one is intact.
        Every copy is read from its storage, never from ``cache_dir``'s copies: the answer is a fresh host's.

        Args:
            verify: ``"data"`` reads every leaf and checks its checksum, as ``jaxstow verify`` does (a flipped byte
                anywhere is found); ``"headers"`` checks only the records, the files' presence and their headers.
            progress: Draw a bar of the bytes read per step (the manager's setting by default).
        """
        self._settle()
        verify = recovery.check_verify(verify)
        bar = self._bar(progress)
        found = {}
        for step in self._restorable():
            problems = [
                problem
                for folder in self._copies(step)
                if (problem := recovery.damaged(folder, [step], verify=verify, progress=bar).get(step)) is not None
            ]
            if problems:
                found[step] = "; ".join(problems)
        return found

    def latest_intact_step(self, *, verify: recovery.Verify = "data", progress: bool | None = None) -> int | None:
        """The newest committed step that restores intact (see :meth:`damaged_steps`, whose arguments it takes): with
        a local tier, one of whose copies is intact; or None.

        Older steps are not read. To restore it in one pass, use ``restore(fallback=True)``.
        """
        self._settle()
        verify = recovery.check_verify(verify)
        bar = self._bar(progress)

        def intact(step: int) -> bool:
            for folder in self._copies(step):
                if recovery.step_damage(folder, step, verify=verify, progress=bar) is None:
                    return True
                folder.damaged.add(step)  # the keep policy keeps it for a look, and does not count it
            return False

        return recovery.newest_accepted(lambda: self._restorable()[::-1], intact)

    def _restorable(self) -> list[int]:
        """The committed steps a restore reads, as :meth:`_copies` finds them. Under ``jax.distributed`` a local
        step spans every process's tier, which no one process can check: the directory's steps only."""
        if self._tiers is None or self._tiers.coordinator.many:
            return self._folder.committed()
        return sorted({*self._folder.committed(), *self._tiers.steps()})

    def _copies(self, step: int) -> list[StepFolder]:
        """The copies of ``step`` a query of damage checks: in one process with a local tier, its copies there and in
        the directory (:func:`~jaxstow.checkpoint.step_copies.copies_of`); else the directory's. Each is read as a
        host without the cache's copies reads it (:meth:`~jaxstow.checkpoint.step_folder.StepFolder.in_store`): a
        step is intact or damaged as the store holds it."""
        if self._tiers is None or self._tiers.coordinator.many:
            copies = [self._folder]
        else:
            copies = copies_of(step, self._folder, self._tiers) or [self._folder]
        return [folder.in_store() for folder in copies]

    def _bar(self, progress: bool | None) -> bool:
        if progress:
            require_progress_bar()
        return self._progress if progress is None else progress

    def best_step(self, metric: str | None = None, *, mode: Literal["min", "max"] | None = None) -> int | None:
        """The committed step (of either tier) with the best value of ``metric``: the newest of equals, or ``None``
        if no step has one.

        Args:
            metric: The metric to rank by (the manager's ``metric`` by default); steps without a finite value of it
                are left out.
            mode: ``"min"`` (the lowest is best) or ``"max"`` (the manager's ``mode`` by default).

        Raises:
            ArgumentError: Neither ``metric`` nor the manager's ``metric`` is given.
        """
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
        """The metrics saved with ``step``, held by either tier (NaN reads back as ``None``, infinities as they
        are): a copy, which the caller may change without changing what the keep policy ranks."""
        metrics = self._record(self._held(step)).metrics
        return None if metrics is None else dict(metrics)

    def metadata(self, step: int) -> dict[str, Any] | None:
        """The metadata saved with ``step``, held by either tier: a copy, which the caller may change."""
        metadata = self._record(self._held(step)).metadata
        return None if metadata is None else copy.deepcopy(metadata)

    def items(self, step: int) -> list[str] | None:
        """The names of the items of ``step`` (held by either tier), or ``None`` if it was saved as one tree."""
        record = self._record(self._held(step))
        return None if record.single else sorted(record.files)
