"""A tree flattened for a save, with jax's bare errors about it turned into jaxstow's, naming the file and the place.

jax cannot flatten a dict whose keys it cannot sort (``int`` and ``str`` keys mixed), and cannot read an array that has
been deleted (donated to a jitted function); both say neither where nor what to do. The search for the place runs only
once jax has failed, so that a save pays nothing for it.

>>> import jax.numpy as jnp
>>> from jaxstow._write.flattening import flatten
>>> flatten({"layers": [{1: jnp.ones(2), "bias": jnp.zeros(2)}]}, file="model.jxs")
Traceback (most recent call last):
    ...
jaxstow.errors.ArgumentError: cannot save the dict at 'layers/0' of model.jxs: its keys mix int and str, which jax cannot sort (it orders a dict's leaves by their keys): give it keys of one type that sorts, such as {str(key): value for key, value in d.items()}
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax.tree_util import PyTreeDef

from jaxstow._format.keypaths import path_to_str
from jaxstow.errors import ArgumentError, JaxstowError

__all__ = ["flatten", "naming_deleted_arrays"]


def flatten(tree: Any, *, file: str) -> tuple[list[Any], PyTreeDef]:
    """jax's leaves and structure of ``tree``; a dict whose keys jax cannot sort is an :class:`ArgumentError`."""
    if _deeper_than(tree, _DEEPEST):  # jax's flatten of such a tree can leave Python's recursion count broken
        raise cycle_error(file)
    try:
        leaves, treedef = jax.tree_util.tree_flatten(tree)
    except RecursionError:
        raise cycle_error(file) from None
    except SystemError as error:  # jax's C++ flatten reports its RecursionError so
        if not isinstance(error.__cause__, RecursionError):
            raise
        raise cycle_error(file) from None
    except ValueError:
        found = _unsortable_dict(tree, ())
        if found is None:
            raise
    else:
        _refuse_traced(tree, leaves, file=file)
        _refuse_shared_variables(tree, leaves, file=file)
        return leaves, treedef
    path, keys = found
    where = f"the dict at {path!r}" if path else "the dict at the root of the tree"
    kinds = sorted({type(key).__name__ for key in keys})
    problem = (
        f"mix {' and '.join(kinds)}, which jax cannot sort"
        if len(kinds) > 1
        else f"are of the class {kinds[0]}, which has no order for jax to sort them by"
    )
    raise ArgumentError(
        f"cannot save {where}{f' of {file}' if file else ''}: its keys {problem} (it orders a dict's leaves by their "
        "keys): give it keys of one type that sorts, such as {str(key): value for key, value in d.items()}",
        file=file or None,
        path=path,
    ) from None


#: The deepest nesting of dicts, lists and tuples saved: a file's structure holds no deeper one (its JSON would be
#: refused when read), and jax's flatten of a much deeper one breaks the interpreter's recursion count.
_DEEPEST = 400


def _deeper_than(tree: Any, depth: int) -> bool:
    """Whether dicts, lists and tuples in ``tree`` nest deeper than ``depth``, found without recursion.

    >>> nested = [1]
    >>> for _ in range(500):
    ...     nested = {"a": nested}
    >>> _deeper_than(nested, 400), _deeper_than({"a": [1, (2,)]}, 400)
    (True, False)
    """
    stack: list[tuple[Any, int]] = [(tree, 0)]
    while stack:
        node, level = stack.pop()
        if level > depth:
            return True
        if isinstance(node, dict):
            stack.extend((child, level + 1) for child in node.values())
        elif isinstance(node, list | tuple):
            stack.extend((child, level + 1) for child in node)
    return False


def cycle_error(file: str, path: str | None = None) -> ArgumentError:
    """The error of a tree (or of its leaf at ``path``) that leads back to itself, or nests deeper than Python
    follows."""
    what = "the tree" if path is None else f"leaf {path!r}"
    return ArgumentError(
        f"cannot save {what}{f' of {file}' if file else ''}: it nests deeper than Python follows, or an object in "
        "it leads back to itself through its attributes (a parent pointer): save it without the cycle",
        file=file or None,
        path=path,
    )


def _refuse_traced(tree: Any, leaves: Sequence[Any], *, file: str) -> None:
    """A leaf traced by ``jax.jit``, ``vmap`` or ``grad`` (the save called inside them) is an :class:`ArgumentError`
    naming its path: it has no value to write yet."""
    traced = next((index for index, leaf in enumerate(leaves) if isinstance(leaf, jax.core.Tracer)), None)
    if traced is None:
        return
    path = path_to_str(jax.tree_util.tree_flatten_with_path(tree)[0][traced][0])
    what = f"leaf {path!r}" if path else "the array"
    raise ArgumentError(
        f"cannot save {what}{f' of {file}' if file else ''}: it is a value traced by jax.jit, vmap or grad, "
        "which has no value yet (the save is called inside the traced function, where it would run once, at "
        "tracing): save the function's results outside it, or stream values from inside jit with jaxstow.io.save",
        file=file or None,
        path=path,
    )


def _refuse_shared_variables(tree: Any, leaves: Sequence[Any], *, file: str) -> None:
    """Refuse a tree in which one flax nnx ``Variable`` sits at two places (tied weights, a shared submodule).

    jax flattens it once per place, so a file would restore two independent copies, and an update through one
    would no longer reach the other; ``nnx.split`` keeps the sharing in its graph definition. Looked for only when
    one array is a leaf twice, which an nnx tree without sharing never has.
    """
    nnx = sys.modules.get("flax.nnx")
    if nnx is None:
        return
    arrays = [id(leaf) for leaf in leaves if isinstance(leaf, jax.Array | np.ndarray)]
    if len(set(arrays)) == len(arrays):
        return
    first: dict[int, str] = {}

    def is_variable(node: Any) -> bool:
        return isinstance(node, nnx.Variable)

    for key_path, node in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_variable)[0]:
        if not is_variable(node):
            continue
        path = path_to_str(key_path)
        if id(node) in first:
            raise ArgumentError(
                f"cannot save {path!r}{f' of {file}' if file else ''}: it is the flax nnx Variable at "
                f"{first[id(node)]!r} too (tied weights, a shared submodule), which a file would restore as two "
                "independent copies: save graphdef, state = nnx.split(model) as {'graphdef': graphdef, 'state': "
                "state} and nnx.merge them after loading, which keeps the sharing",
                file=file or None,
                path=path,
            )
        first[id(node)] = path


def _unsortable_dict(node: Any, keys: tuple[Any, ...]) -> tuple[str, list[Any]] | None:
    """The path and keys of the first dict under ``node`` (at the key path ``keys``) that jax cannot flatten."""
    try:
        children, _ = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda child: child is not node)
    except ValueError:
        return (path_to_str(keys), list(node)) if isinstance(node, dict) else None
    for key_path, child in children:
        found = _unsortable_dict(child, keys + key_path) if key_path else None
        if found is not None:
            return found
    return None


@contextlib.contextmanager
def naming_deleted_arrays(paths: Callable[[], Sequence[str]], leaves: Sequence[Any], *, file: str) -> Iterator[None]:
    """Within it, a deleted jax array among ``leaves`` read by the save is an :class:`ArgumentError` naming its path.

    jax raises a ``RuntimeError`` reading one, a ``ValueError`` aliasing one (as a save does on an accelerator).
    ``paths()`` gives the leaves' paths, asked for only then.
    """
    try:
        yield
    except JaxstowError:
        raise
    except (RuntimeError, ValueError):
        deleted = [i for i, leaf in enumerate(leaves) if isinstance(leaf, jax.Array) and leaf.is_deleted()]
        if not deleted:
            raise
        leaf, path = leaves[deleted[0]], paths()[deleted[0]]
        where = f"leaf {path!r}" if path else "the root of the tree"
        raise ArgumentError(
            f"cannot save {where}{f' of {file}' if file else ''}: its array ({leaf.dtype}{list(leaf.shape)}) "
            "has been deleted, as donating it to a jitted function (donate_argnums) does: save it before the call "
            "that donates it, or save what the call returned",
            file=file or None,
            path=path,
        ) from None
