"""FlareJax modules checked, when a save is asked for, to rebuild from what the file will hold.

FlareJax rebuilds a module's dicts, lists, tuples and modules, and no other container: a module holding an
``OrderedDict``, a ``defaultdict`` or a namedtuple saved, and no load could rebuild it (FlareJax's own ``save``
refuses it too). Each FlareJax module of a tree is rebuilt once from its flattened form, around stand-in leaves.

>>> import collections, jax.numpy as jnp, flarejax as flr
>>> class Layer(flr.Module):
...     def __init__(self, config):
...         self.config, self.w = config, jnp.ones(2)
>>> refuse_unrebuildable_modules({"layer": Layer({"width": 2})}, file="model.jxs")  # a dict: rebuilt
>>> refuse_unrebuildable_modules({"layer": Layer(collections.OrderedDict(width=2))}, file="model.jxs")
Traceback (most recent call last):
jaxstow.errors.UnsaveableObjectError: cannot save leaf 'layer' of model.jxs: ... holds what FlareJax cannot rebuild ...
"""

from __future__ import annotations

import sys
from typing import Any

import jax

from jaxstow._format.keypaths import path_to_str
from jaxstow.errors import UnsaveableObjectError

__all__ = ["refuse_unrebuildable_modules"]


def refuse_unrebuildable_modules(tree: Any, *, file: str | None) -> None:
    """Refuse, with an :class:`~jaxstow.errors.UnsaveableObjectError` naming its path, a FlareJax module of ``tree``
    that its class cannot rebuild from its flattened form (nothing is looked at where FlareJax is not imported)."""
    module = getattr(sys.modules.get("flarejax"), "Module", None)
    if module is None:
        return
    nodes = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda node: isinstance(node, module))[0]
    for keys, node in nodes:
        if not isinstance(node, module):
            continue
        leaves, aux = node.tree_flatten()  # the whole module: the modules inside it too
        try:
            type(node).tree_unflatten(aux, [object()] * len(leaves))
        except Exception as error:  # FlareJax's ValueError, or a module's own checks
            raise UnsaveableObjectError(
                node,
                file=file,
                path=path_to_str(keys),
                advice=(
                    f"a FlareJax module that holds what FlareJax cannot rebuild ({type(error).__name__}: {error}): "
                    "it rebuilds dicts, lists, tuples and modules, so hold a dict(...) or a tuple(...) in its place"
                ),
            ) from None
