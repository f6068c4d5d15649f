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

from collections.abc import Callable, Iterable, Sequence

from jaxstow.errors import ArgumentError, SelectionError

__all__ = ["LeafPaths", "Selection"]


def _pattern(pattern: str) -> Callable[[str], bool]:
    """Whether a path is selected by ``pattern``: its segments, then any number of whole segments (everything below).

    Matched segment by segment, in time that grows with the lengths of the pattern and the path (a regular expression
    of the pattern would backtrack through a long key exponentially often).
    """
    segments = pattern.split("/")

    def matches(path: str) -> bool:
        parts = path.split("/")
        reached = {0}  # the numbers of the path's segments matched so far, along each way
        for segment in segments:
            if segment == "**":
                reached = set(range(min(reached), len(parts) + 1))
            else:
                reached = {at + 1 for at in reached if at < len(parts) and _segment_matches(segment, parts[at])}
            if not reached:
                return False
        return True

    return matches


def _segment_matches(pattern: str, text: str) -> bool:
    """Whether one segment of a pattern (``*``: any characters, ``?``: one) matches one segment of a path.

    >>> _segment_matches("*a*a*b", "a" * 3000), _segment_matches("la*r?", "layers"), _segment_matches("", "")
    (False, True, True)
    """
    at = done = 0
    star, resume = -1, 0
    while done < len(text):
        if at < len(pattern) and pattern[at] != "*" and pattern[at] in ("?", text[done]):
            at, done = at + 1, done + 1
        elif at < len(pattern) and pattern[at] == "*":
            star, resume, at = at, done, at + 1
        elif star >= 0:  # the last star takes one more character
            resume += 1
            at, done = star + 1, resume
        else:
            return False
    return all(char == "*" for char in pattern[at:])


def _exact(pattern: str) -> Callable[[str], bool]:
    """Whether a path is ``pattern`` or below it, none of its characters a wildcard."""
    return lambda path: path == pattern or path.startswith(pattern + "/")


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
        self._matchers = [_exact(pattern) if exact else _pattern(pattern) for pattern in self.patterns]

    def matches(self, path: str) -> bool:
        """Whether any pattern selects ``path``."""
        return any(matcher(path) for matcher in self._matchers)

    def choose(self, paths: Iterable[str], *, file: str | None = None) -> list[str]:
        """The selected paths, in order; a pattern that matches none of them is an error naming it."""
        paths = list(paths)
        unmatched = [
            pattern
            for pattern, matcher in zip(self.patterns, self._matchers, strict=True)
            if not any(matcher(path) for path in paths)
        ]
        if unmatched:
            shown = ", ".join(paths[:8]) + (", ..." if len(paths) > 8 else "")
            raise SelectionError(
                f"select pattern{'s' if len(unmatched) > 1 else ''} {', '.join(map(repr, unmatched))} "
                f"match{'' if len(unmatched) > 1 else 'es'} no leaf "
                f"(the leaves are {shown or 'none'})",
                file=file,
            )
        return [path for path in paths if self.matches(path)]
