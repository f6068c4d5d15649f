"""What a process cannot save of an array that other processes of a ``jax.distributed`` run hold: the whole of an
array on another process's one device, or of typed PRNG keys laid out over several processes' devices (keys are
stored whole). With one process, nothing.

>>> import jax
>>> from jaxstow._format.held_elsewhere import held_elsewhere, on_own_device
>>> keys = jax.random.split(jax.random.key(0), 4)
>>> on_own_device(keys), held_elsewhere(keys)
(True, None)
"""

from __future__ import annotations

import jax
import numpy as np

__all__ = ["held_elsewhere", "on_own_device"]


def on_own_device(leaf: jax.Array) -> bool:
    """Whether an array on one device is on one of this process's devices: always, with one process; under
    ``jax.distributed``, ``jax.device_put(x, jax.devices()[k])`` puts it on another process's device ``k``."""
    return jax.process_count() == 1 or leaf.is_fully_addressable


def held_elsewhere(leaf: jax.Array) -> str | None:
    """Why this process cannot save ``leaf``, which other processes hold, and the fix; ``None`` if it can."""
    if not isinstance(leaf.dtype, np.dtype) and not (leaf.is_fully_addressable or leaf.is_fully_replicated):
        return (
            f"the PRNG keys are laid out over the devices of several processes ({leaf.sharding}), and keys are saved "
            "whole, which no process holds: save their data, jax.random.key_data(keys) (saved shard by shard), and "
            "make them keys again with jax.random.wrap_key_data after the restore"
        )
    if isinstance(leaf.sharding, jax.sharding.SingleDeviceSharding) and not on_own_device(leaf):
        (device,) = leaf.sharding.device_set
        return (
            f"the array is on {device}, a device of process {device.process_index}, not of this one "  # type: ignore[attr-defined]
            f"({jax.process_index()}): each process saves the values it holds; lay it out over the global mesh, "
            "jax.device_put(x, NamedSharding(mesh, PartitionSpec())), or keep it on one of this process's devices"
        )
    return None
