"""The file's saved structure held against the tree it is restored as: rebuilt by this process's classes, or ``like``.

Leaves are stored by position and named by the paths the saving process gave them. A class whose fields changed
order since the save would take its values by position, in the wrong fields; a ``like`` tree of another class, or of
other static data, or whose node names its children by position in an order this process chose (FlareJax orders
attributes by hash), would be filled from the wrong leaves. Both are told here from the header, before any data is
read; the caller asks only of structures with nodes other than dicts, lists, tuples and ``None`` (whose paths are
their keys).

>>> import io, jax.numpy as jnp, equinox as eqx, jaxstow
>>> @jaxstow.saveable(name="docs.Dense")
... class Dense(eqx.Module):
...     w: jax.Array
...     transposed: bool = eqx.field(static=True)
>>> buffer = io.BytesIO()
>>> jaxstow.save(buffer, Dense(jnp.ones(2), transposed=False))
>>> _ = buffer.seek(0)
>>> jaxstow.load(buffer, like=Dense(jnp.zeros(2), transposed=True))  # doctest: +ELLIPSIS
Traceback (most recent call last):
jaxstow.errors.StructureMismatchError: ...: the file's Dense has transposed=False, like's has transposed=True...
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.tree_util import PyTreeDef

from jaxstow._format.attribute_paths import attributes, join
from jaxstow._format.keypaths import flatten_with_paths, path_to_str
from jaxstow._format.static_values import same_static
from jaxstow._names import registry
from jaxstow._read.opened import OpenedFile
from jaxstow.errors import FormatError, RequestError, StructureMismatchError, UnknownNameError

__all__ = ["check_rebuilt", "flatten_like", "like_paths_in_file", "where_like_sits"]

_MAPPINGS = (dict, OrderedDict, defaultdict)
_SEQUENCES = (list, tuple)
_CONTAINERS = (*_MAPPINGS, *_SEQUENCES, type(None))


class _Position:
    """The leaf the file stores at ``index``, in a structure rebuilt to name its leaves."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def _rebuilt(treedef: PyTreeDef) -> tuple[Any, list[str], list[int]] | None:
    """The structure built by this process's classes around placeholder leaves, the paths jax gives its leaves and
    the file's position of each (fewer than the file's leaves where a class lost fields); ``None`` if a class
    refuses placeholders, or makes leaves of its own.

    A class that keeps only arrays as its children (FlareJax's modules) is given small arrays as placeholders.
    """
    count = treedef.num_leaves
    found = _placed(treedef, [_Position(i) for i in range(count)])
    if count and (found is None or len(found[2]) != count):
        arrays = jax.device_put([np.zeros((), np.uint8)] * count)
        found = _placed(treedef, arrays)
    return found


def _placed(treedef: PyTreeDef, placeholders: list[Any]) -> tuple[Any, list[str], list[int]] | None:
    where = {id(placeholder): i for i, placeholder in enumerate(placeholders)}
    try:
        tree = treedef.unflatten(placeholders)
        paths, leaves, _ = flatten_with_paths(tree)
    except Exception:  # a node type's own unflatten or flatten may refuse anything
        return None
    positions = [where.get(id(leaf), -1) for leaf in leaves]
    if -1 in positions:
        return None
    return tree, paths, positions


def check_rebuilt(opened: OpenedFile, treedef: PyTreeDef) -> None:
    """Refuse a structure whose classes, as this process defines them, name the file's leaves otherwise than the
    saving process did: their fields changed (order or names), and the values would land in other fields.

    A :class:`~jaxstow.errors.StructureMismatchError` naming the class, the first leaf that differs and both orders.
    """
    rebuilt = _rebuilt(treedef)
    if rebuilt is None or tuple(rebuilt[1]) == opened.leaf_order:
        return
    tree, paths, _ = rebuilt
    index = next((i for i, (a, b) in enumerate(zip(paths, opened.leaf_order, strict=False)) if a != b), len(paths))
    path = opened.leaf_order[index] if index < len(opened.leaf_order) else paths[index]
    owner, prefix = _owner(tree, paths[index] if index < len(paths) else path)
    saved = _children(opened.leaf_order, prefix)
    now = _children(paths, prefix)
    what = f"{_class_name(owner)} at {prefix!r}" if prefix else _class_name(owner)
    raise StructureMismatchError(
        [
            f"{path!r}: {what} names its leaves {now} now, the file {saved}: the class changed since the save, and "
            "its values would be rebuilt into other fields; load the file with the class as it was saved, or "
            "restore it into the new class with like=... (leaves are matched by name)"
        ],
        file=opened.file,
    )


def _children(paths: Sequence[str], prefix: str) -> list[str]:
    """The names of the children under ``prefix`` that ``paths`` lead through, in order."""
    start = len(prefix) + 1 if prefix else 0
    found = [path[start:].split("/", 1)[0] for path in paths if not prefix or path.startswith(prefix + "/")]
    return list(dict.fromkeys(found))


def _owner(tree: Any, path: str) -> tuple[Any, str]:
    """The innermost node other than a container on the way to the leaf at ``path``, and its path."""
    owner, where, node, at = tree, "", tree, ""
    while True:
        children = _one_level(node)
        if children is None:
            return owner, where
        keys, values, _ = children
        for key, value in zip(keys, values, strict=True):
            child_path = join(at, key)
            if path == child_path or path.startswith(child_path + "/"):
                node, at = value, child_path
                break
        else:
            return owner, where
        if type(node) not in _CONTAINERS and _one_level(node) is not None:
            owner, where = node, at


def _one_level(node: Any) -> tuple[list[str], list[Any], tuple[type, Any]] | None:
    """The names and values of ``node``'s children and its type and aux data; ``None`` for a leaf."""
    if node is None or type(node) is _Position or isinstance(node, jax.Array):
        return None
    with_paths, one = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda child: child is not node)
    treedef: PyTreeDef = one
    data = treedef.node_data()
    if data is None:
        return None
    return [path_to_str(path) for path, _ in with_paths], [child for _, child in with_paths], data


def flatten_like(like: Any, prepared: Callable[[Any], Any], *, file: str) -> tuple[list[str], list[Any], PyTreeDef]:
    """The leaf paths, leaves and structure of ``prepared(like)``; a ``like`` that jax cannot flatten (a dict whose
    keys mix ``int`` and ``str``, which it cannot sort) is a :class:`~jaxstow.errors.RequestError` naming the file."""
    try:
        return flatten_with_paths(prepared(like))
    except (ValueError, TypeError) as error:
        raise RequestError(
            f"jax cannot flatten like ({type(error).__name__}: {error}): give each of its dicts keys of one type that "
            "sorts, such as {str(key): value for key, value in d.items()}",
            file=file,
        ) from None


def where_like_sits(file_paths: Sequence[str], like_paths: Sequence[str]) -> list[str]:
    """A note, where none of ``like``'s leaves is in the file but all of them are below a subtree of it, that ``like``
    holds such a subtree at the root: where (each such subtree), and how to give it there (``[]`` otherwise).

    >>> where_like_sits(["params/enc/w", "params/dec/w", "step"], ["w"])[0]
    "like's leaves are all in the file below 'params/enc' or 'params/dec': give like at its place, such as {'params': {'enc': like}}, with partial=True"
    """
    present = set(file_paths)
    if not like_paths or not like_paths[0] or any(path in present for path in like_paths):
        return []
    ends = dict.fromkeys(path[: -len(like_paths[0]) - 1] for path in file_paths if path.endswith("/" + like_paths[0]))
    below = [prefix for prefix in ends if all(f"{prefix}/{path}" in present for path in like_paths)]
    if not below:
        return []
    keys = below[0].split("/")
    nested = "".join(f"{{{key!r}: " for key in keys) + "like" + "}" * len(keys)
    where = " or ".join(map(repr, below[:3])) + (" or others" if len(below) > 3 else "")
    return [
        f"like's leaves are all in the file below {where}: give like at its place, such as {nested}, with partial=True"
    ]


def like_paths_in_file(
    opened: OpenedFile, like_paths: list[str], like_treedef: PyTreeDef, like: Any
) -> tuple[list[str], list[str]]:
    """The file's path of each ``like`` leaf (at ``like_paths``), and where ``like``'s structure differs from the
    file's (for a :class:`~jaxstow.errors.StructureMismatchError` with the leaves' problems).

    A node of the file and ``like``'s at one path must be of one class with the same static data (dicts and lists
    aside, a container holds the leaves another node names alike); children are held against each other by name.
    Where the file's classes rebuild its structure as it was saved, leaves named by position (in an order the
    process chose) are found by their node's own names.
    """
    try:
        treedef = opened.treedef()
    except (UnknownNameError, FormatError):  # names this process lacks, or classes that changed since the save
        # (a field gained, a node that refuses the file's children): like= gives their structure, matched by path
        return like_paths, []
    rebuilt = None if treedef is None else _rebuilt(treedef)
    if rebuilt is None:
        return like_paths, []
    tree, paths, positions = rebuilt
    faithful = tuple(paths) == opened.leaf_order  # the classes name the leaves as the saving process did
    try:
        rebuilt_treedef = jax.tree.structure(tree)
        # jax's equality takes 1 for True and 3 for 3.0 in static data: their reprs tell them apart
        same = faithful and rebuilt_treedef == like_treedef and str(rebuilt_treedef) == str(like_treedef)
    except Exception:  # aux data that cannot be compared is compared node by node
        same = False
    problems: list[str] = []
    if not same:
        _compare(tree, like, "", problems, faithful=faithful)
    if not faithful or positions == list(range(len(positions))):
        return like_paths, problems
    by_name = {path: opened.leaf_order[position] for path, position in zip(paths, positions, strict=True)}
    return [by_name.get(path, path) for path in like_paths], problems


def _compare(saved: Any, like: Any, path: str, problems: list[str], *, faithful: bool) -> None:
    """Append to ``problems`` where the rebuilt file structure ``saved`` and ``like`` differ, at and under ``path``.

    Leaves, ``None`` and missing children are left to the leaf-by-leaf checks. Without ``faithful``, the file's
    classes no longer name its children as saved: only the classes and their static attributes are compared there.
    """
    ours, theirs = _one_level(saved), _one_level(like)
    if ours is None or theirs is None:
        return
    (keys, values, (saved_type, saved_aux)), (like_keys, like_values, (like_type, like_aux)) = ours, theirs
    custom = saved_type not in _CONTAINERS and like_type not in _CONTAINERS
    if custom and saved_type is not like_type:
        problems.append(
            f"{path!r}: the file has class {_type_name(saved_type)}, like has class {_type_name(like_type)}; pass a like of "
            "the saved class, or load without like= to rebuild the file's own"
        )
        return
    if saved_type in _CONTAINERS and like_type in _CONTAINERS and _family(saved_type) != _family(like_type):
        problems.append(f"{path!r}: the file has a {saved_type.__name__}, like has a {like_type.__name__}")
        return
    # A container against a node that names its children: the leaf paths decide.
    if custom and not faithful:  # its static attributes are the file's still (the decoder checks their names)
        attribute = None if same_static(saved_aux, like_aux) else _differing_attribute(saved, like, {*keys, *like_keys})
        if attribute is not None:
            problems.append(f"{path!r}: {attribute}")
        return
    if custom and keys == like_keys and not same_static(saved_aux, like_aux):
        problems.append(f"{path!r}: {_static_difference(saved, like, saved_aux, like_aux, set(keys))}")
        return
    children = dict(zip(keys, values, strict=True))
    for key, value in zip(like_keys, like_values, strict=True):
        if key in children:
            _compare(children[key], value, join(path, key), problems, faithful=faithful)


def _family(node_type: type) -> str:
    return "mapping" if node_type in _MAPPINGS else "sequence" if node_type in _SEQUENCES else "none"


def _static_difference(saved: Any, like: Any, saved_aux: Any, like_aux: Any, children: set[str]) -> str:
    """What differs between two nodes of one class: the first attribute whose static values differ, or their aux."""
    return _differing_attribute(saved, like, children) or (
        f"the file's {_class_name(saved)} has static data {saved_aux!r}, like's {like_aux!r}: they were built "
        "otherwise (or list their fields in another order); pass a like built as the saved one"
    )


def _differing_attribute(saved: Any, like: Any, children: set[str]) -> str | None:
    """The first attribute of two nodes of one class, other than those named ``children``, whose static values
    differ, told; ``None`` if none does."""
    theirs = dict(attributes(like))
    differing = [
        (attribute, value)
        for attribute, value in attributes(saved)
        if attribute in theirs
        and attribute not in children
        and not _holds_children(value)
        and not same_static(value, theirs[attribute])
    ]
    if not differing:
        return None
    # a public attribute first: a private one (nnx's _pytree__state) may differ for any two objects
    attribute, value = min(differing, key=lambda pair: pair[0].startswith("_"))
    return (
        f"the file's {_class_name(saved)} has {attribute}={value!r}, like's has {attribute}={theirs[attribute]!r} "
        "(static data, not restored from like's leaves); pass a like built with the saved value"
    )


def _holds_children(value: Any) -> bool:
    """Whether an attribute of a rebuilt node holds some of its children (else it holds static data)."""
    try:
        return any(type(leaf) is _Position or isinstance(leaf, jax.Array) for leaf in jax.tree.leaves(value))
    except Exception:
        return True


def _class_name(obj: Any) -> str:
    return type(obj).__name__ if obj is not None else "the tree"


def _type_name(node_type: type) -> str:
    name = registry.type_name(node_type)
    qualified = f"{node_type.__module__}.{node_type.__qualname__}"
    return node_type.__name__ if name == qualified else f"{node_type.__name__} (saved as {name!r})"
