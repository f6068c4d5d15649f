"""How much of the host's memory this process may use, and how much a save or a restore may hold at once by default: a
quarter of it.

The memory it may use is the machine's physical memory, or less where a limit says so: the memory limit of the
process's cgroup (a container's, a batch job's: ``memory.max``, or ``memory.limit_in_bytes`` of cgroup v1) and its
address-space limit (``ulimit -v``, ``RLIMIT_AS``).

>>> from jaxstow._util.host_memory import default_host_budget, usable_memory
>>> 0 < default_host_budget() < usable_memory()
True
"""

from __future__ import annotations

import os
import resource

__all__ = ["default_host_budget", "usable_memory"]

#: Where a process's cgroup memory limit is read: cgroup v2's, then v1's (the process's own cgroup, as mounted).
_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def usable_memory() -> int:
    """The memory this process may use, in bytes: physical memory, or its cgroup's or address-space limit if lower."""
    limits = [os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")]
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY and soft > 0:
        limits.append(soft)
    limits.extend(limit for path in _CGROUP_LIMITS if (limit := _cgroup_limit(path)) is not None)
    return min(limits)


def default_host_budget() -> int:
    """A quarter of the memory this process may use, in bytes."""
    return usable_memory() // 4


def _cgroup_limit(path: str) -> int | None:
    """The limit the cgroup file ``path`` holds; ``None`` where it holds none (``max``) or cannot be read."""
    try:
        with open(path, encoding="ascii") as file:
            text = file.read().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() and int(text) > 0 else None
