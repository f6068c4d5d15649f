"""What a user names a file with (a path, a ``file://`` or fsspec URL, a binary file object), resolved once for reading.

:func:`local_path` tells a local path from a URL and :func:`display_name` how errors name a file. :func:`locate` turns
a path, a URL, a binary file object or a source into a :class:`Location` (how errors name it; its path, URL, file
object or source) once, at the read path's entry; :meth:`Location.open` opens it as a source. fsspec is imported only
when a URL other than ``file://`` is opened.

>>> import io, os, tempfile
>>> from jaxstow._storage.opening import locate
>>> path = os.path.join(tempfile.mkdtemp(), "x.bin")
>>> with open(path, "wb") as file:
...     _ = file.write(b"hello")
>>> source = locate(path).open()
>>> source.size, bytes(source.read(1, 4))
(5, b'ello')
>>> locate("s3://bucket/model.jxs").url, locate(io.BytesIO()).name
('s3://bucket/model.jxs', '<BytesIO>')
>>> local_path("runs/a"), local_path("file:///tmp/runs"), local_path("s3://bucket/runs")
('runs/a', '/tmp/runs', None)
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

from jaxstow._format.source import ReadSource
from jaxstow._storage.settings import StorageSettings, storage_settings
from jaxstow._storage.sources import FileObject, LocalFile
from jaxstow._storage.transfer import Transfer
from jaxstow.errors import ArgumentError

__all__ = [
    "Location",
    "PathOrFile",
    "Readable",
    "display_name",
    "local_path",
    "locate",
    "open_source",
    "reached",
    "refuse_options",
]

#: What users name a file with: a path, a URL or a binary file object.
PathOrFile = str | os.PathLike[str] | BinaryIO
#: What the read path takes: a path, a URL, a binary file object or a source.
Readable = PathOrFile | ReadSource


def local_path(target: str | os.PathLike[str]) -> str | None:
    """The local path that ``target`` names, or ``None`` for any other URL: a path, a ``file://`` or ``local://`` URL,
    or an fsspec chain of caches ending in one (``simplecache::file:///data/model``), each read as the path itself,
    under the rules of local files and folders.

    >>> local_path("file:///data/model.jxs"), local_path("simplecache::local:///data"), local_path("s3://b/k")
    ('/data/model.jxs', '/data', None)
    """
    text = os.fspath(target)
    if "\x00" in text:  # the system's ValueError otherwise, at the first call that takes the path
        raise ArgumentError(f"{text!r} holds a NUL character ('\\x00'), which no file name holds")
    last = text.rpartition("::")[2]  # an fsspec chain reads the last URL's bytes
    for scheme in ("file://", "local://"):
        if last.startswith(scheme):
            path = last.removeprefix(scheme)
            return path.removeprefix("localhost") if path.startswith("localhost/") else path
    return None if "://" in text else text


def display_name(target: Any) -> str:
    """How error messages name a path or a file object."""
    if isinstance(target, str | os.PathLike):
        return os.fspath(target)
    return str(getattr(target, "name", f"<{type(target).__name__}>"))


@dataclass(frozen=True, eq=False)
class Location:
    """A file named for reading, resolved once.

    Exactly one of ``path``, ``url``, ``file`` and ``source`` is how it is reached, except that a local file given as a
    source has its ``path`` too.
    """

    #: How error messages name it.
    name: str
    #: The local path (of a path, a ``file://`` URL or a local file given as a source).
    path: str | None = None
    #: An fsspec URL other than ``file://``.
    url: str | None = None
    #: A binary file object, read from its position when given.
    file: BinaryIO | None = None
    #: A source given as it is.
    source: ReadSource | None = None

    def open(self, settings: StorageSettings | None = None) -> ReadSource:
        """The source to read (a source given is returned as it is).

        ``settings`` say how a URL is reached (fsspec's storage options, the transfer, a local cache). A folder raises
        :class:`~jaxstow.errors.IsAFolderError`, a missing file :class:`~jaxstow.errors.PathNotFoundError`, a FIFO, a
        device or a socket a :class:`~jaxstow.errors.PathError`: only regular files are opened.
        """
        if self.source is not None:
            return self.source
        if self.file is not None:
            return FileObject(self.file, self.name)
        if self.path is not None:
            refuse_options(self.path, settings)
            return LocalFile(self.path)
        from jaxstow._storage.remote import open_remote_source

        assert self.url is not None
        return open_remote_source(self.url, settings)


def locate(target: Readable | Location) -> Location:
    """The :class:`Location` of a path, a URL, a seekable binary file object or a source.

    A location is returned as it is; anything else raises an :class:`~jaxstow.errors.ArgumentError`.
    """
    if isinstance(target, Location):
        return target
    if isinstance(target, str | os.PathLike):
        text = os.fspath(target)
        path = local_path(text)
        return Location(text, path=path) if path is not None else Location(text, url=text)
    if isinstance(target, ReadSource):
        return Location(target.name, path=target.name if isinstance(target, LocalFile) else None, source=target)
    if isinstance(target, io.TextIOBase):
        raise ArgumentError(f"{display_name(target)} is open in text mode: open it with open(..., 'rb')")
    if not all(callable(getattr(target, method, None)) for method in ("readinto", "seek", "tell")):
        raise ArgumentError(
            f"expected a path, a URL or a seekable binary file object to read, not {type(target).__name__}"
        )
    return Location(display_name(target), file=target)


def reached(
    storage_options: Mapping[str, Any] | None, transfer: Transfer | None, cache_dir: str | os.PathLike[str] | None
) -> StorageSettings | None:
    """How a call reaches a URL (:func:`~jaxstow._storage.settings.storage_settings`, its arguments checked);
    ``None`` when it gives none of them, which is all a local file needs."""
    if storage_options is None and transfer is None and cache_dir is None:
        return None
    return storage_settings(storage_options, transfer, cache_dir)


def open_source(target: Readable, settings: StorageSettings | None = None) -> ReadSource:
    """A :class:`ReadSource` for a path, a URL or a seekable binary file object (a source is returned as it is)."""
    return locate(target).open(settings)


def refuse_options(path: str, settings: StorageSettings | None) -> None:
    """Refuse storage options given with a local path, which would be ignored, with an ArgumentError.

    The transfer settings and the cache are for URLs and do nothing for a local path.
    """
    if settings is not None and settings.options:
        raise ArgumentError(
            f"storage_options are for fsspec URLs, not for the local path {path!r}: leave them out, or give a URL"
        )
