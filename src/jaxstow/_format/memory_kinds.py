"""The memory an array lay in (``pinned_host``, ``unpinned_host``: host memory offloaded to), as a sharding's
description records it, and the memory a restore puts it in again.

An array in its devices' default memory records nothing; one in another memory records that memory's name, which
``sharding="saved"`` gives its restored sharding again where this process's devices can address that memory. Where
they cannot (another platform, an older jax), the array lands in their default memory, with a warning naming it.

>>> import jax, jax.numpy as jnp
>>> from jaxstow._format.memory_kinds import recorded_memory_kind, memory_kind_here
>>> print(recorded_memory_kind(jnp.ones(2).sharding))  # the default memory: nothing recorded
None
>>> memory_kind_here("no_such_memory", jax.devices()[:1], file="a.jxs", path="w") is None
True
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

import jax

__all__ = ["default_memory_kind", "is_memory_kind", "memory_kind_here", "recorded_memory_kind"]

logger = logging.getLogger("jaxstow.restore")

#: What a recorded memory kind may be: a short lowercase name, as jax's are.
_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")


def recorded_memory_kind(sharding: jax.sharding.Sharding) -> str | None:
    """The memory of ``sharding``'s devices its arrays lie in, where that is not their default memory; else ``None``."""
    kind = getattr(sharding, "memory_kind", None)
    if kind is None:
        return None
    device = next(iter(sharding.device_set))
    return None if kind == default_memory_kind(device) else str(kind)


def is_memory_kind(value: Any) -> bool:
    """Whether ``value`` is a memory kind as a description records it."""
    return isinstance(value, str) and _NAME.fullmatch(value) is not None


def memory_kind_here(kind: str | None, devices: Sequence[Any], *, file: str | None, path: str) -> str | None:
    """``kind``, where every one of ``devices`` can address that memory; else ``None`` (their default memory), with a
    warning naming leaf ``path`` of ``file`` and the memories they have."""
    if kind is None:
        return None
    have = [_kinds(device) for device in devices]
    if all(kind in kinds for kinds in have):
        return kind
    logger.warning(
        "%s: leaf %r was saved in %r memory, which %s cannot address (it has %s): restored in its default memory",
        file,
        path,
        kind,
        devices[0] if len(devices) == 1 else f"one of its {len(devices)} devices",
        ", ".join(sorted(set().union(*have))) or "none named",
    )
    return None


def default_memory_kind(device: Any) -> str | None:
    """The name of ``device``'s default memory (``None`` where this jax or its backend names none)."""
    try:
        return str(device.default_memory().kind)
    except (AttributeError, RuntimeError, ValueError):  # a jax or a backend that names no memories
        return None


def _kinds(device: Any) -> set[str]:
    try:
        return {str(memory.kind) for memory in device.addressable_memories()}
    except (AttributeError, RuntimeError, ValueError):
        return set()
