"""Who holds a writer's lock: the process, its host, boot and PID namespace, and whether it still runs.

A lock file, or lock object, names its holder as JSON; :meth:`Holder.is_gone` tells from here whether that holder
ended without releasing it, only where its process id names a process seen from here.

>>> from jaxstow._storage.lock_holder import Holder
>>> me = Holder.me()
>>> Holder.parse(me.to_json()) == me, me.is_me(), me.is_gone(), Holder.parse(b"{}")
(True, True, False, None)
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import secrets
import socket
from dataclasses import asdict, dataclass

from jaxstow._storage.lock_lease import valid_lease
from jaxstow._storage.pid_space import boot_id, machine_id, pid_space

__all__ = ["Holder"]


@dataclass(frozen=True)
class Holder:
    """Who holds a lock: process id, host name, since when, and a token that tells two holders apart."""

    pid: int
    host: str
    since: str
    token: str
    #: The process's PID namespace (``/proc/self/ns/pid``): a container's processes are not seen from another's.
    pid_space: str = ""
    #: The inode of the lock file it wrote (0: none, or written before this was recorded): a lock file of another
    #: inode naming it is a copy (``cp -r`` of its folder), which names a holder of another folder's lock.
    inode: int = 0
    #: The boot id of its machine's kernel, and the machine's id (``""``: not recorded): a holder of another boot is
    #: of another machine of the same name, or of this one before it restarted.
    boot: str = ""
    machine: str = ""
    #: On an object store, the seconds of its lease (0: none; see :mod:`~jaxstow._storage.lock_lease`), and how many
    #: times it was renewed.
    lease: float = 0.0
    renewals: int = 0

    @classmethod
    def me(cls, inode: int = 0, lease: float = 0.0) -> Holder:
        now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        host, token = socket.gethostname(), secrets.token_hex(8)
        return cls(os.getpid(), host, now, token, pid_space(), inode, boot_id(), machine_id(), lease)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def parse(cls, data: bytes) -> Holder | None:
        """The holder a lock file names; ``None`` for an empty or unreadable one."""
        try:
            fields = json.loads(data)
            pid = int(fields["pid"])
            if not 0 < pid < 2**31:  # no process has it: a damaged or forged file
                return None
            space, inode = str(fields.get("pid_space", "")), int(fields.get("inode", 0))
            boot, machine = str(fields.get("boot", "")), str(fields.get("machine", ""))
            lease = fields.get("lease", 0.0)
            lease = float(lease) if valid_lease(lease) else 0.0  # a stranger's: no lease, rather than a wait for ever
            renewals = int(fields.get("renewals", 0))
            return cls(
                pid,
                str(fields["host"]),
                str(fields["since"]),
                str(fields["token"]),
                space,
                inode,
                boot,
                machine,
                lease,
                renewals,
            )
        except (ValueError, RecursionError, KeyError, TypeError, AttributeError, OverflowError):
            return None

    def same(self, other: Holder | None) -> bool:
        """Whether ``other`` is this holder, renewed or not."""
        return other is not None and (other.token, other.pid, other.host) == (self.token, self.pid, self.host)

    def renewed(self, number: int) -> Holder:
        """This holder as its ``number``-th renewal of its lease writes it."""
        return dataclasses.replace(self, renewals=number)

    def describe(self) -> str:
        if self._other_boot():
            elsewhere = " (of another machine of that name, or of this one before it restarted)"
        else:
            elsewhere = " (in another PID namespace: a container?)" if self._other_space() else ""
        return f"process {self.pid} on host {self.host}{elsewhere} since {self.since}"

    def is_me(self) -> bool:
        """Whether the holder is this process."""
        return self.pid == os.getpid() and self.seen_from_here()

    def _other_space(self) -> bool:
        return bool(self.pid_space) and self.pid_space != pid_space()

    def _other_boot(self) -> bool:
        return bool(self.boot) and self.boot != boot_id()

    def seen_from_here(self) -> bool:
        """Whether its process id names a process of this host, boot and PID namespace."""
        return self.host == socket.gethostname() and not self._other_boot() and not self._other_space()

    def is_gone(self) -> bool:
        """Whether the holder is a process of this host, seen from here, that no longer runs, or one of this machine
        before it restarted; one of another PID namespace (a container sharing the host's name), or of another
        machine of this name, cannot be seen, so is never called gone."""
        if self.host == socket.gethostname() and self._other_boot():
            return bool(self.machine) and self.machine == machine_id()  # this machine, restarted since
        if not self.seen_from_here():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def left(self, lock_file: str) -> bool:
        """Whether ``lock_file``, which names this holder, was left by a writer that ended: the holder is gone
        (:meth:`is_gone`), or its process id, seen from here, now names a process that does not have the lock file
        open (the id given to another program). Where that cannot be told (another host, another PID namespace, a
        process whose open files this one may not list), it was not."""
        if self.is_gone():
            return True
        if not self.seen_from_here():
            return False
        try:
            lock = os.stat(lock_file)
            with os.scandir(f"/proc/{self.pid}/fd") as descriptors:
                opened = [os.stat(descriptor.path) for descriptor in descriptors]
        except OSError:  # no /proc (not Linux), another user's process, a lock file gone: no telling
            return False
        return not any((found.st_dev, found.st_ino) == (lock.st_dev, lock.st_ino) for found in opened)
