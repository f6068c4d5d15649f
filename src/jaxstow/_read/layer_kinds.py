"""The 2-d tensors of one layer kind turn over alike: a square tensor's shape cannot tell how it is stored.

A layer kind is the tensors whose names end alike and that fill leaves of the same name: torch's ``*.weight``
filling flax's ``*/kernel`` leaves (every ``Linear``) are one kind, the ``*.weight`` filling ``*/embedding`` another.
A folder stores every tensor of a kind the same way round, so ``transposed=`` that turns some of a kind over and
leaves out a square one of it (whose shape fits either way, so that no load would notice) is refused, naming it.

>>> from jaxstow._read.layer_kinds import kind
>>> kind("layers.0.q_proj.weight", "layers/0/q_proj/kernel"), kind("fc.weight", "fc.weight")
(('weight', 'kernel'), ('weight', 'weight'))
"""

from __future__ import annotations

from collections.abc import Mapping, Set

from jaxstow._format.shards import ShardedLeaf
from jaxstow.errors import ArgumentError

__all__ = ["kind", "refuse_split_kinds", "square_kin"]


def kind(tensor: str, path: str) -> tuple[str, str]:
    """The layer kind of ``tensor`` read at ``path``: the last part of its name, and of the path it fills."""
    return tensor.rsplit(".", 1)[-1], path.rsplit("/", 1)[-1].rsplit(".", 1)[-1]


def square_kin(layout: Mapping[str, ShardedLeaf], path: str, turned: Set[str]) -> list[str]:
    """The square 2-d tensors left out of ``turned`` of the kind of the tensor at ``path``, by name."""
    wanted = kind(layout[path].shards[0].tensor, path)
    return sorted(
        leaf.shards[0].tensor
        for other, leaf in layout.items()
        if other != path and other not in turned and _square(leaf) and kind(leaf.shards[0].tensor, other) == wanted
    )


def refuse_split_kinds(
    folder: str, tensors: Mapping[str, ShardedLeaf], mapping: Mapping[str, str], marked: Set[str]
) -> None:
    """Refuse a square 2-d tensor of ``mapping`` left out of ``marked`` while another of its kind is in it."""
    turning: dict[tuple[str, str], str] = {}  # each kind turned over, by the first of its tensors marked
    for tensor, path in sorted(mapping.items()):
        if tensor in marked:
            turning.setdefault(kind(tensor, path), tensor)
    left = sorted(
        tensor
        for tensor, path in mapping.items()
        if tensor not in marked and _square(tensors[tensor]) and kind(tensor, path) in turning
    )
    if not left:
        return
    first = left[0]
    tensor_end, leaf_end = kind(first, mapping[first])
    shown = ", ".join(map(repr, left[:5])) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
    raise ArgumentError(
        f"{folder}: transposed= turns {turning[(tensor_end, leaf_end)]!r} over but not {first!r} (leaf "
        f"{mapping[first]!r}), a square {list(tensors[first].shape)} tensor of the same kind ({tensor_end!r} tensors "
        f"filling {leaf_end!r} leaves), whose shape fits either way and cannot tell how it is stored: a folder stores "
        f"a kind one way round, so turn them all: add {shown} to transposed=",
        file=folder,
        path=mapping[first],
    )


def _square(leaf: ShardedLeaf) -> bool:
    return len(leaf.shape) == 2 and leaf.shape[0] == leaf.shape[1]
