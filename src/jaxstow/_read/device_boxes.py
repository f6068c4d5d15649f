"""Sharded leaves laid out across several devices: each device's box read on its own, by byte ranges.

A process reads only the boxes of its own devices, from the shards that overlap them, and reads a box that several of
its devices hold once. Boxes that lie close together are read as one (their bounding box, whole shards, verified) and
cut apart; during a restore that reads shared boxes once (:mod:`jaxstow._read.broadcast`), each process reads its
share and the rest is gathered later.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from jaxstow._format.shards import Box, ShardedLeaf
from jaxstow._read import broadcast
from jaxstow._read.opened import OpenedFile
from jaxstow._read.targets import cast_values
from jaxstow.errors import ShardingError

__all__ = ["bound_for_devices", "read_onto_devices"]

_TOGETHER = 1.05  # the boxes of a process's devices are read as one when their bounding box is at most this much more


def bound_for_devices(opened: OpenedFile, paths: Sequence[str], placements: dict[int, Any]) -> set[int]:
    """The sharded leaves bound for several devices: each device's part is read on its own, by byte ranges."""
    return {
        i
        for i, placement in placements.items()
        if isinstance(opened.stored.get(paths[i]), ShardedLeaf)
        and isinstance(placement, jax.sharding.Sharding)
        and (len(placement.device_set) > 1 or not placement.is_fully_addressable)
    }


def read_onto_devices(
    opened: OpenedFile, path: str, placement: jax.sharding.Sharding, dtype: np.dtype | None
) -> jax.Array | broadcast.Pending:
    """A sharded leaf laid out on ``placement``; during a restore that reads shared boxes once, the leaf pending
    until they are gathered (:mod:`jaxstow._read.broadcast`).

    The boxes of this process's devices read from the shards that overlap them, together when their bounding box holds
    little else (then whole shards are read, and verified); 64-bit integers that jax with x64 off would wrap are
    refused when the array is built.
    """
    leaf = opened.stored[path]
    exchange = broadcast.active(opened.file)
    parts: dict[Box, np.ndarray] = {}
    tag = "/".join(opened.file.replace("\\", "/").split("/")[-2:]) + f":{path}"  # the step's folder and file
    if exchange is not None:  # boxes other processes hold too: each reads a range now, the rest is gathered later
        read = lambda box: _cast(opened.read_box(path, box), dtype, opened, path)  # noqa: E731
        parts = exchange.share(tag, placement, leaf.shape, np.dtype(dtype or leaf.dtype), read)
    boxes = {_box(index, leaf.shape) for index in placement.addressable_devices_indices_map(leaf.shape).values()}
    boxes -= parts.keys()
    bound: Box = tuple(
        (min(box[axis][0] for box in boxes), max(box[axis][1] for box in boxes))
        for axis in range(len(leaf.shape) if boxes else 0)
    )
    together = bool(boxes) and _volume(bound) <= _TOGETHER * sum(_volume(box) for box in boxes)
    whole = _cast(opened.read_box(path, bound), dtype, opened, path) if together else None
    for box in sorted(boxes):  # replicas of a box are read once
        if whole is not None:
            parts[box] = whole[
                tuple(slice(a - start, b - start) for (a, b), (start, _) in zip(box, bound, strict=True))
            ]
        else:
            parts[box] = _cast(opened.read_box(path, box), dtype, opened, path)

    def build() -> jax.Array:
        opened.check_bound_for_jax([(path, part) for part in parts.values()])
        if not placement.addressable_devices:  # another process's devices only: this process holds none of it
            return _held_elsewhere(leaf.shape, placement, np.dtype(dtype or leaf.dtype), opened.file, path)
        return jax.make_array_from_callback(leaf.shape, placement, lambda index: parts[_box(index, leaf.shape)])

    return build() if exchange is None else broadcast.Pending(tag, build, shape=leaf.shape, sharding=placement)


def _held_elsewhere(
    shape: tuple[int, ...], placement: jax.sharding.Sharding, dtype: np.dtype, file: str, path: str
) -> jax.Array:
    """The array laid out on devices of other processes only, of which this process holds no shard."""
    if "dtype" not in inspect.signature(jax.make_array_from_callback).parameters:  # jax before 0.5
        raise ShardingError(
            "the sharding lays the leaf out on other processes' devices only; this jax cannot make an array of "
            "which a process holds no shard: give every process a sharding over devices of its own",
            file=file,
            path=path,
        )
    nothing = np.broadcast_to(np.zeros((), dtype), shape)  # what jax asks of a replicated array: no memory
    held: jax.Array = jax.make_array_from_callback(shape, placement, lambda index: nothing, dtype=dtype)
    return held


def _box(index: tuple[slice, ...] | None, shape: tuple[int, ...]) -> Box:
    slices = index or tuple(slice(None) for _ in shape)
    return tuple(
        (start, stop) for start, stop, _ in (axis.indices(size) for axis, size in zip(slices, shape, strict=True))
    )


def _volume(box: Box) -> int:
    return math.prod(stop - start for start, stop in box)


def _cast(array: np.ndarray, dtype: np.dtype | None, opened: OpenedFile, path: str) -> np.ndarray:
    """A box as ``dtype`` (``None``: as stored); a cast that would not keep its values is refused, naming the leaf."""
    if dtype is None or array.dtype == dtype:
        return array
    cast: np.ndarray = cast_values(array, dtype, file=opened.file, path=path)
    return cast
