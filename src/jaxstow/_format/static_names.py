"""The attribute that holds each value of a node's static data, written beside it and checked when the node is
rebuilt.

A node's static data is stored by position: equinox keeps a module's static fields, and ``register_dataclass`` its
meta fields, as a tuple in field order. Two static fields that changed order since the save (or a field renamed)
would take each other's values, silently, as the values alone do not tell where they went. So a save records, for a
tuple of static data, the attribute that held each value (found by building the node once), and a load refuses a
class that now puts a value into another attribute.

>>> import dataclasses, jax, jax.numpy as jnp
>>> @jax.tree_util.register_dataclass
... @dataclasses.dataclass
... class Dense:
...     w: jax.Array
...     n_in: int = dataclasses.field(metadata={"static": True})
...     n_out: int = dataclasses.field(metadata={"static": True})
>>> node_type, aux = jax.tree_util.tree_structure(Dense(jnp.ones(2), 3, 5)).node_data()
>>> names = static_names(node_type, aux, 1)
>>> names, static_problem(node_type, aux, 1, names)
(['n_in', 'n_out'], None)
>>> static_problem(node_type, (5, 3), 1, ["n_out", "n_in"])  # a file saved when the fields were in the other order
"Dense's static data saved in 'n_out' (5) would be rebuilt into 'n_in'; the class changed since the save"
"""

from __future__ import annotations

from typing import Any

from jaxstow._format.attribute_paths import attributes, built_node
from jaxstow.errors import StructureMismatchError, excerpt

__all__ = ["check_static_names", "static_names", "static_problem", "with_static_names"]

#: The member of a structure node that names the attribute of each item of its static data (``aux``).
AUX_NAMES = "aux_names"


def static_names(node_type: type, aux: Any, count: int) -> list[str | None] | None:
    """The attribute that holds each item of ``aux`` (``None`` where none does), for a node of ``count`` children;
    ``None`` where ``aux`` is no tuple, the node cannot be built, or no attribute holds an item of it."""
    if not (isinstance(aux, tuple) and aux):
        return None
    built = built_node(node_type, aux, count)
    if built is None:
        return None
    held = attributes(built)
    holders = [[name for name, value in held if value is item] for item in aux]
    # An object that several attributes hold (one tuple as two fields' default) names none of them: it is the same
    # value whichever it goes to.
    names = [found[0] if len(found) == 1 else None for found in holders]
    return names if any(names) else None


def static_problem(node_type: type, aux: Any, count: int, saved: Any) -> str | None:
    """Where this process's class puts an item of ``aux`` into another attribute than ``saved`` (what
    :func:`static_names` gave when the node was saved) names; ``None`` if it does not, or nothing was saved."""
    if saved is None:
        return None
    if not (isinstance(saved, list) and isinstance(aux, tuple) and len(saved) == len(aux)):
        return f"{node_type.__qualname__}'s aux_names {excerpt(saved)} do not name its static data {excerpt(aux)}"
    built = built_node(node_type, aux, count)
    if built is None:
        return None  # a class that cannot be built so is refused, or named, where it is rebuilt
    held = attributes(built)
    now = dict(held)
    for item, was in zip(aux, saved, strict=True):
        if was is not None and not (was in now and _alike(now[was], item)):
            is_now = next((name for name, value in held if value is item), None)
            where = f"into {is_now!r}" if is_now else "into no attribute"
            return (
                f"{node_type.__qualname__}'s static data saved in {was!r} ({excerpt(item)}) would be rebuilt {where}; "
                "the class changed since the save"
            )
    return None


def _alike(value: Any, item: Any) -> bool:
    """Whether an attribute's ``value`` is ``item``, or an equal value of its class: the same static data either way."""
    if value is item:
        return True
    try:
        return type(value) is type(item) and bool(value == item)
    except Exception:  # a value that == does not answer with one truth value
        return False


def with_static_names(node: dict[str, Any], node_type: type, aux: Any, count: int) -> dict[str, Any]:
    """A structure node's JSON, with the names of its static data where :func:`static_names` finds them."""
    names = static_names(node_type, aux, count)
    return node if names is None else {**node, AUX_NAMES: names}


def check_static_names(node_type: type, aux: Any, count: int, saved: Any, *, path: str, file: str | None) -> None:
    """Raise a :class:`~jaxstow.errors.StructureMismatchError` where :func:`static_problem` finds one."""
    if problem := static_problem(node_type, aux, count, saved):
        raise StructureMismatchError([f"{path!r}: {problem}; load the file with the class as it was saved"], file=file)
