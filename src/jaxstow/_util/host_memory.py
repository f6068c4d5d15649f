"""How much of the host's memory a save or a restore may hold at once by default: a quarter of physical memory.

>>> from jaxstow._util.host_memory import default_host_budget
>>> default_host_budget() > 0
True
"""

from __future__ import annotations

import os

__all__ = ["default_host_budget", "physical_memory"]


def physical_memory() -> int:
    """The machine's physical memory, in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def default_host_budget() -> int:
    """A quarter of the machine's physical memory, in bytes."""
    return physical_memory() // 4
