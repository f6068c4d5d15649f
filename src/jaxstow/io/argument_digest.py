"""A digest of the arguments a sampling run starts from (its data, its initial positions), recorded in the run's file
so that the same call with other data starts no run on top of it.

Arrays count by dtype, shape and every byte (typed PRNG keys by their data), plain values (numbers, strings, ``None``)
by their ``repr``, any other object (an array of objects, deleted or traced too) by its class alone, and the tree by
its paths.

>>> import jax.numpy as jnp
>>> from jaxstow.io.argument_digest import argument_digest
>>> data = {"y": jnp.arange(4.0)}
>>> argument_digest(data) == argument_digest({"y": jnp.arange(4.0)})
True
>>> argument_digest(data) == argument_digest({"y": jnp.arange(4.0) + 50})
False
"""

from __future__ import annotations

import hashlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["argument_digest"]

_PLAIN = (bool, int, float, complex, str, bytes, type(None))


def argument_digest(tree: Any) -> str:
    """The hex digest of ``tree``'s paths and leaves (see the module)."""
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
        else:
            digest.update((repr(leaf) if isinstance(leaf, _PLAIN) else type(leaf).__qualname__).encode())
    return digest.hexdigest()


def _unreadable(leaf: Any) -> bool:
    """Whether ``leaf`` is an array whose bytes cannot be read: of objects, deleted or traced."""
    if isinstance(leaf, np.ndarray | np.generic):
        return leaf.dtype == object
    return isinstance(leaf, jax.core.Tracer) or (isinstance(leaf, jax.Array) and leaf.is_deleted())
