"""Prints of a list of leaves hashed in groups of consecutive leaves: a short text, whatever the count of leaves,
that two processes compare to find the first group of leaves whose prints differ.

>>> ours, theirs = grouped(["a", "b", "c"]), grouped(["a", "x", "c"])
>>> len(ours), differing_group(ours, theirs, 3)
(24, (1, 2))
>>> differing_group(grouped(list("abcd"), 2), grouped(list("abcx"), 2), 4, 2)
(2, 4)
"""

from __future__ import annotations

import xxhash

__all__ = ["GROUPS", "differing_group", "grouped"]

#: The most groups a text holds a hash of (8 hex digits each): it stays under a few KiB however many leaves there are,
#: and a difference is located to a group of leaves.
GROUPS = 512


def grouped(prints: list[str], groups: int = GROUPS) -> str:
    """A hash (8 hex digits) of each group of consecutive ``prints``, in at most ``groups`` groups."""
    size = -(-len(prints) // groups) or 1
    return "".join(
        xxhash.xxh3_64_hexdigest("\n".join(prints[start : start + size]).encode())[:8]
        for start in range(0, len(prints), size)
    )


def differing_group(ours: str, theirs: str, count: int, groups: int = GROUPS) -> tuple[int, int] | None:
    """The first group (``start``, ``stop``) of ``count`` prints that :func:`grouped` texts hash differently; ``None``
    where they agree."""
    size = -(-count // groups) or 1
    for group, start in enumerate(range(0, count, size)):
        if ours[8 * group : 8 * group + 8] != theirs[8 * group : 8 * group + 8]:
            return start, min(start + size, count)
    return None
