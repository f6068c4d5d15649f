"""A digest of the arguments a sampling run starts from (its data, its initial positions), recorded in the run's file
so that the same call with other data starts no run on top of it.

Arrays count by dtype, shape and every byte (typed PRNG keys by their data), plain values (numbers, strings, ``None``)
by their ``repr``, any other object by its class and what it holds (a pandas object's values and labels, an
array-like's array, or its attributes, three levels down; an array of objects, deleted or traced, by its class alone),
and the tree by its paths.

>>> import jax.numpy as jnp
>>> from jaxstow.io.argument_digest import argument_digest
>>> data = {"y": jnp.arange(4.0)}
>>> argument_digest(data) == argument_digest({"y": jnp.arange(4.0)})
True
>>> argument_digest(data) == argument_digest({"y": jnp.arange(4.0) + 50})
False
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["argument_digest"]

_PLAIN = (bool, int, float, complex, str, bytes, type(None))


def argument_digest(tree: Any, depth: int = 3) -> str:
    """The hex digest of ``tree``'s paths and leaves (see the module); objects' attributes ``depth`` levels down."""
    digest = hashlib.blake2b(digest_size=16)
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        digest.update(jax.tree_util.keystr(path).encode())
        if isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        if _unreadable(leaf):  # of objects, deleted, or traced: by its class
            digest.update(type(leaf).__qualname__.encode())
        elif isinstance(leaf, jax.Array | np.ndarray | np.generic):
            array = np.ascontiguousarray(jax.device_get(leaf))
            digest.update(f"{array.dtype.str}{array.shape}".encode())
            digest.update(array.reshape(-1).view(np.uint8).data)
        elif isinstance(leaf, _PLAIN):
            digest.update(repr(leaf).encode())
        else:
            digest.update(type(leaf).__qualname__.encode())
            digest.update(_object_data(leaf, depth).encode())
    return digest.hexdigest()


def _object_data(leaf: Any, depth: int) -> str:
    """What another object holds: a pandas object's values and labels, an array-like's array, or its attributes (not
    a callable's: a function's attributes may be caches, which differ from process to process)."""
    if callable(leaf):
        return ""
    pandas = sys.modules.get("pandas")
    if pandas is not None and isinstance(leaf, pandas.DataFrame | pandas.Series | pandas.Index):
        labels = [list(leaf.columns)] if isinstance(leaf, pandas.DataFrame) else []
        return argument_digest([pandas.util.hash_pandas_object(leaf).to_numpy(), repr(labels)])
    if hasattr(leaf, "__array__") and not isinstance(leaf, jax.core.Tracer):
        with contextlib.suppress(Exception):  # an xarray object, a list-like of numbers
            array = np.asarray(leaf)
            if array.dtype != object:
                return argument_digest(array)
    attributes = getattr(leaf, "__dict__", None)
    if depth > 0 and isinstance(attributes, dict):
        with contextlib.suppress(Exception):  # a pytree jax cannot flatten (a dict of unorderable keys)
            return argument_digest({str(name): value for name, value in attributes.items()}, depth - 1)
    return ""


def _unreadable(leaf: Any) -> bool:
    """Whether ``leaf`` is an array whose bytes cannot be read: of objects, deleted or traced."""
    if isinstance(leaf, np.ndarray | np.generic):
        return leaf.dtype == object
    return isinstance(leaf, jax.core.Tracer) or (isinstance(leaf, jax.Array) and leaf.is_deleted())
