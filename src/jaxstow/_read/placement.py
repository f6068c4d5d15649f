"""Where restored arrays land: one sharding or device for all, a pytree of them, or a function of each leaf.

>>> import jax, numpy as np
>>> from jaxstow._read.placement import resolve_shardings
>>> cpu = jax.devices("cpu")[0]
>>> arrays = {0: ("b", (2,), np.dtype("f4")), 1: ("w", (3,), np.dtype("f4"))}
>>> resolve_shardings({"w": cpu, "b": None}, lambda: {"b": 0, "w": 1}, arrays)
{1: CpuDevice(id=0)}
>>> resolve_shardings(lambda path, shape, dtype: cpu if shape[0] > 2 else None, lambda: {"b": 0, "w": 1}, arrays)
{0: None, 1: CpuDevice(id=0)}
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from jaxstow.errors import ShardingError

__all__ = ["ShardingSpec", "check_fits", "is_placement", "resolve_shardings", "saved_sharding"]

#: What ``sharding=`` accepts: a sharding or device, a pytree prefix of them (``None`` for the default placement),
#: a function ``(path, shape, dtype) -> sharding``, or ``"saved"`` for the sharding each sharded leaf was saved with.
ShardingSpec = Any

_partition_spec: Callable[..., Any] = jax.sharding.PartitionSpec


def is_placement(obj: Any) -> bool:
    """Whether ``obj`` says where one array goes: a jax sharding or a device."""
    return isinstance(obj, jax.sharding.Sharding | jax.Device)


def resolve_shardings(
    spec: ShardingSpec,
    index_tree: Callable[[], Any],
    arrays: Mapping[int, tuple[str, tuple[int, ...], np.dtype]],
    *,
    file: str | None = None,
) -> dict[int, Any]:
    """The placement of each array from ``sharding=``.

    ``arrays`` maps positions to ``(path, shape, dtype)``, and ``index_tree()`` gives the restored tree with every leaf
    replaced by its position (leaves that are not positions, such as leaves left unread, get nothing); it is called only
    when ``spec`` is a tree.
    """
    if spec is None:
        return {}
    if is_placement(spec):
        return dict.fromkeys(arrays, spec)
    if callable(spec):
        return {i: _call(spec, path, shape, dtype, file) for i, (path, shape, dtype) in arrays.items()}
    positions_tree = index_tree()
    try:
        broadcast = jax.tree.broadcast(spec, positions_tree, is_leaf=lambda x: x is None or is_placement(x))
    except (ValueError, TypeError) as error:
        raise ShardingError(f"sharding= is not a prefix of the restored tree: {error}", file=file) from None
    positions = jax.tree.leaves(positions_tree)
    placements = jax.tree.leaves(broadcast, is_leaf=lambda x: x is None or is_placement(x))
    out: dict[int, Any] = {}
    for position, placement in zip(positions, placements, strict=True):
        if position in arrays and placement is not None:
            if not is_placement(placement):
                raise ShardingError(
                    f"sharding= holds {placement!r} here, not a jax sharding, a device or None",
                    file=file,
                    path=arrays[position][0],
                )
            out[position] = placement
    return out


def _call(function: Callable[..., Any], path: str, shape: tuple[int, ...], dtype: np.dtype, file: str | None) -> Any:
    placement = function(path, shape, dtype)
    if placement is not None and not is_placement(placement):
        raise ShardingError(
            f"the sharding function returned {placement!r}, not a jax sharding, a device or None", file=file, path=path
        )
    return placement


def saved_sharding(description: dict[str, Any], *, file: str | None, path: str) -> jax.sharding.NamedSharding:
    """The sharding a leaf was saved with (its mesh's axis types included), on this process's first devices.

    An error if there are too few.
    """
    mesh_shape, axes, spec = description["mesh"], description["axes"], description["spec"]
    count = math.prod(mesh_shape)
    devices = jax.devices()
    if count > len(devices):
        raise ShardingError(
            f"the leaf was saved on a mesh {dict(zip(axes, mesh_shape, strict=True))} of {count} devices, but this "
            f"process sees {len(devices)}; pass sharding= to lay it out on the devices there are",
            file=file,
            path=path,
        )
    types = tuple(getattr(jax.sharding.AxisType, kind) for kind in description.get("axis_types", ["Auto"] * len(axes)))
    mesh = jax.sharding.Mesh(np.array(devices[:count]).reshape(mesh_shape), tuple(axes), axis_types=types)
    parts = [tuple(part) if isinstance(part, list) else part for part in spec]
    return jax.sharding.NamedSharding(mesh, _partition_spec(*parts))


#: The mesh of a sharding that names no devices (``jax.sharding.AbstractMesh``, where this jax has it).
_ABSTRACT_MESH: Any = getattr(jax.sharding, "AbstractMesh", ())


def check_fits(placement: Any, shape: tuple[int, ...], *, file: str | None, path: str) -> None:
    """Raise :class:`ShardingError` naming the leaf if an array of ``shape`` cannot be laid out on ``placement``."""
    if placement is None or isinstance(placement, jax.Device):
        return
    if isinstance(getattr(placement, "mesh", None), _ABSTRACT_MESH):
        raise ShardingError(
            f"its sharding {placement} has an abstract mesh, which names no devices (jax.eval_shape gives such "
            "shardings): pass sharding=... or a like whose shardings are on devices",
            file=file,
            path=path,
        )
    try:
        placement.shard_shape(shape)
    except Exception as error:  # jax raises several types here (IndivisibleError, IndexError, ValueError)
        raise ShardingError(
            f"shape {list(shape)} cannot be laid out on {placement}: {error}", file=file, path=path
        ) from None
