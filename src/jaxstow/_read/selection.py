"""Choosing leaves by path pattern: ``select=["params/**"]`` restores only what matches.

A pattern is a leaf path in which ``*`` stands for any part of one path segment, ``?`` for one character and ``**``
for any number of whole segments. A pattern also selects everything below the path it names, so ``"params"`` and
``"params/**"`` are the same. An empty dict key is an empty segment: the leaf ``{"a": {"": x}}`` holds is ``"a/"``,
which ``"a"``, ``"a/"``, ``"a/*"`` and ``"**"`` select.

>>> from jaxstow._read.selection import Selection
>>> selection = Selection(["params/**", "step"])
>>> [path for path in ["params/dense/kernel", "opt_state/mu", "step"] if selection.matches(path)]
['params/dense/kernel', 'step']
>>> Selection(["layers/*/bias"]).matches("layers/0/bias")
True
>>> [Selection(pattern).matches("a/") for pattern in ("a", "a/", "a/*", "**", "a/?")]
[True, True, True, True, False]
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from jaxstow.errors import ArgumentError, SelectionError

__all__ = ["LeafPaths", "Selection"]

_SEGMENTS = "(?:[^/]*/)*"  # any number of whole segments, empty ones (empty dict keys) too
_WILDCARDS = {"*": "[^/]*", "?": "[^/]"}


def _compile(pattern: str) -> re.Pattern[str]:
    """A regex that matches ``path + "/"`` for every path the pattern selects."""
    body = ""
    for segment in pattern.split("/"):
        if segment == "**":
            body += _SEGMENTS
        else:
            body += "".join(_WILDCARDS.get(char, re.escape(char)) for char in segment) + "/"
    return re.compile(body + _SEGMENTS)


class LeafPaths(tuple[str, ...]):
    """Leaf paths chosen already (a step's selection, spread over its items): each selects itself, none of its
    characters a wildcard."""


class Selection:
    """A set of path patterns; a path is selected when any of them matches it."""

    def __init__(self, patterns: str | Sequence[str]) -> None:
        self.patterns = (
            [patterns] if isinstance(patterns, str) else list(patterns) if isinstance(patterns, Sequence) else []
        )
        if not self.patterns or not all(isinstance(pattern, str) for pattern in self.patterns):
            raise ArgumentError(f"select takes path patterns (strings), not {patterns!r}")
        exact = isinstance(patterns, LeafPaths)
        self._compiled = [
            re.compile(re.escape(pattern) + "/" + _SEGMENTS) if exact else _compile(pattern)
            for pattern in self.patterns
        ]

    def matches(self, path: str) -> bool:
        """Whether any pattern selects ``path``."""
        return any(compiled.fullmatch(path + "/") for compiled in self._compiled)

    def choose(self, paths: Iterable[str], *, file: str | None = None) -> list[str]:
        """The selected paths, in order; a pattern that matches none of them is an error naming it."""
        paths = list(paths)
        unmatched = [
            pattern
            for pattern, compiled in zip(self.patterns, self._compiled, strict=True)
            if not any(compiled.fullmatch(path + "/") for path in paths)
        ]
        if unmatched:
            shown = ", ".join(paths[:8]) + (", ..." if len(paths) > 8 else "")
            raise SelectionError(
                f"select pattern{'s' if len(unmatched) > 1 else ''} {', '.join(map(repr, unmatched))} match no leaf "
                f"(the leaves are {shown or 'none'})",
                file=file,
            )
        return [path for path in paths if self.matches(path)]
