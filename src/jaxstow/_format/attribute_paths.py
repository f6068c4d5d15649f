"""Where a problem sits inside a custom pytree node, by attribute: ``opt/tx`` rather than ``opt/2/2``.

Errors are raised with positions (an ``nnx.Optimizer`` keeps its transformation at ``aux[2][2]``); these functions
rename them after the node's attributes by building the node once with placeholder children. That runs only when an
error is raised, so saving and loading pay nothing for it; a node that cannot be built so keeps its positions.

>>> import jax, optax
>>> from flax import nnx
>>> from jaxstow._format.attribute_paths import aux_path, child_name
>>> tx = optax.adam(1e-3)
>>> optimizer = nnx.Optimizer(nnx.Linear(2, 3, rngs=nnx.Rngs(0)), tx, wrt=nnx.Param)
>>> treedef = jax.tree_util.tree_structure(optimizer)
>>> node_type, aux = treedef.node_data()
>>> child_name(node_type, aux, len(treedef.children()), 1), aux_path(node_type, aux, len(treedef.children()), ["2", "2"])
('opt_state', ['tx'])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import jax
from jax.tree_util import PyTreeDef

from jaxstow._format.keypaths import key_to_str
from jaxstow._names import static_objects
from jaxstow.errors import JaxstowError

__all__ = [
    "attributes",
    "aux_path",
    "built_node",
    "child_name",
    "join",
    "mangled",
    "renamed",
    "renamed_child",
    "replace_json",
]

E = TypeVar("E", bound=JaxstowError)
_LEAF = jax.tree_util.tree_structure(0)


def join(path: str, *keys: object) -> str:
    """``path`` with ``keys`` appended, ``/``-separated; the root's path is ``""``.

    >>> join("", "opt", 2), join("opt", "tx")
    ('opt/2', 'opt/tx')
    """
    if len(keys) == 1:  # the common case, on every node of a structure
        return f"{path}/{keys[0]}" if path else str(keys[0])
    return "/".join([path, *map(str, keys)] if path else map(str, keys))


class _Placeholder:
    """A child of a node built only to name its attributes."""


def _built(node_type: type, aux: Any, count: int) -> tuple[Any, list[_Placeholder]] | None:
    """The node, with a placeholder for each child, or ``None`` if it cannot be built so."""
    placeholders = [_Placeholder() for _ in range(count)]
    try:
        treedef = PyTreeDef.from_node_data_and_children(
            jax.tree_util.default_registry, (node_type, aux), [_LEAF] * count
        )
        return treedef.unflatten(placeholders), placeholders
    except Exception:  # a node type's unflatten may refuse anything; then positions stay
        return None


def built_node(node_type: type, aux: Any, count: int) -> Any:
    """The node built from ``aux`` around placeholder children, or ``None`` if it cannot be built so."""
    built = _built(node_type, aux, count)
    return None if built is None else built[0]


def child_name(node_type: type, aux: Any, count: int, index: int) -> str:
    """The key (attribute, field or dict key) under which the node holds its child ``index``; the index if none."""
    built = _built(node_type, aux, count)
    if built is not None:
        node, placeholders = built
        try:
            for path, leaf in jax.tree_util.tree_flatten_with_path(node)[0]:
                if leaf is placeholders[index] and len(path) == 1:
                    return key_to_str(path[0])
        except Exception:  # a node's flatten with keys may refuse placeholders
            pass
    return str(index)


def aux_path(node_type: type, aux: Any, count: int, segments: Sequence[str]) -> list[str] | None:
    """``segments`` (positions inside ``aux``) as the attribute of the node that holds the value there.

    The attribute is followed by the positions left inside that value; ``None`` if no attribute holds it.
    """
    in_graph = static_objects.graph_path(aux, list(segments))  # a graph definition is its node's aux
    if in_graph is not None:
        return in_graph
    chain = _walk(aux, segments)
    built = _built(node_type, aux, count)
    if built is None:
        return None
    held = attributes(built[0])
    for depth in range(len(chain) - 1, 0, -1):  # the deepest value an attribute holds
        for name, value in held:
            if value is chain[depth]:
                return [name, *segments[depth:]]
    return None


def _walk(value: Any, segments: Sequence[str]) -> list[Any]:
    """The values met going down ``segments`` from ``value`` (itself first), as far as they lead."""
    chain = [value]
    for segment in segments:
        if isinstance(value, tuple | list) and segment.isdigit() and int(segment) < len(value):
            value = value[int(segment)]
        elif isinstance(value, Mapping) and (key := _key(value, segment)) is not None:
            value = value[key]
        else:
            break
        chain.append(value)
    return chain


def _key(mapping: Mapping[Any, Any], segment: str) -> Any:
    return next((key for key in mapping if str(key) == segment), None)


def attributes(obj: object) -> list[tuple[str, Any]]:
    """An instance's attributes: its ``__dict__``, then the slots it has a value for, in a stable order (a private
    slot, ``__x`` of class ``C``, by the name Python stores it under, ``_C__x``; a slot a subclass declares again,
    once)."""
    found = sorted(getattr(obj, "__dict__", {}).items())
    seen = {name for name, _ in found}
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            name = mangled(cls, slot)
            if slot not in ("__dict__", "__weakref__") and name not in seen and hasattr(obj, name):
                seen.add(name)
                found.append((name, getattr(obj, name)))
    return found


def mangled(cls: type, name: str) -> str:
    """``name`` as Python stores a private name of ``cls`` (``__x`` in ``C``: ``_C__x``)."""
    owner = cls.__name__.lstrip("_")
    return f"_{owner}{name}" if name.startswith("__") and not name.endswith("__") and owner else name


def replace_json(data: Any, segments: Sequence[str], replacement: Any) -> Any:
    """A copy of the skeleton's tagged JSON ``data`` with the value at ``segments`` replaced.

    ``segments`` are as the skeleton's paths name its parts; a ``LookupError`` if they lead nowhere.

    >>> replace_json({"tuple": [1, {"dict": [["tx", {"ref": "x"}]]}]}, ["1", "tx"], None)
    {'tuple': [1, {'dict': [['tx', None]]}]}
    """
    if not segments:
        return replacement
    segment, rest = segments[0], segments[1:]
    if isinstance(data, dict) and len(data) == 1 and isinstance(data.get("tuple", data.get("list")), list):
        [(tag, items)] = data.items()
        if segment.isdigit() and int(segment) < len(items):
            index = int(segment)
            return {tag: [*items[:index], replace_json(items[index], rest, replacement), *items[index + 1 :]]}
    for tag in ("dict", "attrs", "fields"):
        pairs: list[Any] = data.get(tag, []) if isinstance(data, dict) and isinstance(data.get(tag), list) else []
        for i, pair in enumerate(pairs):
            if isinstance(pair, list) and len(pair) == 2 and pair[0] == segment:
                return {**data, tag: [*pairs[:i], [segment, replace_json(pair[1], rest, replacement)], *pairs[i + 1 :]]}
    raise LookupError(f"nothing at {segment!r} in the structure")


def renamed_child(error: E, prefix: str, node_type: type, aux: Any, count: int) -> E:
    """``error``, raised inside a child of the node at ``prefix``, with that child named by its key.

    The error's path goes on with the child's index, which this replaces.
    """

    def rename(parts: list[str]) -> list[str] | None:
        if not parts[0].isdigit() or int(parts[0]) >= count:
            return None
        return [child_name(node_type, aux, count, int(parts[0])), *parts[1:]]

    return renamed(error, prefix, rename)


def renamed(error: E, prefix: str, rename: Callable[[list[str]], list[str] | None], *, note: str = "") -> E:
    """``error`` with the part of its leaf path after ``prefix`` renamed by ``rename``, and ``note`` added.

    ``rename`` gets and gives the segments. The error itself if its path is not below ``prefix`` or ``rename`` gives
    nothing.
    """
    path = error.path
    if path is None or not (prefix == "" or path == prefix or path.startswith(prefix + "/")):
        return error
    segments = [segment for segment in path[len(prefix) :].split("/") if segment != ""] if path != prefix else []
    new = rename(segments) if segments else None
    if new is None:
        return error
    new_path = join(prefix, *new)
    message = str(error)
    old_where = f"leaf {path!r}" if path else "the root of the tree"
    moved = type(error).__new__(type(error))  # the same error, its __init__ (whose arguments vary) not run again
    moved.__dict__.update(vars(error))
    moved.args = (message.replace(old_where, f"leaf {new_path!r}", 1) + note, *error.args[1:])
    moved.path = new_path
    return moved
