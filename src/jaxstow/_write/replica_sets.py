"""The replicas of a tree's sharded arrays, compared between the processes of a save that hold them: each holder
writes a share of a box's rows, so copies that differ would be saved as a mix of them.

A process of a holder set (the processes that hold a box, in order) holds every box those processes hold. For each
of its sets, it hashes the prints of those boxes (:func:`~jaxstow._format.replicas.replica_print`) leaf by leaf, in
groups (:mod:`~jaxstow._write.grouped_prints`); process 0 compares each set's members, reading no shard of theirs.
Every process sees the same sets (the layout of each array over every device, which the processes agree on), so
a set is named by its place among the tree's sets; each gets as many groups as keep a process's summary under a
few KiB, however many sets it is one of.

>>> from jaxstow._format.leaves import EncodedLeaf
>>> leaves = [EncodedLeaf({}, replicas=(((0, 2), "p0"), ((1, 3), ""))), EncodedLeaf({})]
>>> list(replica_summary(leaves, 0)), replica_summary(leaves, 1) == {"1": grouped([""])}
(['0'], True)
>>> summaries = [replica_summary(leaves, 0), replica_summary(leaves, 1), {"0": "1234abcd"}, replica_summary(leaves, 3)]
>>> differing_replicas(summaries, leaves)
[Differing(first=0, other=2, leaves=(0, 0))]
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

from jaxstow._format.leaves import EncodedLeaf
from jaxstow._format.replicas import Holders
from jaxstow._write.grouped_prints import GROUPS, differing_group, grouped

__all__ = ["Differing", "differing_replicas", "replica_summary"]


class Differing(NamedTuple):
    """A member of a holder set whose copies differ from those of the set's first member."""

    first: int
    other: int
    #: The first and the last leaf (their places in the tree) of the first group of leaves whose copies differ;
    #: ``None`` where a summary is malformed.
    leaves: tuple[int, int] | None


def replica_summary(leaves: list[EncodedLeaf], me: int) -> dict[str, str]:
    """For each holder set of ``leaves``' sharded arrays that process ``me`` is one of (its place among the tree's
    sets, as text): the prints of the boxes it holds, leaf by leaf, in groups."""
    sets = _sets(leaves)
    groups = _groups(sets)
    return {
        str(place): grouped([dict(leaves[k].replicas)[holders] for k in held], groups)
        for place, (holders, held) in enumerate(sets.items())
        if me in holders
    }


def differing_replicas(summaries: list[dict[str, str]], leaves: list[EncodedLeaf]) -> list[Differing]:
    """Each member of each holder set whose prints differ from the set's first member's, where ``summaries`` are
    every process's :func:`replica_summary` (in process order) of trees laid out as ``leaves``."""
    sets = _sets(leaves)
    groups = _groups(sets)
    found = []
    for place, (holders, held) in enumerate(sets.items()):
        ours = summaries[holders[0]].get(str(place), "")
        for other in holders[1:]:
            theirs = summaries[other].get(str(place), "")
            if theirs != ours:
                group = differing_group(ours, theirs, len(held), groups)
                span = None if group is None else (held[group[0]], held[group[1] - 1])
                found.append(Differing(holders[0], other, span))
    return found


def _sets(leaves: list[EncodedLeaf]) -> dict[Holders, list[int]]:
    """Each holder set of ``leaves``' sharded arrays, in order, with the places of the leaves whose boxes it holds."""
    sets: dict[Holders, list[int]] = {}
    for k, leaf in enumerate(leaves):
        for holders, _ in leaf.replicas:
            sets.setdefault(holders, []).append(k)
    return dict(sorted(sets.items()))


def _groups(sets: dict[Holders, list[int]]) -> int:
    """The groups of each set's summary: :data:`~jaxstow._write.grouped_prints.GROUPS` shared among the sets of the
    process that is one of the most."""
    most = max(Counter(process for holders in sets for process in holders).values(), default=1)
    return max(1, GROUPS // most)
