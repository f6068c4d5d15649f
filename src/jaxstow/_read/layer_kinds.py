"""The 2-d tensors of one layer kind turn over alike: a square tensor's shape cannot tell how it is stored.

A layer kind is the tensors whose names end alike and that fill leaves of the same name: torch's ``*.weight``
filling flax's ``*/kernel`` leaves (every ``Linear``) are one kind, the ``*.weight`` filling ``*/embedding`` another.
A folder stores every tensor of a kind the same way round, so ``transposed=`` that turns some of a kind over and
leaves out a square one of it (whose shape fits either way, so that no load would notice) is refused, naming it, and
so is a conv weight of the kind whose shape reads alike in torch's layout and flax's (3x3 from 3 channels to 3).

>>> from jaxstow._read.layer_kinds import kind
>>> kind("layers.0.q_proj.weight", "layers/0/q_proj/kernel"), kind("fc.weight", "fc.weight")
(('weight', 'kernel'), ('weight', 'weight'))
"""

from __future__ import annotations

from collections.abc import Mapping, Set

from jaxstow._format.shards import ShardedLeaf
from jaxstow.errors import ArgumentError

__all__ = ["kind", "refuse_split_kinds", "square_kin", "torch_conv_as_flax"]


def kind(tensor: str, path: str) -> tuple[str, str]:
    """The layer kind of ``tensor`` read at ``path``: the last part of its name, and of the path it fills."""
    return tensor.rsplit(".", 1)[-1], path.rsplit("/", 1)[-1].rsplit(".", 1)[-1]


def square_kin(layout: Mapping[str, ShardedLeaf], path: str, turned: Set[str]) -> list[str]:
    """The square 2-d tensors left out of ``turned`` of the kind of the tensor at ``path``, by name."""
    wanted = kind(layout[path].shards[0].tensor, path)
    return sorted(
        leaf.shards[0].tensor
        for other, leaf in layout.items()
        if other != path
        and other not in turned
        and _square(leaf.shape)
        and kind(leaf.shards[0].tensor, other) == wanted
    )


def refuse_split_kinds(
    folder: str, tensors: Mapping[str, ShardedLeaf], mapping: Mapping[str, str], marked: Set[str]
) -> None:
    """Refuse a tensor of ``mapping`` whose shape cannot tell its layout, left out of ``marked`` while another of its
    kind is in it: a square 2-d one, or one of more dims that reads alike as torch's conv weight and flax's kernel."""
    turning: dict[tuple[str, str], str] = {}  # each kind turned over, by the first of its tensors marked
    for tensor, path in sorted(mapping.items()):
        if tensor in marked:
            turning.setdefault(kind(tensor, path), tensor)
    left = sorted(tensor for tensor, path in mapping.items() if tensor not in marked and kind(tensor, path) in turning)
    square = [tensor for tensor in left if _square(tensors[tensor].shape)]
    windowed = [tensor for tensor in left if len(tensors[tensor].shape) > 2 and _layout_blind(tensors[tensor].shape)]
    if not (square or windowed):
        return
    first = (square or windowed)[0]
    tensor_end, leaf_end = kind(first, mapping[first])
    where = (
        f"{folder}: transposed= turns {turning[(tensor_end, leaf_end)]!r} over but not {first!r} (leaf "
        f"{mapping[first]!r}), a {'square ' if square else ''}{list(tensors[first].shape)} tensor of the same kind ({tensor_end!r} tensors filling "
        f"{leaf_end!r} leaves), whose shape"
    )
    if square:
        problem = (
            "fits either way and cannot tell how it is stored: a folder stores a kind one way round, so turn them all: "
            f"add {_listed(square)} to transposed="
        )
    else:
        problem = (
            "reads alike as torch's Conv weight (out, in, *window) and flax's kernel (*window, in, out), so no load "
            "would notice it left as stored; transposed= turns only 2-d tensors: leave it out of this load (names= "
            "giving it None, like without its leaf), read it apart (huggingface.open(folder)[name]) and turn it with "
            f"numpy.moveaxis(weight, (0, 1), (-1, -2)): {_listed(windowed)}"
        )
    raise ArgumentError(f"{where} {problem}", file=folder, path=mapping[first])


def torch_conv_as_flax(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of flax's kernel (*window, in, out) for torch's conv weight of ``shape`` (out, in, *window)."""
    return (*shape[2:], shape[1], shape[0])


def _layout_blind(shape: tuple[int, ...]) -> bool:
    return shape == torch_conv_as_flax(shape)


def _listed(tensors: list[str]) -> str:
    return ", ".join(map(repr, tensors[:5])) + (f" and {len(tensors) - 5} more" if len(tensors) > 5 else "")


def _square(shape: tuple[int, ...]) -> bool:
    return len(shape) == 2 and shape[0] == shape[1]
