"""When to save: every ``save_every`` steps, the first step of a run, and a preemption's step, as orbax decides.

Never a step at or before the newest one saved, committed or in flight. A preemption is jax's sync point in a
``jax.distributed`` run or, given a :class:`~jaxstow.checkpoint.preemption.PreemptionNotice`, the first step asked
about after one of its signals arrived (the preemption's step):

>>> from jaxstow.checkpoint.schedule import SaveSchedule
>>> schedule = SaveSchedule(save_every=100)
>>> wanted = []
>>> for step in (0, 50, 100, 150, 200):
...     if schedule.should_save(step, committed=lambda: []):
...         schedule.saved(step)
...         wanted.append(step)
>>> wanted, schedule.should_save(200, committed=lambda: []), schedule.reached_preemption(7)
([0, 100, 200], False, False)
>>> import os, signal
>>> from jaxstow.checkpoint.preemption import PreemptionNotice
>>> notice = PreemptionNotice([signal.SIGUSR1])
>>> schedule = SaveSchedule(save_every=100, notice=notice)
>>> os.kill(os.getpid(), signal.SIGUSR1)  # a scheduler's notice; SIGTERM in practice
>>> schedule.should_save(7, committed=lambda: [5]), schedule.reached_preemption(7), schedule.reached_preemption(8)
(True, True, False)
>>> notice.close()
"""

from __future__ import annotations

from collections.abc import Callable

from jaxstow.checkpoint.preemption import PreemptionNotice
from jaxstow.errors import ArgumentError

__all__ = ["SaveSchedule"]


class SaveSchedule:
    """Save every ``save_every`` steps (``1``: every step); it keeps the newest step saved, so that asking costs no
    read of storage (the committed steps are listed once, the first time). ``notice`` makes preemption a signal to
    this process (see :meth:`reached_preemption`); ``option`` is the argument that errors name."""

    def __init__(
        self, save_every: int = 1, *, notice: PreemptionNotice | None = None, option: str = "save_every"
    ) -> None:
        if isinstance(save_every, bool) or not isinstance(save_every, int) or save_every < 1:
            raise ArgumentError(f"{option} must be a positive integer, not {save_every!r}")
        self.save_every = save_every
        self.notice = notice
        self._committed: int | None = None  # the newest committed step, once listed
        self._known = False
        self._issued: int | None = None  # the newest step whose save was issued, committed or not
        self._preempted_at: int | None = None

    def saved(self, step: int) -> None:
        """Note a step whose save was issued (it counts from now on, committed or not)."""
        self._issued = step if self._issued is None else max(self._issued, step)

    def forget(self) -> None:
        """Forget the newest step (after a deletion): the next question lists the committed steps again."""
        self._known = False
        self._issued = None

    def should_save(self, step: int, *, committed: Callable[[], list[int]]) -> bool:
        """Whether to save ``step``; ``committed()`` lists the committed steps (of every tier the manager has, so that
        no tier saves a step at or before another's newest), asked only the first time."""
        if not self._known:
            steps = committed()
            self._committed, self._known = (steps[-1] if steps else None), True
        newest = max((known for known in (self._committed, self._issued) if known is not None), default=None)
        if newest is not None and step <= newest:
            return False
        preempted = self.reached_preemption(step)  # asked at every step, as jax's sync protocol needs
        return preempted or newest is None or step % self.save_every == 0

    def reached_preemption(self, step: int) -> bool:
        """Whether ``step`` is the step of a preemption. With a notice: the first step asked about (here or by
        :meth:`should_save`) after its signal arrived. Otherwise: whether every process has reached jax's
        preemption sync point at ``step`` (``multihost_utils.reached_preemption_sync_point``), always ``False``
        outside ``jax.distributed`` or with jax's preemption service turned off; every process must then ask at
        every step, with the same steps."""
        if self.notice is not None:
            if self.notice.received is None:
                return False
            if self._preempted_at is None:
                self._preempted_at = step
            return step == self._preempted_at
        from jax.experimental import multihost_utils

        try:
            return bool(multihost_utils.reached_preemption_sync_point(step))
        except RuntimeError:  # jax raises this when its preemption service is off (jax_enable_preemption_service)
            return False
