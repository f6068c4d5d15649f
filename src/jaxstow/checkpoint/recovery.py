"""Which committed steps restore as saved, and restoring the newest that does (``restore(fallback=True)``).

``verify="headers"`` checks a step's record, its files' presence and headers; ``verify="data"`` also reads every
leaf against its checksum, as ``jaxstow verify`` does. See docs/checkpointing.md ("Recovering from damage").

Damage is what a step's own bytes, read whole, say: a record or header that does not check, a missing file, a leaf
that fails its checksum (a :class:`~jaxstow.errors.FormatError` or :class:`~jaxstow.errors.CheckpointError`). A
storage that fails to give the bytes (a :class:`~jaxstow.errors.StorageError`, raised once its retries are spent:
docs/object-storage.md) says nothing of the step: it ends every call here, and no step is skipped or listed for it.

>>> import pathlib, tempfile, numpy as np
>>> from jaxstow import CheckpointManager
>>> directory = tempfile.mkdtemp()
>>> with CheckpointManager(directory) as manager:
...     for step in (1, 2):
...         manager.save(step, {"params": {"w": np.full(1000, step, np.float32)}})
>>> file = pathlib.Path(directory, "2", "params.safetensors")
>>> data = bytearray(file.read_bytes())
>>> data[-10] ^= 1  # one flipped bit in the data
>>> _ = file.write_bytes(data)
>>> manager = CheckpointManager(directory)
>>> manager.damaged_steps(verify="headers"), list(manager.damaged_steps())
({}, [2])
>>> manager.latest_intact_step(), manager.restore(fallback=True, as_numpy=True)["params"]["w"][0], manager.restored.step
(1, np.float32(1.0), 1)
"""

from __future__ import annotations

import contextlib
import errno
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from jaxstow._read.verifying import verify_checksums
from jaxstow._steps.record import StepRecord
from jaxstow._util.progress import bar, format_bytes
from jaxstow.checkpoint.restoring import open_readers
from jaxstow.checkpoint.step_folder import StepFolder
from jaxstow.errors import (
    ArgumentError,
    CheckpointError,
    CorruptFileError,
    FormatError,
    JaxstowError,
    NewerFormatError,
    PathError,
    StepNotFoundError,
    StorageError,
)

__all__ = [
    "VANISHED",
    "Restored",
    "Verify",
    "check_verify",
    "damage_advised",
    "damaged",
    "described",
    "newest_accepted",
    "restore_newest_intact",
    "step_damage",
]

logger = logging.getLogger("jaxstow.checkpoint.manager")

Verify = Literal["headers", "data"]
T = TypeVar("T")

#: How many steps in a row a read may find deleted (by the keep policy of the process that saves there) before it
#: gives up: each one means that a newer step was committed meanwhile, so a read that keeps losing the race is slower
#: than the saves.
VANISHED = 8


@dataclass(frozen=True)
class Restored:
    """The step a restore read, and the newer steps it skipped (``restore(fallback=True)``), each with the reason."""

    step: int
    skipped: dict[int, str] = field(default_factory=dict)


def check_verify(verify: str) -> Verify:
    if verify not in ("headers", "data"):
        raise ArgumentError(f'verify must be "data" (every leaf read and checked) or "headers", not {verify!r}')
    return verify  # type: ignore[return-value]


def newest_accepted(choose: Callable[[], Sequence[int]], accept: Callable[[int], bool]) -> int | None:
    """The first step that ``choose()`` lists (newest first) which ``accept`` accepts, or ``None``. Each step is tried
    once, and the steps are listed again before each: a step committed meanwhile comes next. A step that ``accept``
    finds deleted (a :class:`~jaxstow.errors.StepNotFoundError`) is passed over, up to :data:`VANISHED` of them.

    >>> listings = iter([[3, 2, 1], [5, 3, 2, 1], [5, 3]])
    >>> newest_accepted(lambda: next(listings, []), lambda step: step == 5)
    5
    """
    tried: set[int] = set()
    vanished = 0
    while (step := next((step for step in _listed(choose) if step not in tried), None)) is not None:
        tried.add(step)
        try:
            if accept(step):
                return step
        except StepNotFoundError as error:
            vanished += 1
            if vanished == VANISHED:
                raise StepNotFoundError(
                    f"{error}. That is {VANISHED} steps in a row deleted while they were read: the process that saves "
                    "there deletes steps faster than they are read; keep more of them (keep=KeepPolicy(keep_last=...))"
                ) from None
    return None


def _listed(choose: Callable[[], Sequence[int]]) -> Sequence[int]:
    """``choose()``, listed again (up to 3 times) while it is empty: a listing that saw only a step the keep policy
    deleted before its record was read, and not yet the newer step whose commit came first, is empty for an instant."""
    for _ in range(3):
        if steps := choose():
            return steps
    return choose()


def step_damage(folder: StepFolder, step: int, *, verify: Verify, progress: bool) -> str | None:
    """Why ``step`` cannot be restored as saved, or ``None`` if it is intact (as far as ``verify`` checks); a
    :class:`~jaxstow.errors.StepNotFoundError` if it is deleted meanwhile, and the storage's own
    :class:`~jaxstow.errors.StorageError` if it fails, neither of which is damage."""

    def data_damage(record: StepRecord) -> str | None:
        damage = _data_damage(folder, record, progress=progress)
        if damage:  # read again: bytes damaged on their way are not
            damage = _data_damage(folder, record, progress=progress)
        return described(damage)

    if verify == "data":
        problem = _damage_of(lambda: folder.while_replaced(step, data_damage))
    else:
        problem = _damage_of(lambda: folder.read_record(step, check_files=verify == "headers"))
        if isinstance(problem, CorruptFileError):  # read again: bytes damaged on their way, or in a local copy, are not
            reread = folder.in_store() if folder.evict_damaged_copy(problem) else folder
            problem = _damage_of(lambda: reread.read_record(step, check_files=verify == "headers"))
    return None if problem is None else str(problem)


def _damage_of(check: Callable[[], str | object]) -> JaxstowError | str | None:
    """What ``check()`` finds wrong with a step: the error it raised that is damage, or the damage it returned (a
    string); ``None`` where it found none. Any other error is raised."""
    try:
        found = check()
    except JaxstowError as error:
        if not is_damage(error):
            raise
        return error
    return found if isinstance(found, str) else None


def is_damage(error: JaxstowError) -> bool:
    """Whether ``error``, met reading a step, says that the step is damaged: its record or a header does not check,
    an item file is missing or is no regular file (a folder, a pipe, a device, a symbolic link to itself); not that the
    step is gone (:class:`~jaxstow.errors.StepNotFoundError`) or that the storage failed."""
    if isinstance(error, StorageError):
        return error.errno == errno.ELOOP
    newer_or_gone = isinstance(error, NewerFormatError | StepNotFoundError)  # a newer jaxstow's: nothing is damaged
    return isinstance(error, FormatError | CheckpointError | PathError) and not newer_or_gone


def _data_damage(folder: StepFolder, record: StepRecord, *, progress: bool) -> list[CorruptFileError]:
    """Read every leaf of every item of a step; the damage found."""
    step = record.step
    with contextlib.ExitStack() as stack:
        readers = list(open_readers(stack, folder.open_files(record, sorted(record.files))).values())
        total = sum(leaf.nbytes for reader in readers for leaf in reader.stored.values())
        damage = []
        with bar(total, f"verifying step {step} of {folder.store.location}", enabled=progress) as read:
            for reader in readers:
                damage += verify_checksums(reader, read.update)[1]
        logger.info("%s: read and checked every leaf of step %d (%s)", folder.store.location, step, format_bytes(total))
    return damage


def described(damage: list[CorruptFileError]) -> str | None:
    """The first damage found (and how much more there is), or ``None``."""
    if not damage:
        return None
    more = f" (and {len(damage) - 1} more damaged leaves)" if len(damage) > 1 else ""
    return f"{damage[0]}{more}"


def restore_newest_intact(
    folder: StepFolder,
    choose: Callable[[], Sequence[int]],
    restore: Callable[[int], T],
    *,
    folder_of: Callable[[int], StepFolder] | None = None,
) -> tuple[T, Restored]:
    """Restore the first step ``choose()`` lists (newest first, see :func:`newest_accepted`) whose record and
    headers check and whose restore reads only intact data; each step skipped is logged as a warning with its reason,
    and a step deleted meanwhile is passed over. A failing storage ends it with its StorageError. ``folder_of(step)``
    is where a step is read (``folder`` by default: a local tier's steps are read from it)."""
    skipped: dict[int, str] = {}
    restored: list[T] = []

    def accept(step: int) -> bool:
        holder = folder if folder_of is None else folder_of(step)
        problem = step_damage(holder, step, verify="headers", progress=False)
        if problem is None:
            try:  # ``restore`` reads again data that fails its checksum once: bytes damaged on their way are not
                restored.append(restore(step))
                return True
            except FormatError as error:  # damage in the data read, found by its checksum
                problem = str(error)
        skipped[step] = str(problem)
        holder.damaged.add(step)
        logger.warning("%s: step %d is damaged, skipped: %s", holder.store.location, step, problem)
        return False

    step = newest_accepted(choose, accept)
    if step is not None:
        return restored[0], Restored(step, skipped)
    reasons = "; ".join(f"step {step}: {problem}" for step, problem in skipped.items())
    where = folder.store.location if folder_of is None else f"{folder.store.location} or its local tier"
    raise CheckpointError(f"{where} holds no step that restores intact" + (f" ({reasons})" if reasons else ""))


def damaged(folder: StepFolder, steps: Sequence[int], *, verify: Verify, progress: bool) -> dict[int, str]:
    """Each of ``steps`` that is damaged, with the reason; a step deleted meanwhile is not."""
    found = {}
    for step in steps:
        with contextlib.suppress(StepNotFoundError):
            found[step] = step_damage(folder, step, verify=verify, progress=progress)
    folder.damaged.update(step for step, problem in found.items() if problem is not None)
    return {step: problem for step, problem in found.items() if problem is not None}


def local_tier_of(run: str, folder: str | None = None) -> str:
    """The local tier of the run ``run`` that holds a damaged step, as the damage is said: this process's ``folder``,
    or, without it, every process's (each process holds its own files of a step).

    >>> local_tier_of("runs/a", "/ssd/a"), local_tier_of("runs/a")
    ('the local tier /ssd/a of runs/a', 'the local tiers of runs/a')
    """
    return f"the local tiers of {run}" if folder is None else f"the local tier {folder} of {run}"


def damage_advised(problem: str, step: int, where: str) -> str:
    """The damage a restore of ``step`` met, said to be the step's, with what to restore instead.

    >>> print(damage_advised("leaf 'w' of runs/a/6/w.safetensors: checksum mismatch", 6, "runs/a"))
    step 6 of runs/a is damaged: leaf 'w' of runs/a/6/w.safetensors: checksum mismatch; restore another step: manager.latest_intact_step() gives the newest intact one, and manager.restore(fallback=True) restores it
    """
    return (
        f"step {step} of {where} is damaged: {problem}; restore another step: manager.latest_intact_step() gives "
        "the newest intact one, and manager.restore(fallback=True) restores it"
    )
