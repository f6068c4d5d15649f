"""The node of a decoded structure that its class cannot rebuild, named by its path and class.

A structure is rebuilt once, whole, with placeholder leaves; a class that raises then (one that gained a field since
the save, whose static data no longer fits; one whose ``__init__`` checks its arrays) is found here, only when that
fails, by rebuilding each node below the root on its own, deepest first.

>>> import jax, numpy as np
>>> class Strict:
...     def __init__(self, w):
...         self.w = w.ndim  # checks its arrays, which jax's pytree classes must not
>>> jax.tree_util.register_pytree_node(Strict, lambda node: ((node.w,), None), lambda _, children: Strict(*children))
>>> treedef = jax.tree_util.tree_structure({"layer": Strict(np.ones(2))})
>>> unbuilt_error(AttributeError("no ndim"), treedef, path="", file="model.jxs")  # doctest: +ELLIPSIS
FormatError("leaf 'layer' of model.jxs: Strict cannot be rebuilt from the file (AttributeError: no ndim): the ...")
"""

from __future__ import annotations

import dataclasses

from jax.tree_util import PyTreeDef

from jaxstow._format.attribute_paths import child_name, join
from jaxstow.errors import FormatError

__all__ = ["unbuilt_error"]


class _Placeholder:
    """A leaf of a node rebuilt only to see whether its class accepts it."""


def unbuilt_error(error: Exception, treedef: PyTreeDef | None, *, path: str, file: str | None) -> FormatError:
    """The :class:`FormatError` for ``error``, raised rebuilding ``treedef`` (the structure at ``path``, ``None``
    where it was not decoded), naming the node that raised it where one is found."""
    found = None if treedef is None else _unbuilt(treedef, path)
    where, node_type = found if found is not None else (path, None)
    cause = f"({type(error).__name__}: {error})"
    if node_type is None:
        problem = f"the structure cannot be rebuilt {cause}: a node's class refused"
    else:
        fields = (
            f" (its fields now: {', '.join(_field_names(node_type))})" if dataclasses.is_dataclass(node_type) else ""
        )
        problem = (
            f"{node_type.__qualname__} cannot be rebuilt from the file {cause}: the class changed since the "
            f"save{fields}, so load the file with the class as it was saved; or the class refused"
        )
    return FormatError(
        f"{problem} stand-in leaves, as one whose __init__ or __post_init__ checks its arrays does (jax's pytree "
        "classes must accept any leaves: jax too builds them so; check elsewhere), or the file was changed",
        file=file,
        path=where,
    )


def _unbuilt(treedef: PyTreeDef, path: str) -> tuple[str, type] | None:
    """The path and class of the deepest node of ``treedef`` that cannot be rebuilt around placeholders."""
    node_data = treedef.node_data()
    if node_data is None:  # a leaf
        return None
    node_type, aux = node_data
    children = treedef.children()
    for index, child in enumerate(children):
        key = index if node_type in (list, tuple) else child_name(node_type, aux, len(children), index)
        found = _unbuilt(child, join(path, key))
        if found is not None:
            return found
    try:
        treedef.unflatten([_Placeholder() for _ in range(treedef.num_leaves)])
    except Exception:  # the class's own unflatten, refusing what the file gives it
        return path, node_type
    return None


def _field_names(node_type: type) -> list[str]:
    return [field.name for field in dataclasses.fields(node_type)]
