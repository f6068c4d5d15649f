"""The conversation of a save in which every process saves the same step, so that one skipped save costs one step.

Each save conversation starts with the step every process saves, heard by process 0, which publishes them all. Where
they differ (a process skipped a save, an error it caught before calling save, or came to it after the others gave
up on it; or made one more), nothing is written: a process whose step is below the largest raises a
:class:`~jaxstow.errors.CheckpointError` naming every process's step, and the processes of the largest take their
save to the next conversation, where the others' next save meets it. So the next save that every process makes of
one step pairs up and commits, as every later one does. One process is the case N=1: it always agrees with itself.

>>> from jaxstow._coordination import Coordinator
>>> talk = paired_save(Coordinator("runs/b", timeout=60), 7, where="runs/b/7")
>>> talk.name.endswith("save1")
True
>>> talk.close()
"""

from __future__ import annotations

import logging

from jaxstow._coordination import Conversation, Coordinator
from jaxstow.errors import CheckpointError

__all__ = ["paired_save"]

logger = logging.getLogger("jaxstow.checkpoint.manager")


def paired_save(coordinator: Coordinator, step: int, *, where: str) -> Conversation:
    """The next save conversation of ``coordinator`` in which every process saves ``step`` (not closed: the save's);
    ``where`` (the step's folder) names it in errors.

    Raises:
        CheckpointError: Another process saves a later step in this call (the conversation is closed), or a process
            did not tell its step within the timeout.
    """
    talk = coordinator.conversation("save")
    while True:
        try:
            steps = _steps(talk, step, where=where)
        except BaseException:
            talk.close()
            raise
        if len(set(steps)) == 1:
            return talk
        talk.close()
        listed = ", ".join(f"process {index}: step {each}" for index, each in enumerate(steps))
        top = max(steps)
        if step < top:
            raise CheckpointError(
                f"step {step} is not saved: the processes' saves met with other steps ({listed}); a process skipped a "
                "save (an error it caught before calling save?), came to it after the others gave up on it, or made "
                f"one more. The processes at step {top} wait for the others' next save: the next save that every "
                f"process makes of step {top} (or of a later step) commits",
                file=where,
            )
        logger.warning(
            "%s: the save of step %d met saves of other steps (%s); it waits for their next", where, step, listed
        )
        talk = coordinator.conversation("save")


def _steps(talk: Conversation, step: int, *, where: str) -> list[int]:
    """The step each process saves in ``talk``, in process order: heard by process 0, which tells every process."""
    talk.tell("step", step)

    def every_step() -> list[int]:
        heard = talk.collect("step", waiting_for=f"the step it saves (step {step} here, {where})")
        return [int(heard[index].value()) for index in range(talk.coordinator.count)]

    return [
        int(each)
        for each in talk.decide("steps", every_step, waiting_for=f"the steps of the save of step {step} ({where})")
    ]
