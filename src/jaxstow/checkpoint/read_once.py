"""Whether a multi-process restore reads each box that several processes hold once, and gathers it among them over
jax's collectives (:mod:`jaxstow._read.broadcast`), or lets every process read what it holds.

Reading once pays where the storage is shared by the processes and slower than the interconnect between them: an
object store or a network file system (NFS, SMB, Lustre, GPFS, BeeGFS, CephFS, GlusterFS, a FUSE mount such as
gcsfuse or mountpoint-s3), which serve every replica's copy of a box over one network. It does not pay for a local
disk, where each process reads at the disk's own speed: there every process reads. ``broadcast_restore=True`` or
``False`` forces the choice. See docs/scaling.md ("Reading once").

>>> mounts = "/dev/nvme0n1p1 / ext4 rw 0 0\\nserver:/export /mnt/shared nfs4 rw 0 0\\n"
>>> file_system("/mnt/shared/run", mounts), file_system("/home/me/run", mounts)
('nfs4', 'ext4')
>>> pays_for_path("/mnt/shared/run", mounts), pays_for_path("/home/me/run", mounts)
(True, False)
"""

from __future__ import annotations

import os

from jaxstow._storage.folders import LocalStore
from jaxstow._storage.store import Store

__all__ = ["NETWORK_FILE_SYSTEMS", "file_system", "pays", "pays_for_path"]

#: File systems whose files live on other machines (``/proc/mounts`` names); ``fuse.*`` ones count too.
NETWORK_FILE_SYSTEMS = frozenset(
    {"nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "glusterfs", "9p", "afs", "pvfs2"}
)
#: fsspec protocols whose files are this machine's own.
_LOCAL_PROTOCOLS = frozenset({"file", "local", "memory"})


def pays(store: Store, requested: bool | None) -> bool:
    """Whether shared boxes of a step in ``store`` are read once: ``requested`` if given, else whether the store is
    shared and slower than the interconnect (an object store, a network file system)."""
    if requested is not None:
        return bool(requested)
    if isinstance(store, LocalStore):
        return pays_for_path(store.root)
    protocol = getattr(getattr(store, "fs", None), "protocol", ())
    protocols = {protocol} if isinstance(protocol, str) else set(protocol)
    if protocols & _LOCAL_PROTOCOLS:
        return pays_for_path(getattr(store, "root", "")) if protocols & {"file", "local"} else False
    return True


def pays_for_path(path: str, mounts: str | None = None) -> bool:
    """Whether the local path ``path`` lies on a network file system (``mounts``: the text of ``/proc/mounts``)."""
    kind = file_system(path, mounts)
    return kind in NETWORK_FILE_SYSTEMS or kind.startswith("fuse.")


def file_system(path: str, mounts: str | None = None) -> str:
    """The type of the file system that holds ``path``, from ``mounts`` (the text of ``/proc/mounts``, read when
    not given); ``""`` where it cannot be told."""
    if mounts is None:
        try:
            with open("/proc/mounts") as file:
                mounts = file.read()
        except OSError:
            return ""
    path = os.path.realpath(path)
    best, kind = "", ""
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].encode().decode("unicode_escape")  # spaces and tabs are written as octal escapes
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind
