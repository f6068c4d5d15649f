"""Bytes of a local file changed in place: a range read, changed and written back at its offset, then synced.

For the few bytes a format keeps at a fixed place (an HDF5 superblock's flags). The range is written with one
``pwrite``, so a crash may leave it half written: the format must tell that from the bytes (a checksum does).

>>> import os, tempfile
>>> from jaxstow._storage.in_place import rewrite_range
>>> path = os.path.join(tempfile.mkdtemp(), "data.bin")
>>> with open(path, "wb") as file:
...     _ = file.write(b"hello world")
>>> rewrite_range(path, 6, 5, lambda old, size: old.upper())
>>> with open(path, "rb") as file:
...     file.read()
b'hello WORLD'
"""

from __future__ import annotations

import os
from collections.abc import Callable

from jaxstow._storage.failures import storage_failures
from jaxstow.errors import ArgumentError, TruncatedFileError

__all__ = ["rewrite_range"]


def rewrite_range(path: str, offset: int, length: int, change: Callable[[bytes, int], bytes]) -> None:
    """Replace the ``length`` bytes at ``offset`` of the file at ``path`` with ``change(those bytes, size)``.

    The file is synced; nothing is written when ``change`` raises.

    Raises:
        TruncatedFileError: the file ends before the range does.
        ArgumentError: ``change`` gave bytes of another length than the range's.
        StorageError: the file cannot be read or written (a read-only folder, an I/O error).
    """
    with storage_failures(path), open(path, "r+b") as file:
        descriptor = file.fileno()
        old = os.pread(descriptor, length, offset)
        if len(old) != length:
            raise TruncatedFileError(
                f"the file ends before the {length} bytes at offset {offset} (only {len(old)} there)", file=path
            )
        new = change(old, os.fstat(descriptor).st_size)
        if len(new) != length:
            raise ArgumentError(f"{path}: {len(new)} bytes to write in place of {length} at offset {offset}")
        os.pwrite(descriptor, new, offset)
        os.fsync(descriptor)
