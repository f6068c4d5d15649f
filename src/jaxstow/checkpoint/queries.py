"""What a :class:`~jaxstow.CheckpointManager` tells about its committed steps: their metrics, metadata, items, the
best one by a metric and the damaged ones.
"""

from __future__ import annotations

import contextlib
from typing import Any, Literal

from jaxstow._steps.keep import KeepPolicy
from jaxstow._steps.record import StepRecord
from jaxstow._util.progress import require_progress_bar
from jaxstow.checkpoint import recovery
from jaxstow.checkpoint.step_folder import StepFolder
from jaxstow.errors import ArgumentError, StepNotFoundError

__all__ = ["StepQueries"]


class StepQueries:
    """The questions about committed steps that a manager answers from its folder and keep policy."""

    _folder: StepFolder
    _policy: KeepPolicy
    _progress: bool

    def _settle(self) -> None:
        """Wait for the save in flight (the manager's own)."""
        raise NotImplementedError

    def steps(self) -> list[int]:
        """The committed steps (the manager's own)."""
        raise NotImplementedError

    def _record(self, step: int) -> StepRecord:
        return self._folder.record(step)

    def damaged_steps(self, *, verify: recovery.Verify = "data", progress: bool | None = None) -> dict[int, str]:
        """The committed steps that cannot be restored as saved, each with the reason (waits for the save in flight).

        Args:
            verify: ``"data"`` reads every leaf and checks its checksum, as ``jaxstow verify`` does (a flipped byte
                anywhere is found); ``"headers"`` checks only the records, the files' presence and their headers.
            progress: Draw a bar of the bytes read per step (the manager's setting by default).
        """
        self._settle()
        verify = recovery.check_verify(verify)
        return recovery.damaged(self._folder, self._folder.committed(), verify=verify, progress=self._bar(progress))

    def latest_intact_step(self, *, verify: recovery.Verify = "data", progress: bool | None = None) -> int | None:
        """The newest committed step that is not damaged (see :meth:`damaged_steps`, whose arguments it takes), or None.

        Older steps are not read. To restore it in one pass, use ``restore(fallback=True)``.
        """
        self._settle()
        verify = recovery.check_verify(verify)
        return recovery.newest_intact(
            self._folder, lambda: self._folder.committed()[::-1], verify=verify, progress=self._bar(progress)
        )

    def _bar(self, progress: bool | None) -> bool:
        if progress:
            require_progress_bar()
        return self._progress if progress is None else progress

    def best_step(self, metric: str | None = None, *, mode: Literal["min", "max"] | None = None) -> int | None:
        """The committed step with the best value of ``metric``: the newest of equals, or ``None`` if no step has one.

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
        """The metrics saved with ``step`` (non-finite values read back as ``None``)."""
        return self._record(self._existing(step)).metrics

    def metadata(self, step: int) -> dict[str, Any] | None:
        """The metadata saved with ``step``."""
        return self._record(self._existing(step)).metadata

    def items(self, step: int) -> list[str] | None:
        """The names of the items of ``step``, or ``None`` if it was saved as one tree."""
        record = self._record(self._existing(step))
        return None if record.single else sorted(record.files)
