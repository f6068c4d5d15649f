"""The 2-d tensors of one layer kind turn over alike: a square tensor's shape cannot tell how it is stored.

A layer kind is the tensors whose names end alike and that fill leaves of the same name: torch's ``*.weight``
filling flax's ``*/kernel`` leaves (every ``Linear``) are one kind, the ``*.weight`` filling ``*/embedding`` another.
A folder stores every tensor of a kind the same way round, so ``transposed=`` that turns some of a kind over and
leaves out a square one of it (whose shape fits either way, so that no load would notice) is refused, naming it; so
is one that turns a square one over and leaves out other 2-d ones of a kind that renames its leaves, and one that
leaves out a conv weight whose shape reads alike in torch's layout and flax's (3x3 from 3 channels to 3).

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
    """The square 2-d tensors of the kind of the tensor at ``path`` that ``turned`` takes as it takes that one."""
    wanted, marked = kind(layout[path].shards[0].tensor, path), path in turned
    return sorted(
        leaf.shards[0].tensor
        for other, leaf in layout.items()
        if other != path
        and (other in turned) == marked
        and _square(leaf.shape)
        and kind(leaf.shards[0].tensor, other) == wanted
    )


def refuse_split_kinds(
    folder: str, tensors: Mapping[str, ShardedLeaf], mapping: Mapping[str, str], marked: Set[str]
) -> None:
    """Refuse a kind of ``mapping`` that ``marked`` splits where a tensor's shape cannot tell its layout.

    That is a square 2-d tensor left out while another of its kind is marked; a square one marked while a 2-d one of
    its kind is left out, in a kind that renames its leaves (``weight`` filling ``kernel``: its tensors are one
    library's layers, never an embedding beside them); a tensor of more dims left out whose shape reads alike as
    torch's conv weight and flax's kernel.
    """
    kinds: dict[tuple[str, str], list[str]] = {}
    for tensor, path in sorted(mapping.items()):
        kinds.setdefault(kind(tensor, path), []).append(tensor)
    for (tensor_end, leaf_end), kin in kinds.items():
        turned = [tensor for tensor in kin if tensor in marked]
        left = [tensor for tensor in kin if tensor not in marked]
        if not turned:
            continue
        shapes = {tensor: tensors[tensor].shape for tensor in kin}
        first_turned, of_kind = turned[0], f"of the same kind ({tensor_end!r} tensors filling {leaf_end!r} leaves)"
        square_left = [tensor for tensor in left if _square(shapes[tensor])]
        square_turned = [tensor for tensor in turned if _square(shapes[tensor])]
        flat_left = [tensor for tensor in left if len(shapes[tensor]) == 2]
        windowed = [tensor for tensor in left if len(shapes[tensor]) > 2 and _layout_blind(shapes[tensor])]
        if square_left:
            problem = (
                f"transposed= turns {first_turned!r} over but not the square {_listed(square_left)} {of_kind}, whose "
                "shape fits either way and cannot tell how it is stored: a folder stores a kind one way round, so "
                f"turn them all: add {_listed(square_left)} to transposed= (or, for one stored otherwise, as GPT-2's "
                "Conv1D.weight (in, out) beside a Linear's, leave it out of the load with names= and read it apart)"
            )
            shown = square_left[0]
        elif square_turned and flat_left and tensor_end != leaf_end:
            problem = (
                f"transposed= turns the square {_listed(square_turned)} over but not {_listed(flat_left)} {of_kind}: "
                "a folder stores a kind one way round, and a square tensor's shape fits either way and cannot tell "
                "which: mark every 2-d one of them if they are stored (out, in), as torch's Linear.weight is, or none "
                "if they are stored (in, out), as GPT-2's Conv1D.weight is"
            )
            shown = square_turned[0]
        elif windowed:
            problem = (
                f"transposed= turns {first_turned!r} over but not {_listed(windowed)} {of_kind}, whose shape reads "
                "alike as torch's Conv weight (out, in, *window) and flax's kernel (*window, in, out), so no load would "
                "notice it left as stored; transposed= turns only 2-d tensors: leave it out of this load (names= "
                "giving it None, like without its leaf), read it apart (huggingface.open(folder)[name]) and turn it "
                "with numpy.moveaxis(weight, (0, 1), (-1, -2))"
            )
            shown = windowed[0]
        else:
            continue
        leaf = mapping[shown]
        raise ArgumentError(f"{folder}: {problem} (leaf {leaf!r}: {list(shapes[shown])})", file=folder, path=leaf)


def torch_conv_as_flax(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of flax's kernel (*window, in, out) for torch's conv weight of ``shape`` (out, in, *window)."""
    return (*shape[2:], shape[1], shape[0])


def _layout_blind(shape: tuple[int, ...]) -> bool:
    return shape == torch_conv_as_flax(shape)


def _listed(tensors: list[str]) -> str:
    return ", ".join(map(repr, tensors[:5])) + (f" and {len(tensors) - 5} more" if len(tensors) > 5 else "")


def _square(shape: tuple[int, ...]) -> bool:
    return len(shape) == 2 and shape[0] == shape[1]
