"""Shardings as JSON, written and checked: a named sharding's mesh shape, axis names and axis types, its partition
spec, and its devices (their ids, in the mesh's order) where they are not the first devices in their default order;
where an array stored whole lay, where that is not this process's first device; and the memory either lay in, where
that is not its devices' default memory (:mod:`~jaxstow._format.memory_kinds`).

>>> import jax, numpy as np
>>> from jaxstow._format.sharding_description import describe_sharding, whole_placement
>>> mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
>>> description = describe_sharding(jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data")))
>>> description["mesh"], description["axes"], description["spec"], "devices" in description
([1], ['data'], ['data'], False)
>>> whole_placement(jax.sharding.SingleDeviceSharding(jax.local_devices()[0])) is None
True
"""

from __future__ import annotations

import copy
import functools
import math
from typing import Any

import jax

from jaxstow._format.dtypes import is_shape
from jaxstow._format.memory_kinds import is_memory_kind, recorded_memory_kind
from jaxstow.errors import FormatError, excerpt

__all__ = ["AXIS_TYPES", "check_sharding_description", "check_whole_placement", "describe_sharding", "whole_placement"]

#: The mesh axis types a sharding description may name (``jax.sharding.AxisType``); files without them mean ``Auto``.
AXIS_TYPES = ("Auto", "Explicit", "Manual")


def describe_sharding(sharding: jax.sharding.Sharding) -> dict[str, Any] | None:
    """A named sharding as JSON (mesh shape, axis names and types, partition spec, its devices' ids in the mesh's
    order unless they are ``jax.devices()[:n]``, where a reader of a file without them lays the mesh out, and its
    memory kind unless it is their default memory).

    ``None`` for shardings without a mesh.
    """
    if not isinstance(sharding, jax.sharding.NamedSharding):
        return None
    spec = [list(axis) if isinstance(axis, tuple) else axis for axis in sharding.spec]
    mesh = sharding.mesh
    description: dict[str, Any] = {
        "mesh": list(mesh.devices.shape),
        "axes": list(mesh.axis_names),
        "axis_types": _axis_types(mesh),
        "spec": spec,
    }
    devices = list(mesh.devices.flat)
    if devices != jax.devices()[: len(devices)]:
        description["devices"] = [int(device.id) for device in devices]
    if (kind := recorded_memory_kind(sharding)) is not None:
        description["memory_kind"] = kind
    return description


def whole_placement(sharding: jax.sharding.Sharding) -> dict[str, Any] | None:
    """Where an array stored whole lay, as its entry's ``sharding`` records it: on one of this process's devices but
    its first (``jax.local_devices()[0]``, where arrays land by default), or in a memory other than the device's
    default, that device's id, ``{"device": id}`` (with ``"memory_kind"``), or, on a mesh of that one device, the
    mesh's description (:func:`describe_sharding`, its ``devices`` naming it).

    ``None`` in the first device's default memory (files of such arrays stay as they were), on several devices, or on
    another backend's.
    """
    if type(sharding) is not jax.sharding.SingleDeviceSharding and not isinstance(sharding, jax.sharding.NamedSharding):
        return None
    recorded = _recorded(sharding)
    return None if recorded is None else copy.deepcopy(recorded)  # the caller's own: a manifest may be changed


@functools.lru_cache(maxsize=256)
def _recorded(sharding: jax.sharding.Sharding) -> dict[str, Any] | None:
    """:func:`whole_placement`, once per sharding (every save of a run has the same)."""
    if len(sharding.device_set) != 1:
        return None
    own = jax.local_devices()
    (device,) = sharding.device_set
    kind = recorded_memory_kind(sharding)
    if device not in own[1:] and (kind is None or device not in own):
        return None
    if isinstance(sharding, jax.sharding.NamedSharding):
        return describe_sharding(sharding)
    return {"device": int(own[own.index(device)].id), **({} if kind is None else {"memory_kind": kind})}


def check_sharding_description(sharding: Any, ndim: int, *, file: str, path: str) -> None:
    """Raise :class:`FormatError` unless ``sharding`` describes a mesh of at least one device and a spec of at most
    ``ndim`` axes, and its devices, where it names them, are its mesh's: as many ids as it has devices, each once."""
    if not _is_sharding_description(sharding, ndim):
        raise FormatError(f"malformed sharding {excerpt(sharding)}", file=file, path=path)
    count = math.prod(sharding["mesh"])
    if "devices" in sharding and not _are_device_ids(sharding["devices"], count):
        raise FormatError(
            f"its sharding names the devices {excerpt(sharding['devices'])} where its mesh {sharding['mesh']} needs "
            f"the ids of its {count} devices, in its order (distinct non-negative integers): the header is damaged",
            file=file,
            path=path,
        )


def check_whole_placement(sharding: Any, ndim: int, *, file: str, path: str) -> None:
    """Raise :class:`FormatError` unless ``sharding``, the ``sharding`` of an array stored whole, is one device's id,
    ``{"device": id}`` (with its ``"memory_kind"``), or a mesh of one device described as a sharded array's
    (:func:`check_sharding_description`)."""
    if isinstance(sharding, dict) and "device" in sharding:
        valid_kind = is_memory_kind(sharding.get("memory_kind", "device"))
        if (
            not sharding.keys() <= {"device", "memory_kind"}
            or not valid_kind
            or not _are_device_ids([sharding["device"]], 1)
        ):
            raise FormatError(
                f"its sharding {excerpt(sharding)} is not the device an array stored whole lay on, "
                '{"device": id} (a non-negative integer, and the name of a memory): the header is damaged',
                file=file,
                path=path,
            )
        return
    check_sharding_description(sharding, ndim, file=file, path=path)
    if math.prod(sharding["mesh"]) != 1:
        raise FormatError(
            f"an array stored whole names a sharding over a mesh {sharding['mesh']} of "
            f"{math.prod(sharding['mesh'])} devices, not of one: the header is damaged",
            file=file,
            path=path,
        )


def _is_sharding_description(sharding: Any, ndim: int) -> bool:
    if not isinstance(sharding, dict):
        return False
    mesh, axes, spec = sharding.get("mesh"), sharding.get("axes"), sharding.get("spec")
    types = sharding.get("axis_types", ["Auto"] * len(axes) if isinstance(axes, list) else None)
    return (
        is_shape(mesh)
        and is_memory_kind(sharding.get("memory_kind", "device"))
        and 0 not in mesh  # jax aborts the process on a mesh of no devices
        and isinstance(axes, list)
        and all(isinstance(axis, str) for axis in axes)
        and len(axes) == len(mesh)
        and isinstance(types, list)
        and len(types) == len(axes)
        and all(kind in AXIS_TYPES for kind in types)
        and isinstance(spec, list)
        and len(spec) <= ndim
        and all(
            part is None
            or part in axes
            or (isinstance(part, list) and all(isinstance(item, str) and item in axes for item in part))
            for part in spec
        )
    )


def _are_device_ids(ids: Any, count: int) -> bool:
    """Whether ``ids`` is a list of ``count`` distinct device ids (its length checked before its items)."""
    if not (isinstance(ids, list) and len(ids) == count):
        return False
    return all(type(device) is int and device >= 0 for device in ids) and len(set(ids)) == count


#: Axis types as jax before 0.5 named them, by the names of later versions (which the format uses).
_OLD_AXIS_TYPES = {"User": "Explicit", "Collective": "Manual"}


def _axis_types(mesh: Any) -> list[str]:
    """The type of each of ``mesh``'s axes; jax before 0.5 gives them as a dict of each type's axes."""
    given: Any = mesh.axis_types
    if isinstance(given, dict):
        by_axis = {
            axis: kind.name for kind, axes in given.items() for axis in (axes if isinstance(axes, tuple) else (axes,))
        }
        return [_OLD_AXIS_TYPES.get(by_axis.get(axis, "Auto"), by_axis.get(axis, "Auto")) for axis in mesh.axis_names]
    return [kind.name for kind in given]
