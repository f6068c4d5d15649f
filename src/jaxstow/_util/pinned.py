"""Page-locked host memory on an accelerator: where transfers between a device and the host go at the link's speed.

A copy between an accelerator and ordinary (pageable) host memory is staged by the driver through a bounce buffer, a
few GB/s; one to or from the device's ``pinned_host`` memory is a direct transfer, tens of GB/s on a GPU. CPU devices
are left out: their memory is the host's already.

>>> import jax
>>> from jaxstow._util.pinned import pinned_sharding
>>> pinned_sharding(jax.devices("cpu")[0]) is None  # a CPU device's arrays are host memory already
True
"""

from __future__ import annotations

import jax

__all__ = ["PINNED_PLATFORMS", "pinned_sharding"]

#: Platforms whose devices' transfers go through page-locked ``pinned_host`` memory where the device offers it.
PINNED_PLATFORMS = frozenset({"gpu", "cuda", "rocm", "tpu"})


def pinned_sharding(device: jax.Device) -> jax.sharding.SingleDeviceSharding | None:
    """The sharding that puts an array in ``device``'s ``pinned_host`` memory, or ``None`` where that is no help."""
    if device.platform not in PINNED_PLATFORMS:
        return None
    if "pinned_host" not in {memory.kind for memory in device.addressable_memories()}:
        return None
    return jax.sharding.SingleDeviceSharding(device, memory_kind="pinned_host")
