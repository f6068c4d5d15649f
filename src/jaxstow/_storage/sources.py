"""Local sources of random-access bytes: files read with ``pread``, and binary file objects.

>>> import io
>>> from jaxstow._storage.sources import FileObject
>>> source = FileObject(io.BytesIO(b"hello"), "greeting")
>>> source.size, bytes(source.read(1, 4))
(5, b'ello')
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
import threading
from collections.abc import Callable, Sequence
from typing import BinaryIO, Generic, TypeVar

from jaxstow._format.source import Parallel
from jaxstow._format.tensor_reads import LOCAL_DISK
from jaxstow._storage.failures import storage_error
from jaxstow.errors import (
    ArgumentError,
    ClosedError,
    IsAFolderError,
    NotAFolderError,
    PathError,
    PathNotFoundError,
    StorageError,
    TruncatedFileError,
)

__all__ = ["IOV_MAX", "FileObject", "LocalFile", "SourceBase"]

T = TypeVar("T")


def _iov_max() -> int:
    """The most buffers one ``preadv`` call takes: the system's (1024 on Linux and macOS), 1024 where it says none."""
    told = os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else -1
    return told if 0 < told < 1024 else 1024


IOV_MAX = _iov_max()


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

    def reading(self) -> contextlib.AbstractContextManager[Callable[[int, memoryview], None]]:
        """A function that reads as :meth:`read_into` does, for the reads of one block: :meth:`read_into` itself."""
        return contextlib.nullcontext(self.read_into)

    def read(self, offset: int, length: int) -> bytes:
        buffer = bytearray(length)
        self.read_into(offset, memoryview(buffer))
        return bytes(buffer)

    def _truncated(self, offset: int, wanted: int, got: int) -> TruncatedFileError:
        shrunk = offset + wanted <= self.size  # it held them when it was opened
        ends = (
            f"was cut short after it was opened (of {self.size} bytes)" if shrunk else f"ends after {self.size} bytes"
        )
        return TruncatedFileError(
            f"the file {ends}, but {wanted} bytes were expected at offset {offset} (only {got} there)", file=self.name
        )

    def describe_size(self) -> str:
        """The size, and a hint when a file object was left at its end."""
        return f"{self.size} bytes"

    def forget(self) -> bool:
        """Drop the bytes kept of what was read, so that reading them again asks for them again; whether they can
        come back other than they did: bytes read over a network, not those of a file on a disk or in memory."""
        return False


class LocalFile(SourceBase):
    """A local regular file read with ``pread``, safe to share between threads.

    Only a regular file is opened: a folder raises :class:`~jaxstow.errors.IsAFolderError`, a missing file
    :class:`~jaxstow.errors.PathNotFoundError`, a FIFO, a device or a socket a :class:`~jaxstow.errors.PathError`, a
    file that cannot be opened or read (permission denied, an I/O error) a :class:`~jaxstow.errors.StorageError`,
    checked before it is opened and again on what was opened, which is opened without waiting (a FIFO never blocks).
    ``name`` names it in errors (``path`` by default); with ``follow=False``, ``path`` must not end in a link.

    A file written in place since it was opened (its size or modification time changed) is an error at the read
    after the change (:meth:`check_unchanged`), never its new bytes under its old header; ``live=True`` leaves out
    that check, for a file that a writer is known to be changing (an HDF5 file in SWMR mode).
    """

    parallel = LOCAL_DISK

    def __init__(self, path: str, *, name: str | None = None, follow: bool = True, live: bool = False) -> None:
        self.name = path if name is None else name
        self._descriptor, opened = _open_regular(path, self.name, follow=follow)
        self.size = opened.st_size
        self._opened = None if live else (opened.st_size, opened.st_mtime_ns)
        # Reads in flight: close() leaves the descriptor to the last of them, so that no read of another thread
        # lands on a descriptor the system gave meanwhile to another file.
        self._state = threading.Lock()
        self._readers = 0
        self._closed = False

    def in_use(self, *, checked: bool = True) -> _InUse[int]:
        """The descriptor, open while the block runs; a :class:`~jaxstow.errors.ClosedError` once closed.

        What the block read is checked after it (:meth:`check_unchanged`), unless ``checked`` is false.
        """
        return _InUse(self, self._descriptor, checked)

    def read(self, offset: int, length: int) -> bytes:
        with self.in_use():
            data = self._pread(length, offset)
            while len(data) < length:  # a read cut short: read on from there
                more = self._pread(length - len(data), offset + len(data))
                if not more:
                    raise self._truncated(offset, length, len(data))
                data += more
            return data

    def read_into(self, offset: int, buffer: memoryview) -> None:
        with self.in_use():
            self._fill(offset, buffer)

    def reading(self) -> _InUse[Callable[[int, memoryview], None]]:
        """A function that reads as :meth:`read_into` does, from any thread, while the block runs (:meth:`in_use`):
        the file is checked once, when the block ends, not after each read (the pieces of one leaf)."""
        return _InUse(self, self._fill, True)

    def _fill(self, offset: int, buffer: memoryview) -> None:
        """Fill ``buffer`` with the bytes at ``offset``, the descriptor in use."""
        done = self._preadv([buffer], offset)
        if done < buffer.nbytes:  # a read cut short: read on from there
            buffer = buffer.cast("B")
            while done < len(buffer):
                count = self._preadv([buffer[done:]], offset + done)
                if count == 0:
                    raise self._truncated(offset, len(buffer), done)
                done += count

    def read_scatter(self, offset: int, buffers: Sequence[memoryview]) -> None:
        """Fill ``buffers``, one after another, with the bytes from ``offset`` on: ``preadv`` calls, each of at most
        :data:`IOV_MAX` buffers (the system refuses more)."""
        views = [buffer.cast("B") for buffer in buffers if buffer.nbytes]
        wanted = sum(len(view) for view in views)
        done = 0
        with self.in_use():
            while views:
                count = self._preadv(views[:IOV_MAX], offset + done)
                if count == 0:
                    raise self._truncated(offset, wanted, done)
                done += count
                while views and count >= len(views[0]):
                    count -= len(views.pop(0))
                if views:
                    views[0] = views[0][count:]

    def status(self, descriptor: int) -> os.stat_result:
        """``os.fstat`` of ``descriptor`` (this file's, from :meth:`in_use`); a :class:`StorageError` if it fails."""
        try:
            return os.fstat(descriptor)
        except OSError as error:
            raise storage_error(error, self.name, doing="read it") from error

    def check_unchanged(self, now: os.stat_result) -> None:
        """Raise an error if ``now``, the file's status, says it was written since it was opened: a
        :class:`~jaxstow.errors.TruncatedFileError` if it is shorter, a :class:`~jaxstow.errors.StorageError` if it
        is longer or was modified.

        Its change time is not compared: a rename over its name, an unlink or a ``chmod`` changes it, not its bytes.
        """
        if self._opened is None or (now.st_size, now.st_mtime_ns) == self._opened:
            return
        size = self._opened[0]
        kind, what = (TruncatedFileError, "was cut short") if now.st_size < size else (StorageError, "changed")
        how = f"it now has {now.st_size} bytes of the {size} it had" if now.st_size != size else "it was modified"
        raise kind(
            f"the file {what} since it was opened ({how}): another program wrote it in place, so what was read of it "
            "no longer matches its header, and was not used; open it again to read what it holds now",
            file=self.name,
        )

    def _preadv(self, views: list[memoryview], offset: int) -> int:
        try:
            return os.preadv(self._descriptor, views, offset)
        except OSError as error:  # an I/O error of the device: named, with this file
            raise storage_error(error, self.name, doing="read it") from error

    def _pread(self, length: int, offset: int) -> bytes:
        try:
            return os.pread(self._descriptor, length, offset)
        except OSError as error:
            raise storage_error(error, self.name, doing="read it") from error

    def fileno(self) -> int:
        """The open file descriptor, for positional reads."""
        return self._descriptor

    def close(self) -> None:
        with self._state:
            if self._closed:
                return
            self._closed = True
            last = not self._readers
        if last:
            os.close(self._descriptor)


class _InUse(Generic[T]):
    """A use of a :class:`LocalFile`'s descriptor, as a ``with`` block: ``given`` while it runs, the file checked for a
    change once it ends (:meth:`LocalFile.check_unchanged`) where ``checked`` and the block raised nothing; the
    descriptor closed then if the file was closed meanwhile. A class, not a generator: one is entered for every read,
    and a generator's context manager costs about twice its time."""

    __slots__ = ("checked", "given", "source")

    def __init__(self, source: LocalFile, given: T, checked: bool) -> None:
        self.source, self.given, self.checked = source, given, checked

    def __enter__(self) -> T:
        source = self.source
        with source._state:
            if source._closed:
                raise ClosedError("reading it", file=source.name)
            source._readers += 1  # close() leaves the descriptor to the last use in flight
        return self.given

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, traceback: object) -> None:
        source = self.source
        try:
            if kind is None and self.checked:
                source.check_unchanged(source.status(source._descriptor))
        finally:
            with source._state:
                source._readers -= 1
                last = source._closed and not source._readers
            if last:
                os.close(source._descriptor)


_SPECIAL = {
    stat.S_IFIFO: "a FIFO (a named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFLNK: "a link that does not resolve (a loop of links)",
}


def _open_regular(path: str, name: str, *, follow: bool) -> tuple[int, os.stat_result]:
    """A descriptor of the regular file at ``path``, opened read-only without blocking, and the file's status; an
    error naming ``name`` else."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        _check_regular((os.stat if follow else os.lstat)(path).st_mode, name)
        descriptor = os.open(path, flags)  # O_NONBLOCK: a FIFO put in its place since would not wait for a writer
    except PathError:
        raise
    except FileNotFoundError:
        raise PathNotFoundError("no such file", file=name) from None
    except NotADirectoryError:
        raise NotAFolderError("cannot open it: a part of its path is a file, not a folder", file=name) from None
    except OSError as error:
        raise storage_error(error, name, doing="open it") from error
    except ValueError as error:  # a NUL byte or a lone surrogate in the name
        raise PathError(f"cannot open it: {error}", file=name) from None
    try:
        opened = os.fstat(descriptor)
        _check_regular(opened.st_mode, name)  # what was opened, should it have changed since the check
        os.set_blocking(descriptor, True)
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor, opened


def _check_regular(mode: int, name: str) -> None:
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise IsAFolderError("is a folder, not a file", file=name)
    raise PathError(f"is {special_kind(mode)}, not a file: jaxstow reads regular files only", file=name)


def special_kind(mode: int) -> str:
    """What a path of ``mode`` (``os.stat``'s) that is no regular file nor folder is, in words."""
    return _SPECIAL.get(stat.S_IFMT(mode), "no regular file")


class FileObject(SourceBase):
    """A seekable binary file object, such as ``io.BytesIO`` or an open file, named ``name`` in errors."""

    def __init__(self, file: BinaryIO, name: str) -> None:
        self.name = name
        self._file = file
        if getattr(file, "closed", False):
            raise ArgumentError(f"{name}: the file object is closed: open it again (in binary mode) before using it")
        try:
            self._start = file.tell()
            self.size = file.seek(0, io.SEEK_END) - self._start
        except (OSError, AttributeError) as error:  # a pipe, a socket's file: io.UnsupportedOperation is an OSError
            raise ArgumentError(
                f"{name}: a file object to read must be seekable, and this one is not ({type(error).__name__}: "
                f"{error}): read it whole into io.BytesIO(...) first"
            ) from None
        self._lock = threading.Lock()  # a seek and the read after it: one thread's, not another's between them

    def describe_size(self) -> str:
        if self.size == 0 and self._start > 0:
            return f"0 bytes after position {self._start} (was the file object left at its end? seek(0) before loading)"
        return f"{self.size} bytes"

    def read_into(self, offset: int, buffer: memoryview) -> None:
        buffer = buffer.cast("B")
        with self._lock:
            if getattr(self._file, "closed", False):  # by its owner: the system's ValueError otherwise
                problem = "cannot read it: its file object was closed by its owner (keep it open while it is read)"
                raise StorageError(problem, file=self.name)
            done = 0
            try:
                self._file.seek(self._start + offset)
                while done < len(buffer):
                    count = self._file.readinto(buffer[done:])  # type: ignore[attr-defined]
                    if not count:
                        raise self._truncated(offset, len(buffer), done)
                    done += count
            except OSError as error:  # the file object's own failure, named; no folder to speak of
                problem = f"cannot read it: the file object's read failed ({type(error).__name__}: {error})"
                raise StorageError(problem, file=self.name, errno=error.errno) from error

    def close(self) -> None:
        """The caller owns the file object: it stays open, back at the position it had, ready to be read again
        (closed by its owner meanwhile, it is left so)."""
        if not getattr(self._file, "closed", False):
            self._file.seek(self._start)
