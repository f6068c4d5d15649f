"""Step numbers in names, and back: ``'%d'`` names the manager's step folders, ``'%010d.npz'`` Objax's files.

A name counts as a step only if it is exactly what the format makes of its number and holds no temporary marker, so
stray files, unfinished writes and ``007`` next to ``7`` are never taken for steps.

>>> from jaxstow._steps.names import StepNames
>>> names = StepNames("%010d.npz")
>>> names.name(42)
'0000000042.npz'
>>> names.steps(["0000000042.npz", "0000000007.npz", "notes.txt", "42.npz", ".0000000050.npz.jaxstow-tmp-1-ab"])
[7, 42]
"""

from __future__ import annotations

import operator
import os
import re
from collections.abc import Iterable
from typing import Any

from jaxstow._storage.atomic import TEMPORARY_MARKER
from jaxstow.errors import ArgumentError

__all__ = ["StepNames", "check_step"]

_FIELD = re.compile(r"%0?\d*d")


def check_step(step: Any, *, what: str = "a step", negative: bool = False) -> int:
    """``step`` as an ``int``: a non-negative (or, with ``negative``, any) Python, numpy or jax integer, or a 0-d
    integer array such as ``nnx.Optimizer.step``'s value; anything else (a float, a bool, a negative number) is an
    :class:`~jaxstow.errors.ArgumentError` that names ``what`` it is and the value.

    >>> import jax.numpy as jnp, numpy as np
    >>> check_step(3), check_step(np.int64(4)), check_step(jnp.asarray(5, jnp.uint32))
    (3, 4, 5)
    >>> check_step(2.7, what="idx")
    Traceback (most recent call last):
    ...
    jaxstow.errors.ArgumentError: idx must be a non-negative integer (Python, numpy or a 0-d jax integer array), not 2.7
    """
    try:
        number = None if isinstance(step, bool) else operator.index(step)
    except TypeError:  # floats, bools, arrays with elements or of another kind, tracers
        number = None
    if number is None or (number < 0 and not negative):
        kind = "an integer" if negative else "a non-negative integer"
        raise ArgumentError(f"{what} must be {kind} (Python, numpy or a 0-d jax integer array), not {step!r}")
    return number


class StepNames:
    """Names made from step numbers by a printf-style ``format`` with exactly one integer field (``%d``, ``%08d``)."""

    def __init__(self, format: str) -> None:
        fields = _FIELD.findall(format)
        if len(fields) != 1 or format.count("%") != 1:
            raise ArgumentError(
                f"a step name format needs exactly one integer field such as %d or %010d, not {format!r}"
            )
        if "/" in format or os.sep in format:  # its names would be in subfolders, which no listing of steps reads
            raise ArgumentError(
                f"a step name format names a file or folder in one folder, without a folder separator, not {format!r} "
                "(to keep the steps in another folder, name that folder instead, e.g. DIR_NAME)"
            )
        prefix, suffix = _FIELD.split(format)
        self.format = format
        self._pattern = re.compile(re.escape(prefix) + r"(\s*\d+)" + re.escape(suffix))

    def name(self, step: int) -> str:
        """The name of ``step``; an :class:`~jaxstow.errors.ArgumentError` unless it is a non-negative integer (a float
        or a negative number would make the name of another step, or one never read back as a step)."""
        return self.format % check_step(step)

    def step(self, name: str) -> int | None:
        """The step that ``name`` stands for, or ``None`` if it is not a step name."""
        match = self._pattern.fullmatch(name)
        if match is None or TEMPORARY_MARKER in name:
            return None
        step = int(match.group(1))
        return step if self.name(step) == name else None

    def steps(self, names: Iterable[str]) -> list[int]:
        """The steps among ``names``, in increasing order."""
        return sorted(step for step in map(self.step, names) if step is not None)
