"""One step restored by every process of a ``jax.distributed`` run: the same step everywhere, or an error everywhere.

Each process reads only what its own devices hold, so one process can meet damage that the others never read.
Process 0 picks the steps to try and sends them; every process restores the step and reports to process 0, whose
one verdict every process follows: all return their trees, or all raise a :class:`~jaxstow.errors.CheckpointError`
naming the step and each process that failed or did not report. With ``fallback``, damage found by any process moves
all of them to the next older step together. See docs/scaling.md ("Restoring together").
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Sequence
from typing import TypeVar, cast

from jaxstow._coordination import Coordinator
from jaxstow._read.broadcast import broadcasting
from jaxstow.checkpoint.peer_copies import open_transport
from jaxstow.checkpoint.processes import Processes
from jaxstow.checkpoint.recovery import Restored, step_damage
from jaxstow.checkpoint.step_folder import StepFolder
from jaxstow.errors import CheckpointError, FormatError

__all__ = ["restore_together"]

logger = logging.getLogger("jaxstow.checkpoint.manager")

T = TypeVar("T")
_OK = "ok"
_DAMAGE = "damaged: "
_FAILED = "failed: "


def restore_together(
    processes: Processes,
    folder: StepFolder,
    choose: Callable[[], Sequence[int]],
    restore: Callable[[int], T],
    *,
    fallback: bool,
    broadcast: bool = True,
) -> tuple[T, Restored]:
    """Restore in every process the first of the steps ``choose()`` gives in process 0 (newest first) that restores
    everywhere; without ``fallback`` only the first. With ``broadcast``, a box that several processes need is read
    by one of them and sent to the others."""
    key = processes.next_exchange("restore")
    where = folder.store.location
    steps = _agree_on_steps(processes, key, choose, fallback=fallback, where=where)
    with contextlib.ExitStack() as stack:
        if processes.many and broadcast:  # boxes that several processes need are read once and sent (docs/scaling.md)
            coordinator = Coordinator(f"{where}/restore/{key}", timeout=processes.timeout)
            transport = open_transport(coordinator)
            stack.callback(transport.close)
            stack.enter_context(broadcasting(transport))
        return _restore_first(processes, key, folder, steps, restore, fallback=fallback)


def _restore_first(
    processes: Processes,
    key: str,
    folder: StepFolder,
    steps: list[int],
    restore: Callable[[int], T],
    *,
    fallback: bool,
) -> tuple[T, Restored]:
    """Try ``steps`` in turn, every process together, until one restores everywhere."""
    where = folder.store.location
    skipped: dict[int, str] = {}
    for step in steps:
        tree, report, error = _attempt(folder, step, restore, fallback=fallback)
        if processes.index != 0:
            processes.send(f"{key}/{step}/{processes.index}", report)
            if error is not None and report.startswith(_FAILED):
                raise error  # this process's own error; the others learn of it from process 0's verdict
        verdict = _verdict(processes, key, step, report, where=where)
        if verdict == _OK:
            return cast(T, tree), Restored(step, skipped)
        if error is not None and report.startswith(_FAILED):
            raise error
        if not verdict.startswith(_DAMAGE):
            raise CheckpointError(
                f"step {step} was not restored in every process ({verdict.removeprefix(_FAILED)})", file=where
            )
        skipped[step] = verdict.removeprefix(_DAMAGE)
        logger.warning("%s: step %d is damaged, skipped: %s", where, step, skipped[step])
    reasons = "; ".join(f"step {step}: {problem}" for step, problem in skipped.items())
    raise CheckpointError(
        f"{where} holds no step that restores intact in every process" + (f" ({reasons})" if reasons else "")
    )


def _verdict(processes: Processes, key: str, step: int, report: str, *, where: str) -> str:
    """Process 0 gathers every process's report on ``step`` and sends the verdict: ``ok``, the damage found (to try
    an older step), or what failed; the others wait for it."""
    if processes.index != 0:
        return processes.receive(
            f"{key}/{step}/verdict",
            sender=0,
            what=f"the outcome of the restore of step {step} ({where})",
            timeout=processes.timeout + processes.grace,
        )
    try:
        reports = processes.gather(
            {k: f"{key}/{step}/{k}" for k in processes.others}, what=f"its restore of step {step} ({where})"
        )
    except CheckpointError as error:
        verdict = _FAILED + str(error)
    else:
        reports[0] = report
        failed = {k: found for k, found in sorted(reports.items()) if found != _OK}
        reasons = "; ".join(f"process {k} {found}" for k, found in failed.items())
        fatal = any(found.startswith(_FAILED) for found in failed.values())
        verdict = _OK if not failed else (_FAILED if fatal else _DAMAGE) + reasons
    processes.send(f"{key}/{step}/verdict", verdict)
    return verdict


def _agree_on_steps(
    processes: Processes, key: str, choose: Callable[[], Sequence[int]], *, fallback: bool, where: str
) -> list[int]:
    """The steps to try, newest first: chosen by process 0 and sent to the others."""
    if processes.index == 0:
        try:
            steps = list(choose())[: None if fallback else 1]
        except BaseException as error:
            processes.send(f"{key}/steps", json.dumps({"error": f"{type(error).__name__}: {error}"}))
            raise
        processes.send(f"{key}/steps", json.dumps({"steps": steps}))
        return steps
    message = json.loads(processes.receive(f"{key}/steps", sender=0, what=f"the step to restore from {where}"))
    if "error" in message:
        raise CheckpointError(f"process 0 could not choose a step to restore: {message['error']}", file=where)
    return [int(step) for step in message["steps"]]


def _attempt(
    folder: StepFolder, step: int, restore: Callable[[int], T], *, fallback: bool
) -> tuple[T | None, str, BaseException | None]:
    """This process's restore of ``step``: the tree and ``ok``, or the report of what went wrong and the error.
    Damage (a damaged record, header or leaf) is what ``fallback`` moves past; any other error ends the restore."""
    try:
        if fallback:
            damage = step_damage(folder, step, verify="headers", progress=False)
            if damage is not None:
                return None, _DAMAGE + damage, None
        return restore(step), _OK, None
    except FormatError as error:
        return None, (_DAMAGE if fallback else _FAILED) + f"{type(error).__name__}: {error}", error
    except Exception as error:
        return None, _FAILED + f"{type(error).__name__}: {error}", error
