"""Restoring from a manager with a local tier: the newest step held in full by the local tiers and the peers' copies,
else the newest one of the persistent store; the same tier and step in every process. See docs/scaling.md ("Two
tiers and peers").
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TypeVar

from jaxstow.checkpoint.peer_copies import plan_local
from jaxstow.checkpoint.recovery import Restored
from jaxstow.checkpoint.step_folder import StepFolder
from jaxstow.checkpoint.tiers import Tier, Tiers
from jaxstow.checkpoint.together import restore_together
from jaxstow.errors import StepNotFoundError

__all__ = ["choose", "restore_tiers"]

logger = logging.getLogger("jaxstow.checkpoint.manager")
T = TypeVar("T")


def choose(tiers: Tiers, key: str, persistent: list[int], bound: int | None) -> tuple[Tier, int, StepFolder]:
    """The tier and step to restore, the same in every process: the newest step (at most ``bound``) held in full
    by the local tiers and peers' copies, else the newest persistent one; ``-1`` when there is none. With the
    local folder to read it from (whose files held elsewhere are read from the peers holding them)."""
    own = [step for step in tiers.steps() if bound is None or step <= bound]
    newest = max((step for step in persistent if bound is None or step <= bound), default=-1)
    if not tiers.processes.many:
        return ("local", own[-1], tiers.folder) if own and own[-1] >= newest else ("persistent", newest, tiers.folder)
    processes = tiers.processes
    held = tiers.peers.inventory(own) if tiers.peers is not None else {str(processes.index): own}
    processes.send(f"{key}/held/{processes.index}", json.dumps(held))
    if processes.index == 0:
        reports = processes.gather({k: f"{key}/held/{k}" for k in range(processes.count)}, what="its local steps")
        inventories = {k: json.loads(report) for k, report in reports.items()}
        step, plan = plan_local(inventories, processes.count, bound)
        choice = {"tier": "local", "step": step, "plan": plan} if step >= max(newest, 0) else {"tier": "persistent"}
        processes.send(f"{key}/plan", json.dumps({**choice, "persistent": newest}))
    choice = json.loads(processes.receive(f"{key}/plan", sender=0, what="the step to restore"))
    if choice["tier"] == "persistent":
        return "persistent", int(choice["persistent"]), tiers.folder
    step = int(choice["step"])
    if tiers.peers is not None:
        return "local", step, tiers.peers.gather_step(step, choice["plan"], have=step in own)
    return "local", step, tiers.folder


def restore_tiers(
    tiers: Tiers, persistent: StepFolder, step: int | None, restore: Callable[[int, StepFolder], T]
) -> tuple[T, Restored]:
    """Restore ``step`` (the newest restorable one by default) from the fastest tier that holds it in full, the
    same in every process: ``restore(step, folder)`` reads it from the local tier's folder or ``persistent``."""
    processes = tiers.processes
    key = processes.next_exchange("tiers")
    listed = persistent.committed() if processes.index == 0 else []
    tier, chosen, local = choose(tiers, key, listed, step)
    if chosen < 0 or (step is not None and chosen != step):
        what = "no step" if step is None else f"no step {step}"
        raise StepNotFoundError(f"{persistent.store.location} and the local tiers hold {what} to restore")
    folder = local if tier == "local" else persistent
    logger.info("%s: restoring step %d from the %s tier", persistent.store.location, chosen, tier)
    if processes.many:
        # A local step's files held elsewhere are read from the peers holding them, only the ranges needed.
        return restore_together(
            processes,
            folder,
            lambda: [chosen],
            lambda s: restore(s, folder),
            fallback=False,
            broadcast=tier == "persistent",
        )
    return restore(chosen, folder), Restored(chosen)
