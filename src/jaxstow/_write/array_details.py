"""The members of a JAX array's manifest entry that its bytes do not say: its weak type and where it lay.

>>> import jax, jax.numpy as jnp
>>> from jaxstow._write.array_details import array_details
>>> array_details([jnp.ones(2), jnp.asarray(2.0)])
{1: {'weak': True}}
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from jaxstow._format.memory_kinds import default_memory_kind
from jaxstow._format.sharding_description import describe_sharding, whole_placement

__all__ = ["DETAILED_KINDS", "array_details"]


def array_details(leaves: Sequence[Any]) -> dict[int, dict[str, Any]]:
    """The members of the entries of the ``jax.Array``\\ s of ``leaves`` (by index) that their bytes do not say:
    ``weak`` for an array of a weak type (``jnp.asarray(2.0)``), restored so, ``sharding`` for one on a device
    other than this process's first (:func:`~jaxstow._format.sharding_description.whole_placement`), and
    ``keys_sharding`` for PRNG keys (stored whole) laid out on several devices, both restored there by
    ``sharding="saved"``. One pass over the leaves, reading each array's sharding once."""
    details: dict[int, dict[str, Any]] = {}
    first = jax.local_devices()[0]
    usual = (None, default_memory_kind(first))  # a first device's sharding in its default memory: nothing recorded
    for i, leaf in enumerate(leaves):
        if not _is_jax_array_type(type(leaf)):
            continue
        sharding, weak = leaf.sharding, leaf.aval.weak_type
        # Most arrays are in the first device's default memory, which records nothing: told so by the device object
        # and the memory's name, at once.
        on_first = (
            type(sharding) is _ONE_DEVICE
            and getattr(sharding, "_device", None) is first
            and getattr(sharding, "_memory_kind", None) in usual
        )
        placed = None if on_first else whole_placement(sharding)
        member = "sharding"
        if placed is None and not on_first and _are_keys(leaf) and len(sharding.device_set) > 1:
            placed, member = describe_sharding(sharding), "keys_sharding"
        if weak or placed is not None:
            details[i] = {"weak": True} if weak else {}
            if placed is not None:
                details[i][member] = placed
    return details


def _are_keys(leaf: jax.Array) -> bool:
    """Whether ``leaf`` holds typed PRNG keys (one of jax's extended dtypes, not a numpy one)."""
    return not isinstance(leaf.dtype, np.dtype) and bool(jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key))


_ONE_DEVICE = jax.sharding.SingleDeviceSharding

#: The kinds of leaf whose entries get each member of :func:`array_details`.
DETAILED_KINDS = {"weak": ("array", "sharded"), "sharding": ("array", "key"), "keys_sharding": ("key",)}

#: Whether each class of leaf seen is one of ``jax.Array``\\ s: asked once per class (``isinstance`` costs more).
_JAX_ARRAY_TYPES: dict[type, bool] = {}


def _is_jax_array_type(kind: type) -> bool:
    known = _JAX_ARRAY_TYPES.get(kind)
    if known is None:
        known = _JAX_ARRAY_TYPES[kind] = issubclass(kind, jax.Array)
    return known
