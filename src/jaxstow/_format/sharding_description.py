"""A named sharding as JSON: its mesh's shape, axis names and axis types, its partition spec, and its devices (their
ids, in the mesh's order) where they are not the first devices in their default order.

>>> import jax, numpy as np
>>> from jaxstow._format.sharding_description import describe_sharding
>>> mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
>>> description = describe_sharding(jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data")))
>>> description["mesh"], description["axes"], description["spec"], "devices" in description
([1], ['data'], ['data'], False)
"""

from __future__ import annotations

from typing import Any

import jax

__all__ = ["describe_sharding"]


def describe_sharding(sharding: jax.sharding.Sharding) -> dict[str, Any] | None:
    """A named sharding as JSON (mesh shape, axis names and types, partition spec, and its devices' ids in the mesh's
    order unless they are ``jax.devices()[:n]``, where a reader of a file without them lays the mesh out).

    ``None`` for shardings without a mesh.
    """
    if not isinstance(sharding, jax.sharding.NamedSharding):
        return None
    spec = [list(axis) if isinstance(axis, tuple) else axis for axis in sharding.spec]
    mesh = sharding.mesh
    description = {
        "mesh": list(mesh.devices.shape),
        "axes": list(mesh.axis_names),
        "axis_types": _axis_types(mesh),
        "spec": spec,
    }
    devices = list(mesh.devices.flat)
    if devices != jax.devices()[: len(devices)]:
        description["devices"] = [int(device.id) for device in devices]
    return description


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
