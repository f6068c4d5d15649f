"""Which leaves an export turns over: ``transposed=`` of :func:`jaxstow.export_safetensors`, checked by layer kind.

flax's ``Dense`` kernel is ``(in, out)``, torch's ``Linear.weight`` ``(out, in)``: a ``names=`` that exports
``kernel`` leaves as ``weight`` tensors (or the other way) crosses layouts, and ``transposed=`` (leaf paths, or a
predicate on a path) turns the 2-d leaves it marks over as they are written. A square leaf fits a torch model either
way round, so that nothing would notice it left as saved: a kind that crosses layouts and holds one (or a conv kernel
whose shape reads alike in both layouts) is exported only as ``transposed=`` says, turning it or ``()`` (every leaf
as saved); and a ``transposed=`` that turns some of a kind over but leaves out a square one is refused. A kind is the
leaves whose exported names end alike and whose paths end alike (see :mod:`jaxstow._read.layer_kinds`).

>>> from jaxstow.checkpoint.hf_export_layouts import turned_leaves
>>> sorted(turned_leaves("w.jxs", {"fc/kernel": "fc.weight", "fc/bias": "fc.bias"},
...                      {"fc/kernel": (4, 4), "fc/bias": (4,)}, {"fc/kernel"}))
['fc/kernel']
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from jaxstow._read.layer_kinds import crosses, kind, listed, reads_alike
from jaxstow.errors import ArgumentError, excerpt

__all__ = ["ExportTransposed", "turned_leaves"]

#: The 2-d leaves to write turned over: leaf paths (a set, a list) or a predicate on a path; ``()``: none.
ExportTransposed = Callable[[str], bool] | Iterable[str]

_MOVE = "numpy.moveaxis(kernel, (-1, -2), (0, 1))"


def turned_leaves(
    source: str,
    names: Mapping[str, str],
    shapes: Mapping[str, tuple[int, ...]],
    transposed: ExportTransposed | None,
) -> frozenset[str]:
    """The paths of the leaves to write turned over, of those ``names`` exports (path -> tensor name).

    Raises:
        ArgumentError: a ``transposed=`` of another type or naming leaves the source lacks, a marked leaf that is not
            2-d, a kind it splits, or none given for a kind that crosses layouts and holds a square leaf.
    """
    marked = _marked(source, transposed, list(shapes))
    for path in sorted(marked & set(names)):
        if len(shapes[path]) != 2:
            raise ArgumentError(
                f"{source}: transposed= marks {path!r}, of shape {list(shapes[path])}: only 2-d leaves turn; save a "
                f"conv kernel in torch's layout ({_MOVE}) before exporting it, or leave it out of transposed=",
                file=source,
                path=path,
            )
    kinds: dict[tuple[str, str], list[str]] = {}
    for path, name in sorted(names.items()):
        kinds.setdefault(kind(name, path), []).append(path)
    for (name_end, leaf_end), kin in kinds.items():
        blind = [path for path in kin if len(shapes[path]) >= 2 and reads_alike(shapes[path])]  # square ones too
        turned, left = [path for path in kin if path in marked], [path for path in kin if path not in marked]
        if turned and (split := [path for path in blind if path in left]):
            problem = (
                f"transposed= turns {turned[0]!r} over but not {listed(split)} of the same kind ({leaf_end!r} leaves "
                f"exported as {name_end!r} tensors), whose shape fits either way, so that no reader would notice it "
                f"left as saved: add the 2-d ones to transposed= (a conv kernel: save it as {_MOVE} gives it)"
            )
        elif (
            (square := [path for path in turned if path in blind])
            and name_end != leaf_end
            and (split := [path for path in left if len(shapes[path]) == 2])
        ):
            problem = (
                f"transposed= turns the square {listed(square)} over but not {listed(split)} of the same kind "
                f"({leaf_end!r} leaves exported as {name_end!r} tensors): a reader turns a kind all one way round, "
                "and a square leaf's shape fits either way: add every 2-d one of them to transposed=, or pass "
                "transposed=() to write every leaf as saved"
            )
        elif not turned and blind and transposed != () and crosses(name_end, leaf_end):
            flat = [path for path in kin if len(shapes[path]) == 2]
            layout = "(out, in), as torch's Linear" if name_end == "weight" else "(in, out), as flax's Dense"
            problem = (
                f"names= exports {leaf_end!r} leaves as {name_end!r} tensors, across two layouts (flax's Dense kernel "
                f"is (in, out), torch's Linear.weight (out, in)), and transposed= turns none of them; no shape tells "
                f"how {listed(blind)} should be written (either way round fits): pass transposed="
                f"{_pasteable(flat, list(names))} to write them {layout} reads its {name_end!r} (a conv kernel: save "
                f"it as {_MOVE} gives it), or transposed=() to write every leaf as saved"
            )
        else:
            continue
        shown = (split if turned else blind)[0]
        raise ArgumentError(f"{source}: {problem} (leaf {shown!r}: {list(shapes[shown])})", file=source, path=shown)
    return frozenset(marked & set(names))


def _marked(source: str, transposed: ExportTransposed | None, paths: list[str]) -> set[str]:
    if transposed is None:
        return set()
    if callable(transposed):
        return {path for path in paths if transposed(path)}
    if isinstance(transposed, str | Mapping) or not isinstance(transposed, Iterable):
        raise ArgumentError(
            f"transposed= takes a collection of leaf paths or a predicate on a path, not {excerpt(transposed)}"
        )
    marks = set(transposed)
    if unknown := sorted(str(mark) for mark in marks - set(paths)):
        raise ArgumentError(f"{source}: transposed= names leaves it lacks: {unknown[:5]} (its arrays: {paths[:5]})")
    return marks


def _pasteable(paths: list[str], exported: list[str]) -> str:
    """The ``transposed=`` that marks ``paths`` alone of those exported: the set where it is short, else a predicate
    on the paths' endings (``q_proj/kernel``, one for every layer) where they tell them apart."""
    endings = tuple(sorted({"/".join(path.split("/")[-2:]) for path in paths}))
    if len(paths) > 8 and {path for path in exported if path.endswith(endings)} == set(paths):
        return f"lambda path: path.endswith({endings!r})"
    return "{" + ", ".join(map(repr, paths)) + "}"
