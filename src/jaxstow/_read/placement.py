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

from jaxstow._format.keypaths import key_to_str, path_to_str
from jaxstow._format.memory_kinds import memory_kind_here
from jaxstow._format.shards import ShardedLeaf, Stored
from jaxstow._util.jax_compat import tree_broadcast
from jaxstow.errors import ShardingError, excerpt

__all__ = [
    "ShardingSpec",
    "check_fits",
    "is_placement",
    "place_whole",
    "resolve_shardings",
    "saved_sharding",
    "saved_shardings",
]

#: What ``sharding=`` accepts: a sharding or device, a pytree prefix of them (``None`` for the default placement),
#: a function ``(path, shape, dtype) -> sharding``, or ``"saved"`` for the sharding each array was saved with.
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
    if isinstance(spec, jax.sharding.Mesh):  # callable (a context manager): not the function it would be taken for
        raise ShardingError(
            "sharding= got a Mesh, which names devices but not how an array is split over them: pass "
            "NamedSharding(mesh, PartitionSpec(...)), or a tree or a function (path, shape, dtype) of them",
            file=file,
        )
    if callable(spec):
        return {i: _call(spec, path, shape, dtype, file) for i, (path, shape, dtype) in arrays.items()}
    positions_tree = index_tree()
    # Paired up to the restored tree's leaves: a None in it (saved so, or left by select=) is a node without leaves,
    # matched by a None of the broadcast spec; a None leaf of the spec where the tree has a leaf is paired with it.
    pairs: list[tuple[Any, Any]] = []
    try:
        broadcast = tree_broadcast(spec, positions_tree, is_leaf=_is_spec_leaf)
        jax.tree.map(lambda position, placement: pairs.append((position, placement)), positions_tree, broadcast)
    except (ValueError, TypeError) as error:
        found = _mismatch(spec, positions_tree, ())
        if found is None:
            raise ShardingError(f"sharding= is not a prefix of the restored tree: {error}", file=file) from None
        where, problem = found
        raise ShardingError(
            f"sharding= is not a prefix of the restored tree here: {problem}; give a sharding, a device or None for the "
            "whole subtree, or a subtree of the restored tree's structure",
            file=file,
            path=where,
        ) from None
    out: dict[int, Any] = {}
    for position, placement in pairs:
        if position in arrays and placement is not None:
            if not is_placement(placement):
                raise ShardingError(
                    f"sharding= holds {placement!r} here, not a jax sharding, a device or None",
                    file=file,
                    path=arrays[position][0],
                )
            out[position] = placement
    return out


def _is_spec_leaf(obj: Any) -> bool:
    return obj is None or is_placement(obj)


def _mismatch(spec: Any, full: Any, where: tuple[Any, ...]) -> tuple[str, str] | None:
    """The first place where the tree ``spec`` is not a prefix of ``full``: its path and what differs there."""
    if _is_spec_leaf(spec) or full is None:  # jax.tree.broadcast drops whatever a prefix holds at a None
        return None
    spec_children = _children(spec)
    full_children = _children(full)
    if full_children is None or spec_children is None or type(spec) is not type(full):
        theirs = "a leaf" if full_children is None else f"a {type(full).__name__}"
        ours = "a leaf" if spec_children is None else f"a {type(spec).__name__}"
        return path_to_str(where), f"it holds {ours} ({excerpt(spec, 60)}) where the restored tree has {theirs}"
    spec_keys = [key for key, _ in spec_children]
    full_keys = [key for key, _ in full_children]
    if [key_to_str(key) for key in spec_keys] != [key_to_str(key) for key in full_keys]:
        return path_to_str(where), (
            f"it holds a {type(spec).__name__} of keys {excerpt([key_to_str(key) for key in spec_keys])} where the "
            f"restored tree's {type(full).__name__} has keys {excerpt([key_to_str(key) for key in full_keys])}"
        )
    for (key, spec_child), (_, full_child) in zip(spec_children, full_children, strict=True):
        found = _mismatch(spec_child, full_child, (*where, key))
        if found is not None:
            return found
    return None


def _children(node: Any) -> list[tuple[Any, Any]] | None:
    """The (key, child) pairs of a pytree node, or ``None`` for a leaf."""
    flat, _ = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda child: child is not node)
    if len(flat) == 1 and not flat[0][0]:  # the node itself, at the empty path
        return None
    return [(path[0], child) for path, child in flat]


def _call(function: Callable[..., Any], path: str, shape: tuple[int, ...], dtype: np.dtype, file: str | None) -> Any:
    try:
        placement = function(path, shape, dtype)
    except Exception as error:
        raise ShardingError(f"the sharding function {function!r} failed: {error}", file=file, path=path) from error
    if placement is not None and not is_placement(placement):
        raise ShardingError(
            f"the sharding function returned {placement!r}, not a jax sharding, a device or None", file=file, path=path
        )
    return placement


def saved_shardings(
    stored: Mapping[str, Stored], arrays: Mapping[int, tuple[str, tuple[int, ...], np.dtype]], *, file: str | None
) -> dict[int, jax.sharding.Sharding]:
    """The placement of each array for ``sharding="saved"``: the sharding its leaf of ``stored`` was saved with, where
    the file records one (sharded arrays, and arrays stored whole that lay on a device other than the first).

    ``arrays`` maps positions to ``(path, shape, dtype)``; the others land on the default device, or, stored whole,
    on the first device, where they lay, where ``jax.default_device`` names another (:func:`_first_if_not_default`).
    """
    placements: dict[int, jax.sharding.Sharding] = {}
    first = _first_if_not_default()
    for i, (path, _, _) in arrays.items():
        leaf = stored.get(path)
        description = None if leaf is None else leaf.sharding
        if description is not None:
            placement = saved_sharding(description, file=file, path=path)
        else:
            placement = None if isinstance(leaf, ShardedLeaf) else first
        if placement is not None:
            placements[i] = placement
    return placements


def _first_if_not_default() -> jax.sharding.Sharding | None:
    """This process's first device, where an array stored whole that records no device lay, where the default device
    (``jax.default_device``) is another of its devices; ``None`` where arrays land there by default."""
    default, own = getattr(jax.config, "jax_default_device", None), jax.local_devices()  # undeclared in Config
    return jax.sharding.SingleDeviceSharding(own[0]) if default in own[1:] else None


def saved_sharding(description: dict[str, Any], *, file: str | None, path: str) -> jax.sharding.Sharding | None:
    """The sharding a leaf was saved with (its mesh's axis types included), on the devices it was saved on, in their
    order in its mesh (a file written before the devices were recorded: this process's first devices; devices not
    all there: the first devices, in the saved mesh's relative order); for one device (``{"device": id}``), on that
    one of this process's devices, or ``None`` (the default device) where it has none of that id; in the memory it
    lay in (``memory_kind``) where those devices can address it.

    An error if there are too few devices.
    """
    kind = description.get("memory_kind")
    if "device" in description:
        device = next((device for device in jax.local_devices() if device.id == description["device"]), None)
        if device is None and kind is None:
            return None
        device = jax.local_devices()[0] if device is None else device
        kind = memory_kind_here(kind, [device], file=file, path=path)
        return jax.sharding.SingleDeviceSharding(device, memory_kind=kind)
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
    kinds = description.get("axis_types", ["Auto"] * len(axes))
    grid = np.array(_saved_devices(description.get("devices"), devices)[:count])
    grid = grid.reshape(mesh_shape)
    if not hasattr(jax.sharding, "AxisType"):  # jax before 0.5: every mesh axis is what later ones call Auto
        if set(kinds) != {"Auto"} and kinds:
            raise ShardingError(
                f"the leaf was saved on a mesh whose axes are {kinds}, which jax {jax.__version__} cannot make (it "
                "has Auto axes alone); pass sharding= to lay it out on a mesh of this jax",
                file=file,
                path=path,
            )
        mesh = jax.sharding.Mesh(grid, tuple(axes))
    else:
        types = tuple(getattr(jax.sharding.AxisType, kind) for kind in kinds)
        mesh = jax.sharding.Mesh(grid, tuple(axes), axis_types=types)
    parts = [tuple(part) if isinstance(part, list) else part for part in spec]
    kind = memory_kind_here(kind, list(grid.flat), file=file, path=path)
    return jax.sharding.NamedSharding(mesh, _partition_spec(*parts), memory_kind=kind)


def _saved_devices(ids: list[int] | None, devices: list[jax.Device]) -> list[Any]:
    """The devices of ``ids`` (a mesh's, in its order) among ``devices``; all of ``devices`` for ``None``.

    Where one of them is not there (a restart on other hosts, other processes: other ids), the first ``len(ids)``
    devices in the same relative order: the saved mesh's device of the lowest id on the first of them, and so on.
    """
    if ids is None:
        return devices
    by_id = {device.id: device for device in devices}
    if all(device in by_id for device in ids):
        return [by_id[device] for device in ids]
    rank = {device: position for position, device in enumerate(sorted(ids))}
    return [devices[rank[device]] for device in ids]


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
    spec = getattr(placement, "spec", ())
    if isinstance(spec, jax.sharding.PartitionSpec) and not _concrete(spec):  # device_put fails on it, not in words
        raise ShardingError(
            f"its sharding {placement} leaves its layout to a computation (an unconstrained axis, or values not yet "
            "reduced), and an array read from a file needs one: give the partition spec the array is to have",
            file=file,
            path=path,
        )
    if isinstance(spec, jax.sharding.PartitionSpec) and len(spec) > len(shape):  # jax checks no spec on one device
        raise ShardingError(
            f"shape {list(shape)} cannot be laid out on {placement}: its partition spec names {len(spec)} axes, "
            f"and the array has {len(shape)}",
            file=file,
            path=path,
        )
    try:
        placement.shard_shape(shape)
    except Exception as error:  # jax raises several types here (IndivisibleError, IndexError, ValueError)
        raise ShardingError(
            f"shape {list(shape)} cannot be laid out on {placement}: {error}", file=file, path=path
        ) from None


def _concrete(spec: jax.sharding.PartitionSpec) -> bool:
    """Whether ``spec`` says where every part of an array lies: no axis left unconstrained, nothing unreduced."""
    unconstrained = getattr(jax.sharding.PartitionSpec, "UNCONSTRAINED", None)
    reduced = getattr(spec, "unreduced", None) or getattr(spec, "reduced", None)
    return not reduced and all(axis is not unconstrained for axis in spec)


def place_whole(array: jax.Array, placement: Any) -> jax.Array:
    """``array``, which this process holds whole (a typed PRNG key), on ``placement``; also on a sharding over the
    devices of several processes, where jax's ``device_put`` refuses an extended dtype: each of this process's devices
    gets its part, and the processes' parts make one array (each process holds the same whole)."""
    if not isinstance(placement, jax.sharding.Sharding) or placement.is_fully_addressable:
        placed: jax.Array = jax.device_put(array, placement)
        return placed
    parts = placement.addressable_devices_indices_map(array.shape)
    pieces = [jax.device_put(array[index], device) for device, index in parts.items()]
    return jax.make_array_from_single_device_arrays(array.shape, placement, pieces)
