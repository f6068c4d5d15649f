"""What ``jaxstow diff`` compares besides the leaves: the two files' stored structures, node by node.

A file's structure is its header's encoded tree (:mod:`jaxstow._format.skeleton`): each node's kind (a dict, a list, a
tuple, ``None``, a registered class by name) and a class's static data (hyperparameters, static fields). Two files with
the same leaves can still load as different trees; each place they differ is one row. Nothing is decoded or imported:
the classes need not exist in the process that compares. A plain file (safetensors, npz) is a flat dict of its names.

>>> from jaxstow.cli.diff_structure import structure_differences
>>> a = {"dict": [["mask", None], ["x", {"tuple": ["*", "*"]}]]}
>>> b = {"dict": [["x", {"list": ["*", "*"]}]]}
>>> for row in structure_differences(a, b, ["x/0", "x/1"], ["x/0", "x/1"]):
...     print(row["path"], "|", row["difference"])
mask | structure differs: None only in A
x | structure differs: a tuple in A, a list in B
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from jaxstow._format.attribute_paths import aux_path, join
from jaxstow._format.skeleton import decode_value
from jaxstow._names import registry
from jaxstow.cli.inspect import value_text

__all__ = ["flat_structure", "same_value", "structure_differences"]

JSON = Any
#: The most positions of a class's static data named in one row; the rest are counted.
_SHOWN = 4


def same_value(a: JSON, b: JSON) -> bool:
    """Whether two pieces of tagged JSON are the same value, types and all: ``1``, ``True`` and ``1.0`` differ.

    >>> same_value(1, True), same_value({"tuple": [1, "a"]}, {"tuple": [1, "a"]}), same_value([0], [False])
    (False, True, False)
    """
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_value(a[key], b[key]) for key in a)
    return bool(a == b)


def flat_structure(paths: Sequence[str]) -> JSON:
    """The structure of a plain file, which loads as a flat dict of its names.

    >>> flat_structure(["b", "a"])
    {'dict': [['a', '*'], ['b', '*']]}
    """
    return {"dict": [[name, "*"] for name in sorted(paths)]}


def structure_differences(a: JSON, b: JSON, a_paths: Sequence[str], b_paths: Sequence[str]) -> list[dict[str, Any]]:
    """Each place two encoded structures differ, as a row of ``jaxstow diff`` (path, kind ``"structure"``, text).

    ``a_paths`` and ``b_paths`` are the files' leaf paths in leaf order: they name the children of classes, and a
    subtree on one side only is a row when its leaves do not already show it (it holds none, or leaves of the same
    paths as the other side's).
    """
    walk = _Walk(a_paths, b_paths)
    walk.node(a, b, "", 0, 0)
    return walk.found


class _Walk:
    """Both structures, walked side by side; ``found`` the rows."""

    def __init__(self, a_paths: Sequence[str], b_paths: Sequence[str]) -> None:
        self.paths = (list(a_paths), list(b_paths))
        self.others = (set(b_paths), set(a_paths))
        self.found: list[dict[str, Any]] = []

    def add(self, path: str, text: str) -> None:
        self.found.append({"path": path, "kind": "structure", "difference": f"structure differs: {text}"})

    def node(self, a: JSON, b: JSON, path: str, a_at: int, b_at: int) -> None:
        """Compare the nodes ``a`` and ``b`` at ``path``, whose first leaves are leaf ``a_at`` of A and ``b_at`` of B."""
        if same_value(a, b):
            return
        kind_a, kind_b = _kind(a), _kind(b)
        if kind_a != kind_b:
            self.add(path, f"{_described(a)} in A, {_described(b)} in B")
            return
        if kind_a == "dict":
            self._dict(a["dict"], b["dict"], path, a_at, b_at)
        elif kind_a in ("list", "tuple"):
            self._sequence(a[kind_a], b[kind_a], path, a_at, b_at)
        elif kind_a.startswith("node "):
            self._class(a, b, path, a_at, b_at)

    def _dict(self, a: list[Any], b: list[Any], path: str, a_at: int, b_at: int) -> None:
        a_keys, b_keys = [_key_text(key) for key, _ in a], [_key_text(key) for key, _ in b]
        a_starts, b_starts = _starts(a_at, [child for _, child in a]), _starts(b_at, [child for _, child in b])
        b_index = {key: i for i, key in enumerate(b_keys)}
        for i, key in enumerate(a_keys):
            match = b_index.get(key)
            if match is not None and same_value(a[i][0], b[match][0]):
                self.node(a[i][1], b[match][1], join(path, key), a_starts[i], b_starts[match])
            else:
                self._one_side(0, a[i][1], join(path, key), a_starts[i])
        a_index = {key: i for i, key in enumerate(a_keys)}
        for j, key in enumerate(b_keys):
            match = a_index.get(key)
            if match is None or not same_value(a[match][0], b[j][0]):
                self._one_side(1, b[j][1], join(path, key), b_starts[j])

    def _sequence(self, a: list[Any], b: list[Any], path: str, a_at: int, b_at: int) -> None:
        a_starts, b_starts = _starts(a_at, a), _starts(b_at, b)
        for i in range(min(len(a), len(b))):
            self.node(a[i], b[i], join(path, i), a_starts[i], b_starts[i])
        for i in range(len(b), len(a)):
            self._one_side(0, a[i], join(path, i), a_starts[i])
        for i in range(len(a), len(b)):
            self._one_side(1, b[i], join(path, i), b_starts[i])

    def _class(self, a: JSON, b: JSON, path: str, a_at: int, b_at: int) -> None:
        name = str(a["node"])
        if not same_value(a.get("aux"), b.get("aux")):
            changes = _aux_changes(a.get("aux"), b.get("aux"), _attribute_namer(a))
            self.add(path, f"static data of {name}: {changes}")
        a_children, b_children = list(a["children"]), list(b["children"])
        if len(a_children) != len(b_children):
            self.add(path, f"{name} has {len(a_children)} children in A, {len(b_children)} in B")
            return
        a_starts, b_starts = _starts(a_at, a_children), _starts(b_at, b_children)
        for i, (left, right) in enumerate(zip(a_children, b_children, strict=True)):
            child = self._child_name(path, i, a_starts[i], _leaves(left), b_starts[i], _leaves(right))
            self.node(left, right, child, a_starts[i], b_starts[i])

    def _child_name(self, path: str, index: int, a_at: int, a_count: int, b_at: int, b_count: int) -> str:
        """The path of a class's child ``index``: its key, read off the path of a leaf below it; else its index."""
        for side, at, count in ((0, a_at, a_count), (1, b_at, b_count)):
            if count and at < len(self.paths[side]):
                leaf = self.paths[side][at]
                rest = leaf[len(path) + 1 :] if path else leaf
                if (not path or leaf.startswith(f"{path}/")) and rest:
                    return join(path, rest.split("/")[0])
        return join(path, index)

    def _one_side(self, side: int, subtree: JSON, path: str, at: int) -> None:
        """A key or an item only one side has: a row unless that side's own leaves below it show it."""
        leaves = self.paths[side][at : at + _leaves(subtree)]
        if not leaves or any(leaf in self.others[side] for leaf in leaves):
            self.add(path, f"{_described(subtree)} only in {'AB'[side]}")


def _kind(node: JSON) -> str:
    if node == "*":
        return "leaf"
    if node is None:
        return "None"
    if isinstance(node, dict):
        if isinstance(node.get("node"), str):
            return f"node {node['node']}"
        for tag in ("dict", "list", "tuple"):
            if tag in node:
                return tag
    return f"unreadable {value_text(node, 30)}"


def _described(node: JSON) -> str:
    """A node in words: ``a leaf``, ``None``, ``a dict``, ``an empty list``, ``equinox.nn.Linear``."""
    kind = _kind(node)
    if kind in ("leaf", "dict", "list", "tuple"):
        empty = kind != "leaf" and not node[kind]
        return f"{'an empty' if empty else 'a'} {kind}"
    return kind.removeprefix("node ")


def _key_text(key: JSON) -> str:
    return key if isinstance(key, str) else str(key) if type(key) is int else value_text(key, 30)


def _leaves(node: JSON) -> int:
    """How many leaves an encoded structure holds."""
    if node == "*":
        return 1
    if not isinstance(node, dict):
        return 0
    if "children" in node:
        return sum(_leaves(child) for child in node["children"])
    if isinstance(node.get("dict"), list):
        return sum(_leaves(pair[1]) for pair in node["dict"] if isinstance(pair, list) and len(pair) == 2)
    items = node.get("list", node.get("tuple"))
    return sum(_leaves(child) for child in items) if isinstance(items, list) else 0


def _starts(first: int, children: Sequence[JSON]) -> list[int]:
    """The index of the first leaf of each child, the first child's being ``first``."""
    starts = []
    for child in children:
        starts.append(first)
        first += _leaves(child)
    return starts


def _attribute_namer(node: JSON) -> Callable[[str], str]:
    """What names a position inside a class's static data: the attribute that holds it, where the class is known in
    this process and says so (an equinox module's static field), else the position itself."""

    def position(where: str) -> str:
        return where or "(all)"

    try:
        node_type = registry.lookup(node["node"], node_type=True)
        aux = decode_value(node.get("aux"))
    except Exception:  # an unknown class, or data it cannot take here: positions it is
        return position
    if not isinstance(node_type, type):
        return position

    def named(where: str) -> str:
        try:
            found = aux_path(node_type, aux, len(node["children"]), where.split("/") if where else [])
        except Exception:  # a class that cannot be built to name its attributes
            found = None
        return "/".join(found) if found else position(where)

    return named


def _aux_changes(a: JSON, b: JSON, name: Callable[[str], str] = lambda where: where or "(all)") -> str:
    """Where two classes' static data differ: up to a few positions inside it (by ``name``) with both values.

    >>> _aux_changes({"tuple": [None, "relu", 4]}, {"tuple": [None, "tanh", 8]})
    "1 'relu' -> 'tanh', 2 4 -> 8"
    """
    changes: list[tuple[str, JSON, JSON]] = []
    _collect(a, b, "", changes)
    shown = [f"{name(where)} {value_text(x, 30)} -> {value_text(y, 30)}" for where, x, y in changes[:_SHOWN]]
    more = len(changes) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def _collect(a: JSON, b: JSON, where: str, changes: list[tuple[str, JSON, JSON]]) -> None:
    """The positions (``1``, ``2/0``) inside two values where they differ, going down tuples and lists of one length."""
    if same_value(a, b):
        return
    if isinstance(a, dict) and isinstance(b, dict) and len(a) == len(b) == 1 and a.keys() == b.keys():
        [tag] = a
        left, right = a[tag], b[tag]
        if tag in ("tuple", "list") and isinstance(left, list) and isinstance(right, list) and len(left) == len(right):
            for i, (x, y) in enumerate(zip(left, right, strict=True)):
                _collect(x, y, join(where, i), changes)
            return
    changes.append((where, a, b))
