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

import re
from collections.abc import Iterable

from jaxstow._storage.atomic import TEMPORARY_MARKER

__all__ = ["StepNames"]

_FIELD = re.compile(r"%0?\d*d")


class StepNames:
    """Names made from step numbers by a printf-style ``format`` with exactly one integer field (``%d``, ``%08d``)."""

    def __init__(self, format: str) -> None:
        fields = _FIELD.findall(format)
        if len(fields) != 1 or format.count("%") != 1:
            raise ValueError(f"a step name format needs exactly one integer field such as %d or %010d, not {format!r}")
        prefix, suffix = _FIELD.split(format)
        self.format = format
        self._pattern = re.compile(re.escape(prefix) + r"(\s*\d+)" + re.escape(suffix))

    def name(self, step: int) -> str:
        return self.format % step

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
