"""The two helpers of jax_sgmc's ``util`` package that its io tests use, for the ported tests.

``list_vmap`` maps a function over several pytrees of one structure (stacked along a new first axis, then split
again); ``testing.assert_equal`` compares two pytrees leaf by leaf, exactly, and ``testing.assert_close`` within a
few float32 roundings (``rtol=1e-6``), for results of two programs that XLA may compile to differently rounded code.

>>> import jax.numpy as jnp
>>> from jax_sgmc_util import list_vmap, testing
>>> list_vmap(lambda tree: {"a": tree["a"] + 1})({"a": jnp.zeros(2)}, {"a": jnp.ones(2)})[1]["a"]
Array([2., 2.], dtype=float32)
>>> testing.assert_equal({"a": jnp.ones(2)}, {"a": jnp.ones(2)})
{'a': None}
>>> testing.assert_close({"a": jnp.ones(2)}, {"a": jnp.ones(2) + 1e-7})
{'a': None}
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["list_vmap", "testing"]


def list_vmap(fun: Callable[[Any], Any]) -> Callable[..., list[Any]]:
    """``fun`` vmapped over the pytrees given as arguments; returns one result per argument."""
    mapped = jax.vmap(fun, 0, 0)

    @functools.wraps(fun)
    def vmapped(*pytrees: Any) -> list[Any]:
        stacked = jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves, axis=0), *pytrees)
        leaves, treedef = jax.tree_util.tree_flatten(mapped(stacked))
        return [treedef.unflatten([leaf[index] for leaf in leaves]) for index in range(leaves[0].shape[0])]

    return vmapped


testing = SimpleNamespace(
    assert_equal=functools.partial(jax.tree_util.tree_map, np.testing.assert_array_equal),
    assert_close=functools.partial(jax.tree_util.tree_map, functools.partial(np.testing.assert_allclose, rtol=1e-6)),
)
