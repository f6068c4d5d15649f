"""An orbax CheckpointManager folder converted into a jaxstow checkpoint folder (``jaxstow convert ORBAX_RUN DST``):
every step saved as the same step, with its items and metrics, all of them or none.

>>> import os, tempfile, numpy as np, orbax.checkpoint as ocp
>>> from jaxstow import CheckpointManager
>>> from jaxstow.cli.convert_orbax_run import convert_manager
>>> folder = tempfile.mkdtemp()
>>> with ocp.CheckpointManager(os.path.join(folder, "orbax")) as orbax_manager:
...     _ = orbax_manager.save(3, args=ocp.args.StandardSave({"w": np.ones(2)}))
>>> convert_manager(os.path.join(folder, "orbax"), os.path.join(folder, "run"), progress=False)
1
>>> CheckpointManager(os.path.join(folder, "run")).restore(3)["w"].tolist()
[1.0, 1.0]
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
from typing import Any

from jaxstow._read import orbax_steps
from jaxstow._storage.atomic import rename_durably, temporary_sibling
from jaxstow._storage.failures import storage_failures
from jaxstow._storage.opening import local_path
from jaxstow.checkpoint import CheckpointManager
from jaxstow.cli.files import storage
from jaxstow.cli.output import printable
from jaxstow.errors import JaxstowError, PathError

__all__ = ["convert_manager"]


def convert_manager(src: str, dst: str, *, progress: bool) -> int:
    """Every step of an orbax CheckpointManager folder saved as the same step of a jaxstow checkpoint folder, with
    its items and metrics (a step of the one item ``default`` as one tree, as orbax restores it).

    A new local folder is written under a temporary name and then renamed: it appears whole, or not at all, even if
    the command is killed. Into a folder that holds a run already, or at a URL, the steps converted are removed again
    if one fails or the command is interrupted."""
    folder = os.path.abspath(local_path(src) or src)
    steps = orbax_steps.manager_steps(folder, every=True)
    target = local_path(dst)
    if target is None or (os.path.lexists(target) and not (os.path.isdir(target) and not os.listdir(target))):
        _convert_steps(folder, steps, dst, progress=progress)
        return len(steps)
    staging = temporary_sibling(target)
    try:
        _convert_steps(folder, steps, staging, progress=progress)
        with storage_failures(target, doing="make the folder"):
            rename_durably(staging, target)  # over an empty folder too
    except BaseException as error:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(error, JaxstowError):
            _told_as(error, staging, target)
        raise
    return len(steps)


def _told_as(error: JaxstowError, staging: str, target: str) -> None:
    """``error`` naming the folder asked for, ``target``, where it names the temporary one it was written as."""
    pairs = [(os.path.abspath(staging), os.path.abspath(target)), (staging, target)]
    for temporary, asked in pairs:
        error.args = tuple(arg.replace(temporary, asked) if isinstance(arg, str) else arg for arg in error.args)
        error.file = error.file.replace(temporary, asked) if error.file is not None else None


def _convert_steps(folder: str, steps: list[tuple[int, str]], dst: str, *, progress: bool) -> None:
    """The steps of the orbax folder ``folder`` saved into the jaxstow run at ``dst``; all of them, or none."""
    settings = storage(dst)
    with CheckpointManager(
        dst, progress=progress, storage_options=settings.options, transfer=settings.transfer
    ) as manager:
        if held := sorted(set(manager.steps()) & {step for step, _ in steps}):
            raise PathError(
                f"holds step{'s' * (len(held) > 1)} {', '.join(map(str, held))} already: convert into a new folder, "
                "or remove it first",
                file=dst,
            )
        begun: list[int] = []
        background = logging.getLogger("jaxstow._write.background")  # its failures are this command's error
        background.disabled, was = True, background.disabled
        try:
            for step, name in steps:
                tree, metrics = orbax_steps.read_step(os.path.join(folder, name))
                numbers, other = _numbers(metrics)
                if other:
                    print(
                        f"note: step {step}: metrics that are not numbers are left out (the step's metadata keeps "
                        f"them whole, as orbax_metrics): {printable(', '.join(other))}",
                        file=sys.stderr,
                    )
                begun.append(step)
                manager.save(step, tree, metrics=numbers, metadata={"orbax_metrics": metrics} if other else None)
                manager.wait()  # committed before the next is read: a failure is this step's
        except BaseException:  # all or nothing: the steps begun so far go (a full disk gets their space back)
            with contextlib.suppress(BaseException):
                manager.wait()  # a step interrupted in flight ends first, then goes too
            for step in begun:
                with contextlib.suppress(JaxstowError):
                    manager.delete(step)
            raise
        finally:
            background.disabled = was


def _numbers(metrics: Any, prefix: str = "") -> tuple[dict[str, float], list[str]]:
    """The numbers among ``metrics`` (nested dicts flattened to ``a/b``), and the rest, each named with why it is not
    one: a value of another kind, an integer too large for a float, a name given twice (``a/b`` beside ``a: {b}``),
    metrics that are no JSON object.

    >>> _numbers({"loss": 0.5, "a/b": 1, "a": {"b": 2}, "big": 10**400, "name": "x"})
    ({'loss': 0.5}, ['a/b (a name given twice)', 'big (too large for a float)', 'name'])
    >>> _numbers([1, 2])
    ({}, ['the metrics, a list, not a JSON object'])
    """
    if metrics is not None and not isinstance(metrics, dict):
        return {}, [f"the metrics, a {type(metrics).__name__}, not a JSON object"]
    numbers: dict[str, float] = {}
    other: list[str] = []
    twice: set[str] = set()
    for name, value in (metrics or {}).items():
        key = f"{prefix}{name}"
        if isinstance(value, dict):
            inner, rest = _numbers(value, f"{key}/")
        elif isinstance(value, int | float) and not isinstance(value, bool):
            try:
                inner, rest = {key: float(value)}, []
            except OverflowError:
                inner, rest = {}, [f"{key} (too large for a float)"]
        else:
            inner, rest = {}, [key]
        twice |= numbers.keys() & inner.keys()
        numbers.update(inner)
        other += rest
    for key in sorted(twice):
        del numbers[key]
    return numbers, sorted(other + [f"{key} (a name given twice)" for key in twice])
