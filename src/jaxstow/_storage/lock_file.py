"""A lock file opened only where it is its folder's own regular file: a lock writes its holder into its file.

A folder made elsewhere (unpacked, shared, downloaded) may hold a link where the lock file goes. Taken as a lock, it
would have the holder written into the file it leads to, outside the folder or one of the folder's own files, so it
is refused, and so is anything else that is not a regular file of the folder's own (a FIFO, a device, a file that is
also named elsewhere through a hard link).

>>> import os, tempfile
>>> from jaxstow._storage.lock_file import open_lock_file
>>> folder = tempfile.mkdtemp()
>>> os.close(open_lock_file(os.path.join(folder, ".jaxstow.lock")))
>>> os.symlink(os.path.join(folder, "notes.txt"), os.path.join(folder, "linked.lock"))
>>> open_lock_file(os.path.join(folder, "linked.lock"))
Traceback (most recent call last):
...
jaxstow.errors.PathError: .../linked.lock: is a link to .../notes.txt: ...
"""

from __future__ import annotations

import errno
import os
import stat

from jaxstow._storage.sources import special_kind
from jaxstow.errors import PathError

__all__ = ["open_lock_file"]


def open_lock_file(path: str) -> int:
    """A descriptor of the lock file at ``path``, created if absent, open for reading and writing; a
    :class:`~jaxstow.errors.PathError` naming it where it is a link or not a regular file of its folder's own."""
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as error:
        if error.errno == errno.ELOOP and os.path.islink(path):
            raise _refused(path, f"is a link to {os.readlink(path)}") from None
        raise
    status = os.fstat(descriptor)
    if stat.S_ISREG(status.st_mode) and status.st_nlink <= 1:
        return descriptor
    os.close(descriptor)
    if stat.S_ISREG(status.st_mode):
        raise _refused(path, f"is a file with {status.st_nlink} names (hard links), the others elsewhere")
    raise _refused(path, f"is {special_kind(status.st_mode)}, not a regular file")


def _refused(path: str, found: str) -> PathError:
    return PathError(
        f"{found}: the lock's holder is written into its lock file, which must be a file of the folder's own (else "
        f"the holder would be written where it leads, outside the folder or over one of its files); remove it "
        f"(rm {path!r}) if no writer holds the lock, and try again",
        file=path,
    )
