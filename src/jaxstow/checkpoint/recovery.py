"""Which committed steps restore as saved, and restoring the newest that does: what ``damaged_steps``,
``latest_intact_step`` and ``restore(fallback=True)`` check.

``verify="headers"`` checks a step's record (its own checksum), that every item file is there and that each file's
header is the one the record names. ``verify="data"`` checks that, then reads every stored leaf of every item and
compares it with its checksum, as ``jaxstow verify`` does: a flipped byte anywhere in a step is found.

>>> import os, tempfile, numpy as np
>>> from jaxstow import CheckpointManager
>>> directory = tempfile.mkdtemp()
>>> with CheckpointManager(directory) as manager:
...     for step in (1, 2):
...         manager.save(step, {"params": {"w": np.full(1000, step, np.float32)}})
>>> with open(os.path.join(directory, "2", "params.safetensors"), "r+b") as file:   # one flipped bit in the data
...     _ = file.seek(-10, os.SEEK_END)
...     byte = file.read(1)
...     _ = file.seek(-10, os.SEEK_END)
...     _ = file.write(bytes([byte[0] ^ 1]))
>>> manager = CheckpointManager(directory)
>>> manager.damaged_steps(verify="headers"), list(manager.damaged_steps())
({}, [2])
>>> manager.latest_intact_step(), manager.restore(fallback=True, as_numpy=True)["params"]["w"][0], manager.restored.step
(1, np.float32(1.0), 1)
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from jaxstow._read.verifying import verify_checksums
from jaxstow._steps.record import StepRecord
from jaxstow._util.progress import bar, format_bytes
from jaxstow.checkpoint.restoring import open_readers
from jaxstow.checkpoint.step_folder import StepFolder
from jaxstow.errors import ArgumentError, CheckpointError, FormatError

__all__ = ["Restored", "Verify", "check_verify", "damaged", "newest_intact", "restore_newest_intact", "step_damage"]

logger = logging.getLogger("jaxstow.checkpoint.manager")

Verify = Literal["headers", "data"]
T = TypeVar("T")


@dataclass(frozen=True)
class Restored:
    """The step a restore read, and the newer steps it skipped (``restore(fallback=True)``), each with the reason."""

    step: int
    skipped: dict[int, str] = field(default_factory=dict)


def check_verify(verify: str) -> Verify:
    if verify not in ("headers", "data"):
        raise ArgumentError(f'verify must be "data" (every leaf read and checked) or "headers", not {verify!r}')
    return verify  # type: ignore[return-value]


def step_damage(folder: StepFolder, step: int, *, verify: Verify, progress: bool) -> str | None:
    """Why ``step`` cannot be restored as saved, or ``None`` if it is intact (as far as ``verify`` checks)."""
    try:
        record = folder.read_record(step, check_files=verify == "headers")
        if verify == "data":
            return _data_damage(folder, record, progress=progress)
    except (FormatError, CheckpointError) as error:  # a damaged record or header, a missing file
        return str(error)
    return None


def _data_damage(folder: StepFolder, record: StepRecord, *, progress: bool) -> str | None:
    """Read every leaf of every item of a step; the first damage found (and how much more there is), or ``None``."""
    step = record.step
    with contextlib.ExitStack() as stack:
        readers = list(open_readers(stack, folder.open_files(record, sorted(record.files))).values())
        total = sum(leaf.nbytes for reader in readers for leaf in reader.stored.values())
        damage = []
        with bar(total, f"verifying step {step} of {folder.store.location}", enabled=progress) as read:
            for reader in readers:
                damage += verify_checksums(reader, read.update)[1]
        logger.info("%s: read and checked every leaf of step %d (%s)", folder.store.location, step, format_bytes(total))
    if not damage:
        return None
    more = f" (and {len(damage) - 1} more damaged leaves)" if len(damage) > 1 else ""
    return f"{damage[0]}{more}"


def restore_newest_intact(
    folder: StepFolder, candidates: Sequence[int], restore: Callable[[int], T]
) -> tuple[T, Restored]:
    """Restore the first step of ``candidates`` (newest first) whose record and headers check and whose restore reads
    only intact data; each step skipped is logged as a warning with its reason."""
    skipped: dict[int, str] = {}
    for step in candidates:
        problem = step_damage(folder, step, verify="headers", progress=False)
        if problem is None:
            try:
                return restore(step), Restored(step, skipped)
            except FormatError as error:  # damage in the data read, found by its checksum
                problem = str(error)
        skipped[step] = problem
        logger.warning("%s: step %d is damaged, skipped: %s", folder.store.location, step, problem)
    reasons = "; ".join(f"step {step}: {problem}" for step, problem in skipped.items())
    raise CheckpointError(
        f"{folder.store.location} holds no step that restores intact" + (f" ({reasons})" if reasons else "")
    )


def damaged(folder: StepFolder, steps: Sequence[int], *, verify: Verify, progress: bool) -> dict[int, str]:
    """Each of ``steps`` that is damaged, with the reason."""
    found = {step: step_damage(folder, step, verify=verify, progress=progress) for step in steps}
    return {step: problem for step, problem in found.items() if problem is not None}


def newest_intact(folder: StepFolder, steps: Sequence[int], *, verify: Verify, progress: bool) -> int | None:
    """The newest of ``steps`` that is intact; older steps are not read."""
    for step in reversed(steps):
        if step_damage(folder, step, verify=verify, progress=progress) is None:
            return step
    return None
