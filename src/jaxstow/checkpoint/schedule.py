"""When to save, the same in every process: every ``save_every`` steps, the first step of a run, and a preemption's
step, as orbax decides; never a step at or before the newest one saved, committed or in flight.

What is saved already is agreed once, at a manager's first :meth:`~jaxstow.CheckpointManager.should_save` or save,
by every process (:func:`agree_steps`): the persistent store's steps as process 0 lists them, the newest local step
(the largest over the processes) and the local steps every process holds. From then on the agreed steps follow the
saves made since (the same in every process), so asking costs no message and no read of storage:

>>> from jaxstow._coordination import Coordinator
>>> from jaxstow.checkpoint.schedule import SaveSchedule, agree_steps
>>> agreed = agree_steps(Coordinator("runs/a", timeout=60), lambda: [], None, where="runs/a", keep_local=None)
>>> schedule = SaveSchedule(save_every=100)
>>> wanted = []
>>> for step in (0, 50, 100, 150, 200):
...     if schedule.should_save(step, newest=agreed.newest):
...         agreed.issued(step)
...         wanted.append(step)
>>> wanted, schedule.should_save(200, newest=agreed.newest), schedule.reached_preemption(7)
([0, 100, 200], False, False)

A preemption is jax's sync point in a ``jax.distributed`` run or the signal of a
:class:`~jaxstow.checkpoint.preemption.PreemptionNotice` (:meth:`SaveSchedule.reached_preemption`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from jaxstow._coordination import Coordinator
from jaxstow._util.counts import count
from jaxstow.checkpoint.preemption import PreemptionNotice

__all__ = ["AgreedSteps", "SaveSchedule", "agree_steps"]


class SaveSchedule:
    """Save every ``save_every`` steps (``1``: every step) after the newest step saved. ``notice`` makes preemption a
    signal to this process (see :meth:`reached_preemption`); ``option`` is the argument that errors name."""

    def __init__(
        self, save_every: int = 1, *, notice: PreemptionNotice | None = None, option: str = "save_every"
    ) -> None:
        self.save_every = count(save_every, option)
        self.notice = notice
        self._preempted_at: int | None = None

    def should_save(self, step: int, *, newest: int | None) -> bool:
        """Whether to save ``step``, ``newest`` being the newest step saved in any tier (agreed), or ``None``."""
        if newest is not None and step <= newest:
            return False
        preempted = self.reached_preemption(step)  # asked at every step, as jax's sync protocol needs
        return preempted or newest is None or step % self.save_every == 0

    def reached_preemption(self, step: int) -> bool:
        """Whether ``step`` is the step of a preemption. With a notice: the first step asked about (here or by
        :meth:`should_save`) after its signal arrived. Otherwise: whether every process has reached jax's
        preemption sync point at ``step`` (``multihost_utils.reached_preemption_sync_point``), always ``False``
        outside ``jax.distributed`` or with jax's preemption service turned off; every process must then ask at
        every step, with the same steps.

        >>> import os, signal
        >>> from jaxstow.checkpoint.preemption import PreemptionNotice
        >>> from jaxstow.checkpoint.schedule import SaveSchedule
        >>> notice = PreemptionNotice([signal.SIGUSR1])
        >>> schedule = SaveSchedule(save_every=100, notice=notice)
        >>> os.kill(os.getpid(), signal.SIGUSR1)  # a scheduler's notice; SIGTERM in practice
        >>> schedule.should_save(7, newest=5), schedule.reached_preemption(7), schedule.reached_preemption(8)
        (True, True, False)
        >>> notice.close()
        """
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


class AgreedSteps:
    """The steps saved already, as every process agrees: ``persistent`` (the persistent store's), ``local`` (those
    every process's local tier holds, its newest ``keep_local`` kept as the local tiers keep theirs) and the newest
    step saved anywhere; then the saves issued and committed since, and the deletions process 0 made."""

    def __init__(self, persistent: Iterable[int], local: Iterable[int], newest: int | None, keep_local: int | None):
        self._persistent = set(persistent)
        self._local = set(local)
        self._newest = newest
        self._keep_local = keep_local
        self._lock = threading.Lock()  # deletions arrive on the writer's threads

    @property
    def newest(self) -> int | None:
        """The newest step saved, committed, in flight or failed, in any tier and any process."""
        return self._newest

    def holds(self, step: int) -> bool:
        """Whether ``step`` is saved already (in either tier, in every process)."""
        with self._lock:
            return step in self._persistent or step in self._local

    def persistent(self, step: int) -> bool:
        """Whether ``step`` is saved already in the persistent store."""
        with self._lock:
            return step in self._persistent

    def issued(self, step: int) -> None:
        """Note a save of ``step``: the newest step saved from now on, committed or not."""
        self._newest = step if self._newest is None else max(self._newest, step)

    def committed(self, step: int, *, persistent: bool) -> None:
        """Note ``step`` committed (process 0's outcome, heard by every process): to the persistent store, or to
        every process's local tier."""
        with self._lock:
            if persistent:
                self._persistent.add(step)
            else:
                self._local.add(step)
                if self._keep_local is not None:
                    self._local = set(sorted(self._local)[-self._keep_local :])

    def deleted(self, steps: Iterable[int]) -> None:
        """Note steps deleted from the persistent store."""
        with self._lock:
            self._persistent.difference_update(steps)


def agree_steps(
    coordinator: Coordinator,
    persistent: Callable[[], list[int]],
    local: Callable[[], list[int]] | None,
    *,
    where: str,
    keep_local: int | None,
) -> AgreedSteps:
    """The steps saved already, agreed by every process of ``coordinator``: ``persistent()`` listed by process 0,
    each process's ``local()`` (its local tier's committed steps, if it has one) heard by process 0, which decides;
    ``where`` names the persistent store in errors."""
    with coordinator.conversation("steps") as talk:
        if local is not None:
            try:
                talk.tell("local", local())
            except BaseException as error:
                talk.fail("local", error)
                raise

        def decide() -> dict[str, object]:
            listed = persistent()
            held: list[list[int]] = []
            if local is not None:
                heard = talk.collect("local", waiting_for="its local steps")
                held = [heard[index].value() for index in range(coordinator.count)]
            every = set.intersection(*map(set, held)) if held else set()
            newest = max([*listed, *(max(steps) for steps in held if steps)], default=None)
            return {"persistent": listed, "local": sorted(every), "newest": newest}

        agreed = talk.decide("steps", decide, waiting_for=f"the steps saved in {where}")
    newest = agreed["newest"]
    return AgreedSteps(agreed["persistent"], agreed["local"], None if newest is None else int(newest), keep_local)
