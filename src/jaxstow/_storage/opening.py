"""What a user names a file with, opened for reading: a path, a ``file://`` URL, an fsspec URL or a file object.

fsspec is imported only when a URL other than ``file://`` is given.

>>> import os, tempfile
>>> from jaxstow._storage.opening import open_source
>>> path = os.path.join(tempfile.mkdtemp(), "x.bin")
>>> with open(path, "wb") as file:
...     _ = file.write(b"hello")
>>> source = open_source(path)
>>> source.size, bytes(source.read(1, 4))
(5, b'ello')
"""

from __future__ import annotations

import io
import os
from typing import BinaryIO

from jaxstow._format.source import ReadSource
from jaxstow._storage.paths import display_name, local_path
from jaxstow._storage.settings import StorageSettings
from jaxstow._storage.sources import FileObject, LocalFile
from jaxstow.errors import ArgumentError, IsAFolderError

__all__ = ["open_source", "refuse_options"]


def refuse_options(path: str, settings: StorageSettings) -> None:
    """Storage options given with a local path are a mistake (they would be ignored): an ArgumentError. The transfer
    settings and the cache are for URLs and do nothing for a local path."""
    if settings.options:
        raise ArgumentError(
            f"storage_options are for fsspec URLs, not for the local path {path!r}: leave them out, or give a URL"
        )


def open_source(
    target: str | os.PathLike[str] | BinaryIO | ReadSource, settings: StorageSettings | None = None
) -> ReadSource:
    """A :class:`ReadSource` for a path, a URL or a seekable binary file object (a source is returned as it is).

    ``settings`` say how a URL is reached (fsspec's storage options, the transfer, a local cache). A folder raises
    :class:`~jaxstow.errors.IsAFolderError`, a missing file :class:`~jaxstow.errors.PathNotFoundError`.
    """
    if isinstance(target, ReadSource):
        return target
    if not isinstance(target, str | os.PathLike):
        if isinstance(target, io.TextIOBase):
            raise ArgumentError(f"{display_name(target)} is open in text mode: open it with open(..., 'rb')")
        if not all(callable(getattr(target, method, None)) for method in ("readinto", "seek", "tell")):
            raise ArgumentError(
                f"expected a path, a URL or a seekable binary file object to read, not {type(target).__name__}"
            )
        return FileObject(target)
    path = local_path(target)
    if path is None:
        from jaxstow._storage.remote import open_remote_source

        return open_remote_source(os.fspath(target), settings)
    refuse_options(path, settings or StorageSettings())
    if os.path.isdir(path):
        raise IsAFolderError("is a folder, not a file", file=path)
    return LocalFile(path)
