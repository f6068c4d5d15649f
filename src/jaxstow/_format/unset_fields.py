"""The dataclass instances and FlareJax modules a file's structure builds hold a value for each field their class's
``__init__`` takes (or attribute it sets).

A node type's own unflatten (FlareJax's, equinox's, ``jax.tree_util.register_dataclass``'s) sets the attributes the
file names: a field added or renamed since the save was left unset, and read as the class's default (or an
``AttributeError`` at first use), with no error. :func:`refuse_unset_fields` refuses it, as a class saved by its
attributes is refused (:func:`~jaxstow._format.objects.refuse_missing_fields`).

>>> import dataclasses, jax
>>> @dataclasses.dataclass
... class Scaled:
...     w: jax.Array
...     shift: float = 0.5                  # added since the save
>>> node = object.__new__(Scaled); node.w = 1.0   # as an unflatten given the file's attributes builds it
>>> refuse_unset_fields({"model": node}, file="model.jxs", path="")
Traceback (most recent call last):
jaxstow.errors.StructureMismatchError: model.jxs does not fit the given structure (1 problem): ...
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import jax

from jaxstow._format.attribute_paths import join
from jaxstow._format.keypaths import path_to_str
from jaxstow._format.objects import refuse_missing_fields
from jaxstow._names import registry

__all__ = ["refuse_unset_fields"]


def refuse_unset_fields(built: Any, *, file: str | None, path: str) -> None:
    """Refuse, with a :class:`~jaxstow.errors.StructureMismatchError` naming its path, a dataclass instance or a
    FlareJax module in ``built`` (a tree a structure gave, at ``path``) that lacks one of its class's ``__init__``
    fields (or attributes its ``__init__`` always sets) among its attributes."""
    nodes = [(path, built)]
    while nodes:
        where, node = nodes.pop()
        if _flattened_whole(node) and hasattr(node, "__dict__"):
            cls = type(node)
            name = registry.attribute_class_name(cls) or cls.__qualname__
            refuse_missing_fields(cls, name, list(vars(node)), file=file, path=where)
        try:
            children = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda child, node=node: child is not node)[0]
        except (TypeError, ValueError):  # a dict whose keys do not sort, which jax cannot flatten: not looked into
            continue
        nodes.extend((join(where, path_to_str(keys)), child) for keys, child in children if keys)


def _flattened_whole(node: Any) -> bool:
    """Whether ``node`` is an instance whose type flattens it whole, so that an attribute its ``__init__`` sets and
    the file lacks was renamed or added since the save: a dataclass (its fields), a FlareJax module (every attribute).
    Other pytree classes may leave attributes out of their children by design."""
    if isinstance(node, type):
        return False
    flarejax = sys.modules.get("flarejax")
    return dataclasses.is_dataclass(node) or isinstance(node, getattr(flarejax, "Module", ()))
