"""Whether two static values (a node's aux data, a leaf that is no array) are the same, as a restore compares them.

Of one class; containers item by item (a dict's order aside); floats by their text, so that a NaN is itself and
``-0.0`` is not ``0.0``; ``functools.partial`` (and ``jax.tree_util.Partial``) by function, arguments and keywords,
which ``==`` compares by identity; anything else by ``==``. A tree structure is the same as another where its nodes'
types and aux data are, so compared.

>>> import functools, jax
>>> same_static(float("nan"), float("nan")), same_static(0.0, -0.0)
(True, False)
>>> same_static(functools.partial(jax.nn.leaky_relu, negative_slope=0.1),
...             functools.partial(jax.nn.leaky_relu, negative_slope=0.1))
True
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from jax.tree_util import PyTreeDef

__all__ = ["same_static", "same_structure"]


def same_static(a: Any, b: Any, *, uncomparable: bool = True) -> bool:
    """Whether ``a`` and ``b`` are the same static value; ``uncomparable`` when their ``==`` raises or gives no
    truth value (an array)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, functools.partial):
        return all(same_static(x, y, uncomparable=uncomparable) for x, y in _parts(a, b))
    if isinstance(a, tuple | list):
        return len(a) == len(b) and all(same_static(x, y, uncomparable=uncomparable) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_static(v, b[k], uncomparable=uncomparable) for k, v in a.items())
    if isinstance(a, float | complex | np.inexact):
        return repr(a) == repr(b)  # -0.0 is not 0.0, and a NaN is itself here
    try:
        equal = a == b
        return equal if isinstance(equal, bool) else bool(equal)
    except Exception:
        return uncomparable


def _parts(a: functools.partial[Any], b: functools.partial[Any]) -> list[tuple[Any, Any]]:
    return [(a.func, b.func), (a.args, b.args), (a.keywords, b.keywords)]


def same_structure(a: PyTreeDef, b: PyTreeDef) -> bool:
    """Whether two tree structures are the same: their nodes' types and aux data, compared by :func:`same_static`."""
    if a == b:
        return True
    if a.num_nodes != b.num_nodes or a.num_leaves != b.num_leaves:
        return False
    ours, theirs = a.node_data(), b.node_data()
    if ours is None or theirs is None:  # a leaf, or None
        return ours is None and theirs is None and a == b
    if ours[0] is not theirs[0] or not same_static(ours[1], theirs[1], uncomparable=False):
        return False
    return all(same_structure(x, y) for x, y in zip(a.children(), b.children(), strict=True))
