"""Which committed step a :meth:`~jaxstow.CheckpointManager.restore` reads, and where: the one asked for, the newest,
or the newest intact one (``fallback``); from the fastest tier that holds it in full where there is a local tier; the
same step in every process of a ``jax.distributed`` run.

>>> import tempfile, numpy as np
>>> from jaxstow import CheckpointManager
>>> from jaxstow._steps.names import StepNames
>>> from jaxstow._steps.record import RECORD_NAME
>>> from jaxstow._storage.store import open_store
>>> from jaxstow._coordination import Coordinator
>>> directory = tempfile.mkdtemp()
>>> with CheckpointManager(directory) as manager:
...     for step in (1, 2):
...         manager.save(step, {"w": np.full(2, step)})
>>> folder = StepFolder(open_store(directory, marker=RECORD_NAME), StepNames("%d"))
>>> def restore(step, folder):
...     return f"step {step} of {folder.store.location == directory and 'directory'}"
>>> coordinator = Coordinator(directory, timeout=60)
>>> restore_chosen(folder, None, restore, fallback=False, coordinator=coordinator, tiers=None, broadcast=None)
('step 2 of directory', Restored(step=2, skipped={}))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from jaxstow._coordination import Coordinator
from jaxstow.checkpoint import recovery
from jaxstow.checkpoint.settings import check_flags
from jaxstow.checkpoint.step_copies import copies_of, restore_intact_copy
from jaxstow.checkpoint.step_folder import StepFolder
from jaxstow.checkpoint.tier_restore import restore_tiers
from jaxstow.checkpoint.tiers import Tiers
from jaxstow.checkpoint.together import restore_together
from jaxstow.errors import CheckpointError, FormatError, NewerFormatError, StepNotFoundError

__all__ = ["restore_chosen"]

T = TypeVar("T")


def restore_chosen(
    folder: StepFolder,
    step: int | None,
    restore: Callable[[int, StepFolder], T],
    *,
    fallback: bool,
    coordinator: Coordinator,
    tiers: Tiers | None,
    broadcast: bool | None,
    items: Sequence[str] | None = None,
) -> tuple[T, recovery.Restored]:
    """``restore(chosen, folder_holding_it)`` of the step chosen: ``step`` (the newest committed one by default, and
    with ``fallback`` the newest intact one up to it) of ``folder`` or, without ``fallback``, of the local tier of
    ``tiers`` where it holds the newest; and the step restored. Under ``jax.distributed`` the processes agree on
    ``coordinator``, and boxes several of them hold are read once where ``broadcast`` says so (``None``: where it
    pays, :mod:`jaxstow.checkpoint.read_once`); every process must ask for the same ``items``. The caller has waited
    for its own save in flight."""
    check_flags(fallback=fallback)
    if coordinator.many:
        _check_same_request(coordinator, folder, step, fallback=fallback, items=items)
    if fallback or coordinator.many:
        return _restore_chosen(
            folder, step, restore, fallback=fallback, coordinator=coordinator, tiers=tiers, broadcast=broadcast
        )
    tried: list[tuple[int, StepFolder]] = []  # each step tried, and the folder it was read from

    def restore_noted(chosen: int, holder: StepFolder) -> T:
        tried.append((chosen, holder))
        return restore(chosen, holder)

    try:
        return _restore_chosen(
            folder, step, restore_noted, fallback=False, coordinator=coordinator, tiers=tiers, broadcast=broadcast
        )
    except FormatError as error:
        if tried and not isinstance(error, NewerFormatError):
            chosen, holder = tried[-1]
            where = run = folder.store.location
            if holder.store.location != run:  # the copy in the local tier is the damaged one
                where = recovery.local_tier_of(run, holder.store.location)
            error.args = (recovery.damage_advised(str(error), chosen, where), *error.args[1:])
        raise


def _restore_chosen(
    folder: StepFolder,
    step: int | None,
    restore: Callable[[int, StepFolder], T],
    *,
    fallback: bool,
    coordinator: Coordinator,
    tiers: Tiers | None,
    broadcast: bool | None,
) -> tuple[T, recovery.Restored]:
    if tiers is not None and not fallback:
        return restore_tiers(tiers, folder, step, restore, coordinator=coordinator, broadcast=broadcast)
    if tiers is not None and not coordinator.many:
        return _newest_intact_of_either_tier(folder, tiers, step, restore)

    def restore_here(chosen: int) -> T:
        return restore(chosen, folder)

    if coordinator.many:

        def choose() -> list[int]:
            newest = folder.existing(step)
            return [older for older in reversed(folder.committed()) if older <= newest]

        return restore_together(coordinator, folder, choose, restore_here, fallback=fallback, broadcast=broadcast)
    if step is not None and not fallback:
        chosen = folder.existing(step)
        return restore_here(chosen), recovery.Restored(chosen)
    if fallback:
        bound = folder.existing(step)

        def candidates() -> list[int]:
            """The steps to try, newest first; without ``step``, one committed meanwhile comes first."""
            return [older for older in reversed(folder.committed()) if step is None or older <= bound]

        return recovery.restore_newest_intact(folder, candidates, restore_here)
    # The newest step is restored; if the keep policy of the process that saves here deletes it meanwhile, a newer
    # one has been committed, and that one is restored instead.
    trees: list[T] = []

    def accept(chosen: int) -> bool:
        trees.append(restore_here(chosen))
        return True

    newest = recovery.newest_accepted(lambda: folder.committed()[::-1], accept)
    if newest is None:
        raise StepNotFoundError(f"{folder.store.location} holds no committed step to restore")
    return trees[0], recovery.Restored(newest)


def _newest_intact_of_either_tier(
    folder: StepFolder, tiers: Tiers, step: int | None, restore: Callable[[int, StepFolder], T]
) -> tuple[T, recovery.Restored]:
    """``restore(fallback=True)`` in one process with a local tier: the newest step up to ``step`` of either tier
    that restores intact from one of its copies (:mod:`~jaxstow.checkpoint.step_copies`), as
    :meth:`~jaxstow.CheckpointManager.latest_intact_step` finds it. Under ``jax.distributed`` a local step spans
    every process's tier, which no one process can check, and ``fallback`` restores from ``directory`` alone."""

    def held() -> list[int]:
        return sorted({*folder.committed(), *tiers.steps()})

    if step is not None and step not in held():
        raise StepNotFoundError(
            f"step {step} is neither in {folder.store.location} nor in the local tier {tiers.directory}; "
            f"their committed steps are {held()}"
        )

    def intact_copies(chosen: int) -> list[StepFolder]:
        """The copies from the first whose record and headers check (the last copy if none does)."""
        copies = copies_of(chosen, folder, tiers) or [folder]
        for number, copy in enumerate(copies):
            if recovery.step_damage(copy, chosen, verify="headers", progress=False) is None:
                return copies[number:]
        return copies[-1:]

    def candidates() -> list[int]:
        return [older for older in reversed(held()) if step is None or older <= step]

    return recovery.restore_newest_intact(
        folder,
        candidates,
        lambda chosen: restore_intact_copy(chosen, intact_copies(chosen), restore),
        folder_of=lambda chosen: intact_copies(chosen)[0],
    )


def _check_same_request(
    coordinator: Coordinator, folder: StepFolder, step: int | None, *, fallback: bool, items: Sequence[str] | None
) -> None:
    """Every process asked for the same ``step``, ``fallback`` and ``items``, which process 0 checks (a process's
    own ``step`` is never used to choose, so one that asked another would silently get process 0's, and the reads
    shared among the processes are planned for the same items in each); else a :class:`CheckpointError` in every
    process naming those that differ and what they asked."""
    where = folder.store.location
    asked = {"step": step, "fallback": fallback, "items": None if items is None else sorted(items)}
    with coordinator.conversation("restore-request") as talk:
        talk.tell("asked", asked)

        def compare() -> bool:
            wanted = "the latest step" if step is None else f"step {step}"
            heard = talk.collect("asked", waiting_for=f"the step it restores ({wanted} asked here) from {where}")
            requests = {index: message.value() for index, message in sorted(heard.items())}
            differ = [index for index, request in requests.items() if request != asked]
            if differ:
                raise CheckpointError(
                    "the processes asked to restore different steps: "
                    + "; ".join(f"process {index} {_described(requests[index])}" for index in [0, *differ])
                    + ": pass the same step=, fallback= and items= to restore() in every process",
                    file=where,
                )
            return True

        talk.decide("same", compare, waiting_for=f"the check of the step to restore from {where}")


def _described(request: dict[str, object]) -> str:
    items = "" if request["items"] is None else f", items={request['items']}"
    return f"asked restore(step={request['step']}, fallback={request['fallback']}{items})"
