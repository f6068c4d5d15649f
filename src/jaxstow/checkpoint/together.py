"""One step restored by every process of a ``jax.distributed`` run: the same step everywhere, or an error everywhere.

Each process reads only what its own devices hold, so one process can meet damage that the others never read. The
processes agree in one :class:`~jaxstow._coordination.Conversation`: process 0 picks the steps to try, and whether
boxes several processes hold are read once (:mod:`jaxstow.checkpoint.read_once`), and says so; every process
restores the step and reports; process 0's one verdict every process follows: all return their trees, or all raise
a :class:`~jaxstow.errors.CheckpointError` naming the step and each process that failed or did not report. With
``fallback``, damage found by any process moves all of them to the next older step together; without, every process
raises one :class:`~jaxstow.errors.FormatError` saying the step is damaged, where, and what to restore instead. A box read once is
gathered over jax's collectives (:mod:`jaxstow._read.broadcast`) only after that verdict says every process read its
ranges, so a process that died or stalled is named within ``process_timeout`` and no process waits for it in a
collective. See docs/scaling.md ("Restoring together").
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

import jax

from jaxstow._coordination import Conversation, Coordinator
from jaxstow._read import gathering
from jaxstow._read.broadcast import Exchange, Pending, reading_once
from jaxstow.checkpoint.read_once import pays
from jaxstow.checkpoint.recovery import Restored, damage_advised, step_damage
from jaxstow.checkpoint.step_folder import StepFolder
from jaxstow.errors import CheckpointError, FormatError, NewerFormatError

__all__ = ["restore_together"]

logger = logging.getLogger("jaxstow.checkpoint.manager")

T = TypeVar("T")
_OK = "ok"
_DAMAGE = "damaged: "
_FAILED = "failed: "
_UNABLE = "unable"  # the ranges of a process that cannot take part in collectives across processes


def restore_together(
    coordinator: Coordinator,
    folder: StepFolder,
    choose: Callable[[], Sequence[int]],
    restore: Callable[[int], T],
    *,
    fallback: bool,
    broadcast: bool | None,
    where: str | None = None,
    holder: str | None = None,
) -> tuple[T, Restored]:
    """Restore in every process the first of the steps ``choose()`` gives in process 0 (newest first) that restores
    everywhere; without ``fallback`` only the first. A box that several processes need is read once and gathered
    where ``broadcast`` says so (``None``: where it pays, :func:`~jaxstow.checkpoint.read_once.pays`). Errors name
    the run ``where`` (``folder``'s location by default: a local tier's differs between processes), and the damage
    of a step the folders that hold it, ``holder`` (``where`` by default)."""
    with coordinator.conversation("restore") as talk:
        steps, once = _start(talk, folder, choose, fallback=fallback, broadcast=broadcast)
        where = folder.store.location if where is None else where
        holder = where if holder is None else holder
        return _restore_first(talk, folder, steps, restore, fallback=fallback, once=once, where=where, holder=holder)


def _start(
    talk: Conversation,
    folder: StepFolder,
    choose: Callable[[], Sequence[int]],
    *,
    fallback: bool,
    broadcast: bool | None,
) -> tuple[list[int], bool]:
    """The steps to try, newest first, and whether shared boxes are read once: chosen by process 0 (which reads
    once only if it can take part in collectives across processes itself)."""
    where = folder.store.location

    def decide() -> dict[str, Any]:
        steps = list(choose())[: None if fallback else 1]
        once = pays(folder.store, broadcast)
        if once and not gathering.available():
            logger.log(
                logging.WARNING if broadcast else logging.INFO,
                "%s: every process reads what it restores: jax's collectives do not reach across processes here "
                "(on CPU: jax.config.update('jax_cpu_collectives_implementation', 'gloo'))",
                where,
            )
            once = False
        return {"steps": steps, "once": once}

    decision = talk.decide("start", decide, waiting_for=f"the step to restore from {where}")
    return [int(step) for step in decision["steps"]], bool(decision["once"])


def _restore_first(
    talk: Conversation,
    folder: StepFolder,
    steps: list[int],
    restore: Callable[[int], T],
    *,
    fallback: bool,
    once: bool,
    where: str,
    holder: str,
) -> tuple[T, Restored]:
    """Try ``steps`` in turn, every process together, until one restores everywhere."""
    skipped: dict[int, str] = {}
    for step in steps:
        able = not once or gathering.available()
        exchange = Exchange() if once and able else None
        tree, report, error = _attempt(folder, step, restore, fallback=fallback, exchange=exchange)
        ranges = exchange.digest() if exchange is not None else "" if able else _UNABLE
        if error is None and ranges != _UNABLE:
            ranges += "/" + _global_layout(tree)  # global arrays on other shardings: each side thinks it holds its own
        if talk.coordinator.index != 0 and error is not None and report.startswith(_FAILED):
            talk.tell(f"{step}/report", {"outcome": report, "ranges": ranges})
            raise error  # this process's own error; the others learn of it from process 0's verdict
        verdict = _verdict(talk, step, report, ranges, where=where)
        if verdict == _OK:
            if exchange is not None:
                tree = _gathered(talk, exchange, step, tree, where=where)
            return cast(T, tree), Restored(step, skipped)
        if error is not None and report.startswith(_FAILED):
            raise error
        if not verdict.startswith(_DAMAGE):
            raise CheckpointError(
                f"step {step} was not restored in every process ({verdict.removeprefix(_FAILED)})", file=where
            )
        skipped[step] = verdict.removeprefix(_DAMAGE)
        if not fallback:  # the same error in every process, where only one may have met the damage
            raise FormatError(damage_advised(skipped[step], step, holder))
        logger.warning("%s: step %d is damaged, skipped: %s", where, step, skipped[step])
    reasons = "; ".join(f"step {step}: {problem}" for step, problem in skipped.items())
    raise CheckpointError(
        f"{where} holds no step that restores intact in every process" + (f" ({reasons})" if reasons else "")
    )


def _global_layout(tree: Any) -> str:
    """A digest of where the arrays of ``tree`` that span processes lie: their shapes and shardings, which every
    process must restore alike (arrays of this process's devices alone may differ)."""
    parts = [
        f"{index}:{leaf.shape}:{getattr(getattr(leaf.sharding, 'mesh', None), 'shape', None)}:"
        f"{getattr(leaf.sharding, 'spec', leaf.sharding)}"
        for index, leaf in enumerate(jax.tree.leaves(tree))
        if isinstance(leaf, jax.Array | Pending) and not leaf.sharding.is_fully_addressable  # Pending: to be gathered
    ]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def _verdict(talk: Conversation, step: int, report: str, ranges: str, *, where: str) -> str:
    """Every process reports on ``step``; process 0 decides the verdict: ``ok``, the damage found (to try an older
    step), or what failed (a process that did not report within the timeout, or that expects other ranges to gather
    than process 0)."""
    talk.tell(f"{step}/report", {"outcome": report, "ranges": ranges})

    def judge() -> str:
        try:
            reports = talk.collect(f"{step}/report", waiting_for=f"its restore of step {step} ({where})")
        except CheckpointError as error:
            return _FAILED + str(error)
        outcomes = {index: message.value() for index, message in sorted(reports.items())}
        failed = {index: found["outcome"] for index, found in outcomes.items() if found["outcome"] != _OK}
        if failed:
            reasons = "; ".join(f"process {index} {found}" for index, found in failed.items())
            fatal = any(found.startswith(_FAILED) for found in failed.values())
            return (_FAILED if fatal else _DAMAGE) + reasons
        unable = [index for index, found in outcomes.items() if found["ranges"] == _UNABLE]
        if unable:
            return _FAILED + (
                f"process {', '.join(map(str, unable))} cannot take part in collectives across processes, which "
                "process 0 reads shared boxes once with: call jax.config.update('jax_cpu_collectives_implementation', "
                "'gloo') in every process, or pass broadcast_restore=False"
            )
        differ = [index for index, found in outcomes.items() if found["ranges"] != outcomes[0]["ranges"]]
        if differ:
            return _FAILED + (
                f"processes {', '.join(map(str, differ))} restore other sharded leaves, or onto other shardings, than "
                "process 0: pass the same like=, items= and sharding= in every process"
            )
        return _OK

    return str(
        talk.decide(f"{step}/verdict", judge, waiting_for=f"the outcome of the restore of step {step} ({where})")
    )


def _gathered(talk: Conversation, exchange: Exchange, step: int, tree: Any, *, where: str) -> Any:
    """``tree`` with the boxes that several processes hold gathered among them; each wave of gathers after the
    first behind a barrier bounded by the timeout."""

    def barrier(name: str) -> None:
        talk.barrier(f"{step}/{name}", waiting_for=f"its part of the gather of step {step} ({where})")

    try:
        return exchange.deliver(tree, barrier)
    except CheckpointError:
        raise
    except Exception as error:  # jax's runtime raises its own error types from a collective
        raise CheckpointError(
            f"step {step} was read by every process, but gathering the boxes several processes hold failed: "
            f"{type(error).__name__}: {error}",
            file=where,
        ) from error


def _attempt(
    folder: StepFolder, step: int, restore: Callable[[int], T], *, fallback: bool, exchange: Exchange | None
) -> tuple[T | None, str, BaseException | None]:
    """This process's restore of ``step`` (its shared boxes' ranges read for ``exchange``): the tree and ``ok``, or
    the report of what went wrong and the error. Damage (a damaged record, header or leaf) is what ``fallback``
    moves past, and without it the error every process raises; any other error ends the restore."""
    try:
        if fallback:
            damage = step_damage(folder, step, verify="headers", progress=False)
            if damage is not None:
                return None, _DAMAGE + damage, None
        if exchange is None:
            return restore(step), _OK, None
        with reading_once(exchange, folder.url(step)):
            return restore(step), _OK, None
    except FormatError as error:
        newer = isinstance(error, NewerFormatError) and not fallback  # not damage: this jaxstow is too old
        return None, (_FAILED if newer else _DAMAGE) + f"{type(error).__name__}: {error}", error
    except Exception as error:
        return None, _FAILED + f"{type(error).__name__}: {error}", error
