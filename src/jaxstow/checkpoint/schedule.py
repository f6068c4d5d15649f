"""When to save: every ``save_every`` steps, the first step of a run, and the step at which every process of a
``jax.distributed`` run has reached jax's preemption sync point (after a scheduler's preemption notice, SIGTERM by
default), as orbax's ``CheckpointManager.should_save`` decides. Never a step at or before the newest one saved.

>>> from jaxstow.checkpoint.schedule import SaveSchedule
>>> schedule = SaveSchedule(save_every=100)
>>> wanted = []
>>> for step in (0, 50, 100, 150, 200):
...     if schedule.should_save(step, committed=lambda: []):
...         schedule.saved(step)
...         wanted.append(step)
>>> wanted, schedule.should_save(200, committed=lambda: []), schedule.reached_preemption(7)
([0, 100, 200], False, False)
"""

from __future__ import annotations

from collections.abc import Callable

from jaxstow.errors import ArgumentError

__all__ = ["SaveSchedule"]


class SaveSchedule:
    """Save every ``save_every`` steps (``1``: every step); it keeps the newest step saved, so that asking costs no
    read of storage (the committed steps are listed once, the first time)."""

    def __init__(self, save_every: int = 1) -> None:
        if isinstance(save_every, bool) or not isinstance(save_every, int) or save_every < 1:
            raise ArgumentError(f"save_every must be a positive integer, not {save_every!r}")
        self.save_every = save_every
        self._newest: int | None = None
        self._known = False

    def saved(self, step: int) -> None:
        """Note a step that is being saved."""
        if self._known:
            self._newest = step if self._newest is None else max(self._newest, step)

    def forget(self) -> None:
        """Forget the newest step (after a deletion): the next question lists the committed steps again."""
        self._known = False

    def should_save(self, step: int, *, committed: Callable[[], list[int]]) -> bool:
        """Whether to save ``step``; ``committed()`` lists the committed steps, asked only the first time."""
        if not self._known:
            steps = committed()
            self._newest, self._known = (steps[-1] if steps else None), True
        if self._newest is not None and step <= self._newest:
            return False
        preempted = self.reached_preemption(step)  # asked at every step, as jax's sync protocol needs
        return preempted or self._newest is None or step % self.save_every == 0

    @staticmethod
    def reached_preemption(step: int) -> bool:
        """Whether every process has reached the preemption sync point at ``step`` (jax's
        ``multihost_utils.reached_preemption_sync_point``); always ``False`` outside ``jax.distributed`` or with jax's
        preemption service turned off. Every process must call it at every step, with the same steps."""
        from jax.experimental import multihost_utils

        try:
            return bool(multihost_utils.reached_preemption_sync_point(step))
        except RuntimeError:  # jax raises this when its preemption service is off (jax_enable_preemption_service)
            return False
