"""Restoring from a manager with a local tier: the newest step held in full by the local tiers and the peers' copies,
else the newest one of the persistent store; the same tier and step in every process, decided once by process 0
from what every process reports it holds. See docs/scaling.md ("Two tiers and peers").
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from jaxstow._coordination import Conversation, Coordinator
from jaxstow.checkpoint.peer_copies import plan_local
from jaxstow.checkpoint.recovery import Restored, damage_advised
from jaxstow.checkpoint.step_copies import copies_of, restore_intact_copy
from jaxstow.checkpoint.step_folder import StepFolder
from jaxstow.checkpoint.tiers import Tier, Tiers
from jaxstow.checkpoint.together import restore_together
from jaxstow.errors import FormatError, StepNotFoundError

__all__ = ["choose", "restore_tiers"]

logger = logging.getLogger("jaxstow.checkpoint.manager")
T = TypeVar("T")


def choose(
    tiers: Tiers, talk: Conversation, persistent: list[int], bound: int | None
) -> tuple[Tier, int, StepFolder, dict[int, str]]:
    """The tier and step to restore, the same in every process: the newest step (at most ``bound``) held in full
    by the local tiers and peers' copies, else the newest of ``persistent`` (process 0's listing); ``-1`` when
    there is none. Every process reports what it holds; process 0 decides. With the local folder to read it from
    (whose files held elsewhere are read from the peers holding them), and the damage of each local step passed
    over because a process holds no intact copy of its files (the same in every process)."""
    own = [step for step in tiers.steps() if bound is None or step <= bound]
    newest = max((step for step in persistent if bound is None or step <= bound), default=-1)
    coordinator = talk.coordinator
    if not coordinator.many:
        tier: Tier = "local" if own and own[-1] >= newest else "persistent"
        return tier, own[-1] if tier == "local" else newest, tiers.folder, {}
    try:
        held = tiers.holdings.inventory(bound)
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
        return (
            {"tier": "local", "step": step, "version": version, "plan": plan}
            if step >= max(newest, 0)
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
    (reading shared boxes once as ``broadcast`` says, :func:`~jaxstow.checkpoint.together.restore_together`)."""
    listed = persistent.committed() if coordinator.index == 0 else []
    with coordinator.conversation("tiers") as talk:
        tier, chosen, local, damaged = choose(tiers, talk, listed, step)
    if step is not None and chosen != step and step in damaged:
        raise FormatError(damage_advised(damaged[step], step, persistent.store.location))
    if chosen < 0 or (step is not None and chosen != step):
        what = "no step" if step is None else f"no step {step}"
        raise StepNotFoundError(f"{persistent.store.location} and the local tiers hold {what} to restore")
    folder = local if tier == "local" else persistent
    logger.info("%s: restoring step %d from the %s tier", persistent.store.location, chosen, tier)
    if coordinator.many:
        # A local step's files held elsewhere are read from the peers holding them, only the ranges needed.
        return restore_together(
            coordinator,
            folder,
            lambda: [chosen],
            lambda s: restore(s, folder),
            fallback=False,
            broadcast=broadcast if tier == "persistent" else False,
            where=persistent.store.location,
        )
    if tier == "local":  # its copy in ``persistent`` too, where the local one is damaged
        return restore_intact_copy(chosen, copies_of(chosen, persistent, tiers), restore), Restored(chosen)
    return restore(chosen, folder), Restored(chosen)
