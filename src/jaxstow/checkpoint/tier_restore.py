"""Restoring from a manager with a local tier: the newest step held in full by the local tiers and the peers' copies,
else the newest one of the persistent store; the same tier and step in every process, decided once by process 0
from what every process reports it holds. See docs/scaling.md ("Two tiers and peers").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Container
from typing import Any, TypeVar

from jaxstow._coordination import Conversation, Coordinator
from jaxstow._steps.record import StepRecord
from jaxstow.checkpoint.copy_check import held_damage
from jaxstow.checkpoint.peer_copies import plan_local
from jaxstow.checkpoint.peer_reads import PeerStep
from jaxstow.checkpoint.recovery import Restored, damage_advised, local_tier_of
from jaxstow.checkpoint.step_copies import copies_of, restore_intact_copy
from jaxstow.checkpoint.step_folder import StepFolder
from jaxstow.checkpoint.tier_holdings import version_of
from jaxstow.checkpoint.tiers import Tier, Tiers
from jaxstow.checkpoint.together import restore_together
from jaxstow.errors import FormatError, NewerFormatError, StepNotFoundError

__all__ = ["choose", "restore_tiers"]

logger = logging.getLogger("jaxstow.checkpoint.manager")
T = TypeVar("T")


def choose(
    tiers: Tiers,
    talk: Conversation,
    persistent: list[int],
    bound: int | None,
    damaged: Container[str] = (),
    record_of: Callable[[int], StepRecord | None] = lambda step: None,
) -> tuple[Tier, int, StepFolder, dict[int, str]]:
    """The tier and step to restore, the same in every process: the newest step (at most ``bound``) held in full
    by the local tiers and peers' copies (but for this process's ``damaged`` folders), else the newest of
    ``persistent`` (process 0's listing); ``-1`` when there is none. Every process reports what it holds; process 0
    decides. With the local folder to read it from (whose files held elsewhere are read from the peers holding
    them), and the damage of each local step passed over because a process holds no intact copy of its files (the
    same in every process). ``record_of(step)`` (in process 0) is the persistent store's record of a step: where
    it holds a later save of the local tiers' newest step (a ``force=True`` elsewhere), that save is restored."""
    own = [step for step in tiers.steps() if bound is None or step <= bound]
    newest = max((step for step in persistent if bound is None or step <= bound), default=-1)
    coordinator = talk.coordinator
    if not coordinator.many:
        tier: Tier = "local" if own and own[-1] >= newest else "persistent"
        return tier, own[-1] if tier == "local" else newest, tiers.folder, {}
    try:
        held = tiers.holdings.inventory(bound, damaged)
    except BaseException as error:
        talk.fail("held", error)
        if coordinator.index == 0:
            talk.fail("plan/0", error)  # the decision the others wait for
        raise
    talk.tell("held", held)
    inventories: dict[int, Any] = {}
    skipped: dict[int, str] = {}  # local steps of which a process holds no intact copy of its files: the damage

    def decide() -> dict[str, Any]:
        if not inventories:
            reports = talk.collect("held", waiting_for="its local steps")
            inventories.update({index: message.value() for index, message in reports.items()})
        step, version, plan = plan_local(inventories, coordinator.count, bound, skipped)
        later = step == newest and _saved_later(record_of(newest), step, version, inventories)
        return (
            {"tier": "local", "step": step, "version": version, "plan": plan}
            if step >= max(newest, 0) and not later
            else {"tier": "persistent", "step": newest}
        )

    attempt = 0
    while True:
        choice = talk.decide(f"plan/{attempt}", decide, waiting_for="the step to restore")
        step = int(choice["step"])
        if choice["tier"] == "persistent" or tiers.peers is None:
            return choice["tier"], step, tiers.folder, skipped
        try:
            folder = tiers.peers.gather_step(step, str(choice["version"]), choice["plan"])
        except BaseException as error:
            talk.fail(f"gathered/{attempt}", error)
            raise
        damage = folder if isinstance(folder, str) else ""
        gathered = talk.gather(f"gathered/{attempt}", damage, waiting_for="its files of the step")
        if not isinstance(folder, str) and not any(gathered):
            return "local", step, folder, skipped
        # A process holds no intact copy of its files: the next step held, or the persistent one.
        skipped[step] = "; ".join(found for found in gathered if found)
        attempt += 1


def _saved_later(kept: StepRecord | None, step: int, version: str, inventories: dict[int, Any]) -> bool:
    """Whether ``kept``, the persistent record of ``step``, is another save of it than the local tiers' ``version``,
    saved after it."""
    if kept is None or version_of(kept) == version:
        return False
    times = [
        float(time)
        for held in inventories.values()
        for entries in held.values()
        for at, of, time in entries
        if int(at) == step and str(of) == version
    ]
    return kept.time > max(times, default=float("-inf"))


def restore_tiers(
    tiers: Tiers,
    persistent: StepFolder,
    step: int | None,
    restore: Callable[[int, StepFolder], T],
    *,
    coordinator: Coordinator,
    broadcast: bool | None,
) -> tuple[T, Restored]:
    """Restore ``step`` (the newest restorable one by default) from the fastest tier that holds it in full, the
    same in every process: ``restore(step, folder)`` reads it from the local tier's folder or ``persistent``
    (reading shared boxes once as ``broadcast`` says, :func:`~jaxstow.checkpoint.together.restore_together`).
    Under ``jax.distributed``, where the restore of a local step meets damage, every process checks the copies it
    read from (:func:`~jaxstow.checkpoint.copy_check.held_damage`) and the same step is restored again without the
    damaged ones: from the other copies of those files, or from the persistent tier; where neither holds it, the
    damage met is raised in every process."""
    listed = persistent.committed() if coordinator.index == 0 else []
    damaged: set[str] = set()  # this process's folders found damaged by this restore
    met: tuple[int, FormatError] | None = None  # the step whose restore met damage, and the damage
    while True:
        with coordinator.conversation("tiers") as talk:
            bound = step if met is None else met[0]
            tier, chosen, local, passed = choose(tiers, talk, listed, bound, damaged, persistent.unchecked_record)
        if met is not None and chosen != met[0]:  # held intact nowhere: the damage met, in every process
            raise met[1]
        if step is not None and chosen != step and step in passed:
            raise FormatError(damage_advised(passed[step], step, local_tier_of(persistent.store.location)))
        if chosen < 0 or (step is not None and chosen != step):
            what = "no step" if step is None else f"no step {step}"
            raise StepNotFoundError(f"{persistent.store.location} and the local tiers hold {what} to restore")
        folder = local if tier == "local" else persistent
        logger.info("%s: restoring step %d from the %s tier", persistent.store.location, chosen, tier)
        if not coordinator.many:
            if tier == "local":  # its copy in ``persistent`` too, where the local one is damaged
                return restore_intact_copy(chosen, copies_of(chosen, persistent, tiers), restore), Restored(chosen)
            return restore(chosen, folder), Restored(chosen)
        try:
            # A local step's files held elsewhere are read from the peers holding them, only the ranges needed.
            shared = broadcast if tier == "persistent" else False
            return _restore_step(
                coordinator, folder, chosen, restore, broadcast=shared, where=persistent.store.location
            )
        except FormatError as error:  # raised alike in every process: the damage met (a NewerFormatError is not)
            if isinstance(error, NewerFormatError) or not isinstance(local.store, PeerStep) or tier != "local":
                raise
            found = _damaged_copies(coordinator, local.store)
            if not any(found):
                raise
            damaged.update(found[coordinator.index])
            met = chosen, error


def _restore_step(
    coordinator: Coordinator,
    folder: StepFolder,
    step: int,
    restore: Callable[[int, StepFolder], T],
    *,
    broadcast: bool | None,
    where: str,
) -> tuple[T, Restored]:
    """``restore(step, folder)`` in every process together, without fallback, errors naming the run ``where``."""
    return restore_together(
        coordinator,
        folder,
        lambda: [step],
        lambda s: restore(s, folder),
        fallback=False,
        broadcast=broadcast,
        where=where,
        holder=where if folder.store.location == where else local_tier_of(where),
    )


def _damaged_copies(coordinator: Coordinator, step: PeerStep) -> list[list[str]]:
    """The folders each process found damaged among those it read ``step`` from, the same list in every process."""
    with coordinator.conversation("tiers-damage") as talk:
        try:
            found = list(held_damage(step))
        except BaseException as error:
            talk.fail("found", error)
            raise
        return [list(folders) for folders in talk.gather("found", found, waiting_for="its check of its copies")]
