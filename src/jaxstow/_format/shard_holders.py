"""Which processes hold each distinct shard of a sharded array: its boxes, their holders and the layout's print.

>>> import jax
>>> from jaxstow._format.shard_holders import holders
>>> mesh = jax.make_mesh((1,), ("x",))
>>> holders(jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x")), (4,))
{((0, 4),): [0]}
"""

from __future__ import annotations

import functools
import hashlib

import jax

from jaxstow._format.replicas import Box, Holders

__all__ = ["as_box", "holders", "holders_digest", "shared_by"]


def as_box(index: tuple[slice, ...], shape: tuple[int, ...]) -> Box:
    """A shard's ``index`` (slices, as ``devices_indices_map`` gives it) as its box in an array of ``shape``."""
    return tuple(tuple(axis.indices(size)[:2]) for axis, size in zip(index, shape, strict=True))  # type: ignore[misc]


@functools.lru_cache(maxsize=256)
def holders(sharding: jax.sharding.Sharding, shape: tuple[int, ...]) -> dict[Box, list[int]]:
    """The processes holding each distinct shard of an array of ``shape`` laid out by ``sharding``, in order."""
    found: dict[Box, set[int]] = {}
    for device, index in sharding.devices_indices_map(shape).items():
        found.setdefault(as_box(index, shape), set()).add(int(device.process_index))  # type: ignore[attr-defined]
    return {box: sorted(processes) for box, processes in found.items()}


@functools.lru_cache(maxsize=256)
def shared_by(sharding: jax.sharding.Sharding, shape: tuple[int, ...]) -> tuple[Holders, ...]:
    """Each set of several processes that holds some distinct shards of an array laid out so, in order."""
    return tuple(sorted({tuple(processes) for processes in holders(sharding, shape).values() if len(processes) > 1}))


@functools.lru_cache(maxsize=256)
def holders_digest(sharding: jax.sharding.Sharding, shape: tuple[int, ...]) -> str:
    """:func:`holders`, hashed (once per layout: every save of a run has the same)."""
    return hashlib.sha256(repr(sorted(holders(sharding, shape).items())).encode()).hexdigest()[:16]
