"""The 2-d tensors of one layer kind turn over alike: a square tensor's shape cannot tell how it is stored.

A layer kind is the tensors whose names end alike and that fill leaves of the same name: torch's ``*.weight``
filling flax's ``*/kernel`` leaves (every ``Linear``) are one kind, the ``*.weight`` filling ``*/embedding`` another.
A folder stores every tensor of a kind the same way round, so ``transposed=`` that turns some of a kind over and
leaves out a square one of it (whose shape fits either way, so that no load would notice) is refused, naming it; so
is one that turns a square one over and leaves out other 2-d ones of a kind that renames its leaves, and one that
leaves out a conv weight whose shape reads alike in torch's layout and flax's (3x3 from 3 channels to 3). A kind that
crosses layouts (torch's ``weight`` filling flax's ``kernel``, or the other way) and holds such a tensor loads only as
``transposed=`` says: turning it, or ``transposed=()``, every tensor as stored.

>>> from jaxstow._read.layer_kinds import kind
>>> kind("layers.0.q_proj.weight", "layers/0/q_proj/kernel"), kind("fc.weight", "fc.weight")
(('weight', 'kernel'), ('weight', 'weight'))
>>> kind("fc.weight", "fc/kernel/value")  # a flax nnx Variable's array
('weight', 'kernel')
"""

from __future__ import annotations

from collections.abc import Mapping, Set

from jaxstow._format.shards import ShardedLeaf
from jaxstow.errors import ArgumentError

__all__ = [
    "crosses",
    "is_square",
    "kind",
    "listed",
    "reads_alike",
    "refuse_split_kinds",
    "refuse_undecided_kinds",
    "square_kin",
    "torch_conv_as_flax",
]

#: The names of a weight stored (out, in) and (out, in, *window), as torch and equinox store it, and of one stored
#: (in, out) and (*window, in, out), as flax and haiku do: a tensor named one way filling a leaf named the other
#: crosses layouts.
_OUT_IN, _IN_OUT = frozenset({"weight"}), frozenset({"kernel", "w"})


def crosses(tensor_end: str, leaf_end: str) -> bool:
    """Whether a tensor named ``tensor_end`` filling a leaf named ``leaf_end`` crosses layouts (``weight``, ``kernel``)."""
    return (tensor_end in _OUT_IN and leaf_end in _IN_OUT) or (tensor_end in _IN_OUT and leaf_end in _OUT_IN)


def kind(tensor: str, path: str) -> tuple[str, str]:
    """The layer kind of ``tensor`` read at ``path``: the last part of its name, and of the path it fills.

    A flax nnx ``Variable``'s array lies at ``kernel/value`` (exported as ``kernel.value``): its name is the part
    before ``value``.
    """
    return _layer_name(tensor.split(".")), _layer_name(path.replace("/", ".").split("."))


def square_kin(layout: Mapping[str, ShardedLeaf], path: str, turned: Set[str]) -> list[str]:
    """The square 2-d tensors of the kind of the tensor at ``path`` that ``turned`` takes as it takes that one."""
    wanted, marked = kind(layout[path].shards[0].tensor, path), path in turned
    return sorted(
        leaf.shards[0].tensor
        for other, leaf in layout.items()
        if other != path
        and (other in turned) == marked
        and is_square(leaf.shape)
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
    for (tensor_end, leaf_end), kin in _kinds(mapping).items():
        turned = [tensor for tensor in kin if tensor in marked]
        left = [tensor for tensor in kin if tensor not in marked]
        if not turned:
            continue
        shapes = {tensor: tensors[tensor].shape for tensor in kin}
        first_turned, of_kind = turned[0], f"of the same kind ({tensor_end!r} tensors filling {leaf_end!r} leaves)"
        square_left = [tensor for tensor in left if is_square(shapes[tensor])]
        square_turned = [tensor for tensor in turned if is_square(shapes[tensor])]
        flat_left = [tensor for tensor in left if len(shapes[tensor]) == 2]
        windowed = [tensor for tensor in left if len(shapes[tensor]) > 2 and reads_alike(shapes[tensor])]
        if square_left:
            problem = (
                f"transposed= turns {first_turned!r} over but not the square {listed(square_left)} {of_kind}, whose "
                "shape fits either way and cannot tell how it is stored: a folder stores a kind one way round, so "
                f"turn them all: add {listed(square_left)} to transposed= (or, for one stored otherwise, as GPT-2's "
                "Conv1D.weight (in, out) beside a Linear's, leave it out of the load with names= and read it apart)"
            )
            shown = square_left[0]
        elif square_turned and flat_left and tensor_end != leaf_end:
            problem = (
                f"transposed= turns the square {listed(square_turned)} over but not {listed(flat_left)} {of_kind}: "
                "a folder stores a kind one way round, and a square tensor's shape fits either way and cannot tell "
                "which: mark every 2-d one of them if they are stored (out, in), as torch's Linear.weight is, or pass "
                "transposed=() if they are stored (in, out), as GPT-2's Conv1D.weight is"
            )
            shown = square_turned[0]
        elif windowed:
            problem = (
                f"transposed= turns {first_turned!r} over but not {listed(windowed)} {of_kind}, whose shape reads "
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


def refuse_undecided_kinds(
    folder: str, tensors: Mapping[str, ShardedLeaf], mapping: Mapping[str, str], marked: Set[str]
) -> None:
    """Refuse a kind of ``mapping`` that crosses layouts, that ``marked`` turns none of, and that holds a tensor whose
    shape cannot tell its layout: a square 2-d one, or one of more dims that reads alike as torch's conv weight and
    flax's kernel. Its shape would fit as stored, so that the load would give the layers turned over, silently.
    """
    for (tensor_end, leaf_end), kin in _kinds(mapping).items():
        if not crosses(tensor_end, leaf_end) or any(tensor in marked for tensor in kin):
            continue
        shapes = {tensor: tensors[tensor].shape for tensor in kin}
        square = [tensor for tensor in kin if is_square(shapes[tensor])]
        windowed = [tensor for tensor in kin if len(shapes[tensor]) > 2 and reads_alike(shapes[tensor])]
        if not square and not windowed:
            continue  # each tensor's shape tells its layout: a load that does not fit says which transposed= does
        advice = []
        if square:
            flat = [tensor for tensor in kin if len(shapes[tensor]) == 2]
            writer = "(out, in), as torch's Linear" if tensor_end in _OUT_IN else "(in, out), as flax's Dense"
            advice.append(
                f"no shape tells how this folder stores {listed(square)} (square: either way round fits): pass "
                f"transposed={_exact(flat, mapping)} if its 2-d {tensor_end!r} tensors are stored {writer} writes them"
            )
        if windowed:
            turn = "(0, 1), (-1, -2)" if tensor_end in _OUT_IN else "(-1, -2), (0, 1)"
            advice.append(
                f"no shape tells how this folder stores {listed(windowed)} (torch's conv weight (out, in, *window) and flax's "
                "kernel (*window, in, out) read alike), which transposed= cannot turn (only 2-d tensors): one stored "
                "the other way round is left out of this load (names= giving it None), read apart "
                f"(huggingface.open(folder)[name]) and turned with numpy.moveaxis(weight, {turn})"
            )
        shown = (square or windowed)[0]
        raise ArgumentError(
            f"{folder}: names= fills {leaf_end!r} leaves with {tensor_end!r} tensors, across two layouts "
            "(torch's Linear.weight is (out, in), flax's Dense kernel (in, out)), and transposed= turns none of them; "
            + "; ".join(advice)
            + "; or pass transposed=() if every tensor is stored as its leaf holds it, as GPT-2's Conv1D.weight is "
            f"(in, out) (leaf {mapping[shown]!r}: {list(shapes[shown])})",
            file=folder,
            path=mapping[shown],
        )


def torch_conv_as_flax(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of flax's kernel (*window, in, out) for torch's conv weight of ``shape`` (out, in, *window)."""
    return (*shape[2:], shape[1], shape[0])


def _kinds(mapping: Mapping[str, str]) -> dict[tuple[str, str], list[str]]:
    """The tensors of ``mapping`` by their layer kind, each kind's in order of name."""
    kinds: dict[tuple[str, str], list[str]] = {}
    for tensor, path in sorted(mapping.items()):
        kinds.setdefault(kind(tensor, path), []).append(tensor)
    return kinds


def _exact(tensors: list[str], mapping: Mapping[str, str]) -> str:
    """The ``transposed=`` that marks ``tensors`` alone of those ``mapping`` reads, to be pasted: the set where it is
    short, else a predicate on the names' endings (``q_proj.weight``, one for every layer) where they tell them apart."""
    endings = tuple(sorted({".".join(tensor.split(".")[-2:]) for tensor in tensors}))
    if len(tensors) > 8 and {tensor for tensor in mapping if tensor.endswith(endings)} == set(tensors):
        return f"lambda name: name.endswith({endings!r})"
    return "{" + ", ".join(map(repr, tensors)) + "}"


def _layer_name(parts: list[str]) -> str:
    return parts[-2] if len(parts) > 1 and parts[-1] == "value" else parts[-1]


def reads_alike(shape: tuple[int, ...]) -> bool:
    """Whether ``shape`` reads alike as torch's conv weight and flax's kernel (3x3 from 3 channels to 3, or square)."""
    return shape == torch_conv_as_flax(shape)


def listed(tensors: list[str]) -> str:
    """The first five of ``tensors``, quoted, and how many more."""
    return ", ".join(map(repr, tensors[:5])) + (f" and {len(tensors) - 5} more" if len(tensors) > 5 else "")


def is_square(shape: tuple[int, ...]) -> bool:
    """Whether ``shape`` is 2-d and square, so that it fits either way round."""
    return len(shape) == 2 and shape[0] == shape[1]
