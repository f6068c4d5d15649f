"""Where a process id names a process: this PID namespace, of this boot, of this machine.

A process id names a process only within one PID namespace, and a container that shares its host's name (``docker
run --network host``) has one of its own, whose processes the host cannot see by their ids. A namespace, in turn, is
one of a running kernel: two machines that share a name (``localhost``) have the same first namespace, and a
machine restarted has no process of its boot before. Whoever tells from a process id and a host name whether a
writer still runs (the lock file of :mod:`lock`, the temporary names of :mod:`atomic`) records them too.

>>> from jaxstow._storage.pid_space import boot_id, machine_id, pid_space
>>> pid_space().startswith("pid:[") or pid_space() == ""
True
>>> boot_id() != machine_id() or boot_id() == ""
True
"""

from __future__ import annotations

import os

__all__ = ["boot_id", "machine_id", "pid_space"]


def pid_space() -> str:
    """The PID namespace of this process (``/proc/self/ns/pid``); ``""`` where there is none to read (not Linux)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def boot_id() -> str:
    """The running kernel's boot id, new at each start of the machine; ``""`` where there is none to read."""
    return _first_line("/proc/sys/kernel/random/boot_id")


def machine_id() -> str:
    """The machine's id (``/etc/machine-id``), which stays over restarts; ``""`` where there is none to read."""
    return _first_line("/etc/machine-id")


def _first_line(path: str) -> str:
    try:
        with open(path, encoding="ascii") as file:
            return file.readline().strip()
    except (OSError, UnicodeDecodeError):
        return ""
