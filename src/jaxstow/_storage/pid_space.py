"""This process's PID namespace: a process id names a process only within one, and a container that shares its
host's name (``docker run --network host``) has one of its own, whose processes the host cannot see by their ids.

Whoever tells from a process id and a host name whether a writer still runs (the lock file of :mod:`lock`, the
temporary names of :mod:`atomic`) records the namespace too.

>>> from jaxstow._storage.pid_space import pid_space
>>> pid_space().startswith("pid:[") or pid_space() == ""
True
"""

from __future__ import annotations

import os

__all__ = ["pid_space"]


def pid_space() -> str:
    """The PID namespace of this process (``/proc/self/ns/pid``); ``""`` where there is none to read (not Linux)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""
