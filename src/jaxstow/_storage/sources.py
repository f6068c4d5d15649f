"""Local sources of random-access bytes: files read with ``pread``, and binary file objects.

>>> import io
>>> from jaxstow._storage.sources import FileObject
>>> source = FileObject(io.BytesIO(b"hello"), "greeting")
>>> source.size, bytes(source.read(1, 4))
(5, b'ello')
"""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Sequence
from typing import BinaryIO

from jaxstow._format.source import Parallel
from jaxstow._format.tensor_reads import LOCAL_DISK
from jaxstow._storage.failures import storage_error
from jaxstow.errors import IsAFolderError, NotAFolderError, PathNotFoundError, TruncatedFileError

__all__ = ["FileObject", "LocalFile", "SourceBase"]


class SourceBase:
    """What every source shares: ``read`` through ``read_into``, and the errors of a source that ends too soon."""

    name: str
    size: int
    parallel: Parallel | None = None

    def read_into(self, offset: int, buffer: memoryview) -> None:
        raise NotImplementedError

    def read_scatter(self, offset: int, buffers: Sequence[memoryview]) -> None:
        """Fill ``buffers``, one after another, with the bytes from ``offset`` on: one read each here."""
        for buffer in buffers:
            self.read_into(offset, buffer)
            offset += buffer.nbytes

    def read(self, offset: int, length: int) -> bytes:
        buffer = bytearray(length)
        self.read_into(offset, memoryview(buffer))
        return bytes(buffer)

    def _truncated(self, offset: int, wanted: int, got: int) -> TruncatedFileError:
        return TruncatedFileError(
            f"the file ends after {self.size} bytes, but {wanted} bytes were expected at offset {offset} "
            f"(only {got} there)",
            file=self.name,
        )

    def describe_size(self) -> str:
        """The size, and a hint when a file object was left at its end."""
        return f"{self.size} bytes"


class LocalFile(SourceBase):
    """A local file read with ``pread``, safe to share between threads.

    A folder raises :class:`~jaxstow.errors.IsAFolderError`, a missing file :class:`~jaxstow.errors.PathNotFoundError`,
    a file that cannot be opened or read (permission denied, an I/O error) a :class:`~jaxstow.errors.StorageError`.
    """

    parallel = LOCAL_DISK

    def __init__(self, path: str) -> None:
        self.name = path
        try:
            self._descriptor = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise PathNotFoundError("no such file", file=path) from None
        except NotADirectoryError:
            raise NotAFolderError("cannot open it: a part of its path is a file, not a folder", file=path) from None
        except OSError as error:
            raise storage_error(error, path, doing="open it") from error
        status = os.fstat(self._descriptor)
        if stat.S_ISDIR(status.st_mode):
            os.close(self._descriptor)
            raise IsAFolderError("is a folder, not a file", file=path)
        self.size = status.st_size

    def read_into(self, offset: int, buffer: memoryview) -> None:
        buffer = buffer.cast("B")
        done = 0
        while done < len(buffer):
            count = self._preadv([buffer[done:]], offset + done)
            if count == 0:
                raise self._truncated(offset, len(buffer), done)
            done += count

    def read_scatter(self, offset: int, buffers: Sequence[memoryview]) -> None:
        """Fill ``buffers``, one after another, with the bytes from ``offset`` on: ``preadv`` calls."""
        views = [buffer.cast("B") for buffer in buffers if buffer.nbytes]
        wanted = sum(len(view) for view in views)
        done = 0
        while views:
            count = self._preadv(views, offset + done)
            if count == 0:
                raise self._truncated(offset, wanted, done)
            done += count
            while views and count >= len(views[0]):
                count -= len(views.pop(0))
            if views:
                views[0] = views[0][count:]

    def _preadv(self, views: list[memoryview], offset: int) -> int:
        try:
            return os.preadv(self._descriptor, views, offset)
        except OSError as error:  # an I/O error of the device: named, with this file
            raise storage_error(error, self.name, doing="read it") from error

    def fileno(self) -> int:
        """The open file descriptor, for positional reads."""
        return self._descriptor

    def close(self) -> None:
        os.close(self._descriptor)


class FileObject(SourceBase):
    """A seekable binary file object, such as ``io.BytesIO`` or an open file, named ``name`` in errors."""

    def __init__(self, file: BinaryIO, name: str) -> None:
        self.name = name
        self._file = file
        self._start = file.tell()
        self.size = file.seek(0, io.SEEK_END) - self._start

    def describe_size(self) -> str:
        if self.size == 0 and self._start > 0:
            return f"0 bytes after position {self._start} (was the file object left at its end? seek(0) before loading)"
        return f"{self.size} bytes"

    def read_into(self, offset: int, buffer: memoryview) -> None:
        buffer = buffer.cast("B")
        self._file.seek(self._start + offset)
        done = 0
        while done < len(buffer):
            count = self._file.readinto(buffer[done:])  # type: ignore[attr-defined]
            if not count:
                raise self._truncated(offset, len(buffer), done)
            done += count

    def close(self) -> None:
        """The caller owns the file object: it stays open, back at the position it had, ready to be read again."""
        self._file.seek(self._start)
