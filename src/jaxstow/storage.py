"""Where bytes live: local files written atomically, and readable sources with random access.

A save to a path writes a temporary file in the same folder, fsyncs it, renames it over the final name and fsyncs the
folder, so a crash leaves either the old file or the new one, never a torn one.

>>> import os, tempfile
>>> from jaxstow.storage import atomic_write, open_source
>>> folder = tempfile.mkdtemp()
>>> with atomic_write(os.path.join(folder, "x.bin")) as sink:
...     _ = sink.write(b"hello")
>>> source = open_source(os.path.join(folder, "x.bin"))
>>> source.size, bytes(source.read(1, 4))
(5, b'ello')
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import secrets
import socket
import zlib
from collections.abc import Iterator
from typing import BinaryIO, Protocol, runtime_checkable

from jaxstow.errors import PathError, TruncatedFileError

__all__ = [
    "TEMPORARY_MARKER",
    "ReadSource",
    "atomic_write",
    "fsync_directory",
    "open_source",
    "remove_dead_leftovers",
    "temporary_sibling",
]

#: Part of the name of every temporary file or folder jaxstow writes; readers and listings skip such names.
TEMPORARY_MARKER = ".jaxstow-tmp-"

_WRITE_BUFFER = 1 << 20


_HOST = f"{zlib.crc32(socket.gethostname().encode()):08x}"
_TEMPORARY_FILE = re.compile(re.escape(TEMPORARY_MARKER) + r"(\d+)-([0-9a-f]{8})-[0-9a-f]{8}$")


def temporary_sibling(path: str) -> str:
    """A fresh temporary name in the folder of ``path``: it names the writing process and (by a hash) its host."""
    folder, name = os.path.split(os.path.abspath(path))
    return os.path.join(folder, f".{name}{TEMPORARY_MARKER}{os.getpid()}-{_HOST}-{secrets.token_hex(4)}")


def remove_dead_leftovers(folder: str) -> list[str]:
    """Delete the temporary files in ``folder`` whose writer, a process of this host, no longer runs; their names.

    A killed save cannot clean up after itself; the next save into the same folder does. Files of live processes,
    of other hosts and temporary folders (a checkpoint manager's, cleaned under its lock) are left alone.

    >>> import os, subprocess, sys, tempfile
    >>> from jaxstow.storage import remove_dead_leftovers, temporary_sibling
    >>> folder = tempfile.mkdtemp()
    >>> dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True).stdout
    >>> mine = temporary_sibling(os.path.join(folder, "model.jxs"))
    >>> theirs = mine.replace(f"-tmp-{os.getpid()}-", f"-tmp-{int(dead)}-")
    >>> for path in (mine, theirs):
    ...     open(path, "wb").close()
    >>> remove_dead_leftovers(folder) == [os.path.basename(theirs)], os.listdir(folder) == [os.path.basename(mine)]
    (True, True)
    """
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    removed = []
    for entry in entries:
        match = _TEMPORARY_FILE.search(entry.name)
        if match is None or match[2] != _HOST or _running(int(match[1])) or entry.is_dir(follow_symlinks=False):
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(entry.path)
            removed.append(entry.name)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it runs, as another user
        return True
    return True


def fsync_directory(folder: str) -> None:
    """Make a rename or a deletion in ``folder`` durable."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """Write ``path`` all or nothing: a temporary sibling, fsync, rename, fsync of the folder.

    Any failure (disk full, I/O error, an exception in the block, Ctrl-C) removes the temporary file and leaves the
    previous file as it was. Temporary files that killed saves left in the folder are removed first.
    """
    final = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(final))
    if not os.path.isdir(folder):
        raise PathError(f"cannot write it: the folder {folder} does not exist (create it first)", file=final)
    if os.path.isdir(final):
        raise PathError("cannot write it: it is a folder", file=final)
    remove_dead_leftovers(folder)
    temporary = temporary_sibling(final)
    sink = open(temporary, "wb", buffering=_WRITE_BUFFER)  # noqa: SIM115 - closed below on every path
    try:
        yield sink
        sink.flush()
        os.fsync(sink.fileno())
        sink.close()
        os.replace(temporary, final)
        fsync_directory(os.path.dirname(os.path.abspath(final)))
    except BaseException:
        with contextlib.suppress(OSError):  # closing flushes, which fails again on a full disk
            sink.close()
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


@runtime_checkable
class ReadSource(Protocol):
    """Random-access bytes: a local file, a file object or an object in a store."""

    name: str
    size: int
    parallel: bool  # whether several threads may read at once

    def read_into(self, offset: int, buffer: memoryview) -> None:
        """Fill ``buffer`` with the bytes at ``offset``; raise :class:`TruncatedFileError` if the source ends first."""

    def read(self, offset: int, length: int) -> bytes:
        """The ``length`` bytes at ``offset``."""

    def close(self) -> None:
        """Release the source."""

    def describe_size(self) -> str:
        """The size in words, for error messages."""


class _ReadSourceBase:
    name: str
    size: int
    parallel = False

    def read_into(self, offset: int, buffer: memoryview) -> None:
        raise NotImplementedError

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


class LocalFile(_ReadSourceBase):
    """A local file read with ``pread``, safe to share between threads."""

    parallel = True

    def __init__(self, path: str) -> None:
        self.name = path
        self._descriptor = os.open(path, os.O_RDONLY)
        self.size = os.fstat(self._descriptor).st_size

    def read_into(self, offset: int, buffer: memoryview) -> None:
        buffer = buffer.cast("B")
        done = 0
        while done < len(buffer):
            count = os.preadv(self._descriptor, [buffer[done:]], offset + done)
            if count == 0:
                raise self._truncated(offset, len(buffer), done)
            done += count

    def fileno(self) -> int:
        """The open file descriptor, for positional reads."""
        return self._descriptor

    def close(self) -> None:
        os.close(self._descriptor)


class FileObject(_ReadSourceBase):
    """A seekable binary file object, such as ``io.BytesIO`` or an open file."""

    def __init__(self, file: BinaryIO) -> None:
        self.name = str(getattr(file, "name", type(file).__name__))
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


def open_source(target: str | os.PathLike[str] | BinaryIO | ReadSource) -> ReadSource:
    """A :class:`ReadSource` for a path or a seekable binary file object (a source is returned as it is)."""
    if isinstance(target, ReadSource):
        return target
    if isinstance(target, str | os.PathLike):
        path = os.fspath(target)
        if os.path.isdir(path):
            raise PathError(_folder_problem(path), file=path)
        return LocalFile(path)
    return FileObject(target)


def _folder_problem(path: str) -> str:
    """Why a folder cannot be loaded as a file, and what opens it if it is a checkpoint folder."""
    from jaxstow.checkpoint.record import RECORD_NAME

    if os.path.isfile(os.path.join(path, RECORD_NAME)):
        parent, step = os.path.split(os.path.abspath(path))
        return (
            f"is a folder, step {step} of a checkpoint folder: load one of its files, or restore the step with "
            f"jaxstow.CheckpointManager({parent!r}).restore({step})"
        )
    with os.scandir(path) as entries:
        steps = any(entry.is_dir() and os.path.isfile(os.path.join(entry.path, RECORD_NAME)) for entry in entries)
    if steps:
        return f"is a checkpoint folder, not a file: restore it with jaxstow.CheckpointManager({path!r}).restore()"
    return "is a folder, not a file"
