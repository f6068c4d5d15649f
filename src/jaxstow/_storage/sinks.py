"""Files written all or nothing, wherever they go: a local path, an ``s3://`` object, any other fsspec URL; and a
caller's file object written whole, or an error naming it.

A local path gets a temporary sibling, fsynced and renamed (:func:`~jaxstow._storage.atomic.atomic_write`); ``s3://``
a multipart upload completed only when every byte is written, after aborting a killed writer's unfinished uploads to
the same key (:class:`~jaxstow._storage.s3_upload.S3Upload`); any other URL a temporary object moved into place.
A file object is written as it is, through :func:`file_object_sink`.

>>> import jaxstow
>>> from jaxstow._storage.sinks import atomic_sink
>>> with atomic_sink("memory://jaxstow-doc/sinks/x.bin") as sink:
...     _ = sink.write(b"hello")
>>> jaxstow._storage.remote.url_filesystem("memory://jaxstow-doc/sinks")[0].ls("/jaxstow-doc/sinks", detail=False)
['/jaxstow-doc/sinks/x.bin']
>>> import io
>>> from jaxstow._storage.sinks import file_object_sink
>>> earlier = io.BytesIO(b"an earlier, longer content")
>>> with file_object_sink(earlier) as sink:
...     _ = sink.write(b"new")
>>> earlier.getvalue()
b'new'
"""

from __future__ import annotations

import contextlib
import io
import operator
import os
import secrets
from collections.abc import Iterator
from typing import Any, BinaryIO, NoReturn, cast

from jaxstow._storage.atomic import TEMPORARY_MARKER, atomic_write
from jaxstow._storage.failures import storage_error, storage_failures
from jaxstow._storage.opening import local_path
from jaxstow._storage.settings import StorageSettings
from jaxstow._storage.transfer import Transfer
from jaxstow.errors import ArgumentError, IsAFolderError, JaxstowError, StorageError, excerpt

__all__ = ["atomic_sink", "file_object_sink", "object_upload"]


@contextlib.contextmanager
def atomic_sink(target: str | os.PathLike[str], settings: StorageSettings | None = None) -> Iterator[BinaryIO]:
    """Write ``target`` (a local path or a URL) all or nothing.

    It appears whole when the block ends, and an error in the block leaves what was there before. An ``OSError`` of
    the writes becomes a :class:`~jaxstow.errors.StorageError` naming ``target``.
    """
    settings = settings or StorageSettings()
    path = local_path(target)
    if path is not None:
        from jaxstow._storage.opening import refuse_options

        refuse_options(path, settings)
        with atomic_write(path) as sink:
            yield sink
        return
    from jaxstow._storage.remote import storage_errors, url_filesystem

    url = os.fspath(target)
    fs, remote = url_filesystem(url, settings.options)
    if url.endswith("/"):  # a folder's name; one that is a folder of the store is refused by object_upload
        raise IsAFolderError("is a folder (its name ends in /): cannot write a file there", file=url)
    upload = object_upload(fs, remote, url=url, transfer=settings.transfer, whole=True)
    try:
        with storage_failures(url):
            yield upload  # type: ignore[misc]
        upload.finish()
        with storage_errors(url):
            upload.complete()
    except BaseException:
        upload.abort()
        raise


def object_upload(fs: Any, path: str, *, url: str, transfer: Transfer, whole: bool) -> Any:
    """A sink for the object at ``path`` of ``fs``, with ``finish()``, ``complete()`` and ``abort()``.

    ``finish()`` sends the rest, ``complete()`` waits and makes it appear. ``whole=True`` makes it atomic where the
    store alone does not: S3 uploads are atomic anyway (and unfinished ones to the same key are aborted first), other
    stores get a temporary object moved into place.
    """
    from jaxstow._storage.s3 import S3Bucket, is_s3

    if is_s3(fs):
        from jaxstow._storage.s3_upload import S3Upload

        bucket_name, key, _ = fs.split_path(path)
        bucket = S3Bucket(fs, bucket_name, transfer)
        if whole:
            bucket.abort_uploads_to(key, url=url)
            listed = bucket.request(  # through botocore, as the upload: it runs while the interpreter exits too
                lambda: bucket.client.list_objects_v2(Bucket=bucket_name, Prefix=f"{key}/", MaxKeys=1),
                url=url,
                doing="looking for a folder of its name (ListObjectsV2)",
            )
            if listed.get("KeyCount", 0):  # a file there would lie beside a run's steps, unseen by its readers
                raise IsAFolderError("cannot write it: it is a folder (objects are stored under it)", file=url)
        return S3Upload(bucket, key, url=url)
    return _FileUpload(fs, path, url=url, whole=whole)


class _FileUpload:
    """An object of an fsspec file system written through ``fs.open``; with ``whole``, under a temporary name first."""

    def __init__(self, fs: Any, path: str, *, url: str, whole: bool) -> None:
        from jaxstow._storage.remote import storage_errors

        self.name = url
        self._fs = fs
        self._final = path
        folder, _, name = path.rpartition("/")
        self._path = f"{folder}/.{name}{TEMPORARY_MARKER}{os.getpid()}-{secrets.token_hex(4)}" if whole else path
        with storage_errors(url):
            if whole and fs.isdir(path):  # the file would be moved into it, and nothing would be at the URL
                raise IsAFolderError("cannot write it: it is a folder", file=url)
            self._file = fs.open(self._path, "wb")

    def write(self, data: Any) -> int:
        return int(self._file.write(data))

    def tell(self) -> int:
        return int(self._file.tell())

    def flush(self) -> None:
        self._file.flush()

    def seekable(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def finish(self) -> None:
        from jaxstow._storage.remote import storage_errors

        with storage_errors(self.name):
            self._file.close()

    def complete(self) -> None:
        if self._path != self._final:
            self._fs.mv(self._path, self._final)

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self._file.close()
        with contextlib.suppress(Exception):
            if self._fs.exists(self._path):
                self._fs.rm(self._path)


@contextlib.contextmanager
def file_object_sink(file: BinaryIO) -> Iterator[BinaryIO]:
    """``file``, a caller's binary file object, written whole by every write, or a :class:`StorageError` naming it;
    from its position on, it holds exactly what the block wrote (the module's example).

    A raw stream (an unbuffered file, a pipe, a socket's ``makefile(buffering=0)``) may write fewer bytes than it is
    given and say so by what ``write`` returns: the rest is written until none is left. A raw stream that would
    block (``write`` returns ``None``) or one that writes nothing is an error, as is an ``OSError`` of its writes,
    flushes and seeks (a full disk), chained; but one of jaxstow's own temporary files (a checkpoint's staging
    folder) lets its ``OSError`` through, to its owner, which names the file being written. A write returning
    ``None`` on a file object that is not a raw stream is taken to have written everything, as
    ``io.BufferedWriter``'s documentation promises of its writes. A seekable one that held more after its position
    (an earlier, longer content) is cut where the writes end, once flushed; one that cannot be cut (no working
    ``truncate()``) is an :class:`ArgumentError` before anything is written.

    >>> import io
    >>> class Short(io.RawIOBase):  # writes at most 3 bytes a call, as a pipe or a socket may
    ...     def __init__(self): self.data = bytearray()
    ...     def writable(self): return True
    ...     def write(self, b): self.data += bytes(b)[:3]; return min(len(b), 3)
    >>> short = Short()
    >>> with file_object_sink(short) as sink:
    ...     _ = sink.write(b"0123456789")
    >>> bytes(short.data)
    b'0123456789'
    """
    buffered = _buffered_file(file)
    if buffered is None:
        whole = _WholeWrites(file)
    else:  # what the caller wrote before goes first; then the writes go beneath its buffer
        _WholeWrites(buffered).flush()
        whole = _WholeWrites(cast(BinaryIO, buffered.raw))
    try:
        end = whole.end_beyond()
        yield cast(BinaryIO, whole)
        whole.flush()
        if end is not None and whole.tell() < end:
            whole.truncate()
    finally:
        if buffered is not None and whole.seekable():
            with contextlib.suppress(OSError, ValueError):  # its buffer is empty: it only learns where the writes ended
                buffered.seek(buffered.raw.tell())


def _buffered_file(file: BinaryIO) -> io.BufferedWriter | io.BufferedRandom | None:
    """``file`` if it is a file opened buffered by its caller (``open(path, "wb")``), whose writes the save makes on
    its raw file beneath the buffer: a write that fails (a full disk) leaves nothing in the buffer for the file's own
    ``close()`` to fail on again, a bare ``OSError`` in place of the save's :class:`StorageError`. ``None`` for any
    other file object, and for jaxstow's own temporary files (whose owner handles their close)."""
    if type(file) not in (io.BufferedWriter, io.BufferedRandom):
        return None
    buffered = cast(io.BufferedWriter | io.BufferedRandom, file)
    name = getattr(buffered, "name", "")
    own = isinstance(name, str) and TEMPORARY_MARKER in name
    return buffered if isinstance(getattr(buffered, "raw", None), io.FileIO) and not own else None


class _WholeWrites:
    """A caller's file object whose writes are written whole; see :func:`file_object_sink`."""

    def __init__(self, file: BinaryIO) -> None:
        self._file = file
        self._raw = isinstance(file, io.RawIOBase)
        # One that writes only at its end (opened in mode "a") is written as a stream: a seek back to complete
        # what was written (zipfile's headers) would append instead, and leave a corrupt archive.
        self._seekable = bool(getattr(file, "seekable", lambda: False)()) and not _appends(file)
        self.name = getattr(file, "name", "")  # what the writers name in their errors
        # jaxstow's own temporary file (a checkpoint's staging folder): its owner names the final file in its errors
        self._own = isinstance(self.name, str) and TEMPORARY_MARKER in self.name

    def write(self, data: Any) -> int:
        try:
            written = self._file.write(data)
            total = memoryview(data).nbytes
            if written == total or (not self._raw and not _is_count(written)):
                return total  # whole: all but raw streams write whole or raise, whatever they return
            done = self._count(written)
            if done < total:
                view = memoryview(data).cast("B")
                while done < total:
                    done += self._count(self._file.write(view[done:]))
            return total
        except JaxstowError:
            raise
        except OSError as error:
            if self._own:
                raise
            raise self._error(error) from error

    def _count(self, written: Any) -> int:
        """How many bytes a write says it wrote, which must be some."""
        if written is None:
            self._refuse(
                "the file object is non-blocking and would block; give a blocking one (a socket with no timeout of "
                "0, a pipe without O_NONBLOCK), or save to an io.BytesIO and send its bytes"
            )
        if not _is_count(written):
            self._refuse(f"its write() returned {excerpt(written, 60)}, not how many bytes it wrote")
        count = operator.index(written)
        if count <= 0:
            self._refuse(
                f"its write() wrote {count} bytes of those left and would write no more; check that the file object "
                "(a pipe, a socket) is still open at its other end"
            )
        return count

    def flush(self) -> None:
        flush = getattr(self._file, "flush", None)
        if flush is None:
            return
        try:
            flush()
        except OSError as error:
            if self._own:
                raise
            raise self._error(error) from error

    @property
    def raw(self) -> Any:
        """The raw file written: the caller's, or the one beneath its buffer (``None`` for neither: a ``BytesIO``)."""
        return self._file if isinstance(self._file, io.FileIO) else getattr(self._file, "raw", None)

    def seekable(self) -> bool:
        return self._seekable

    def seek(self, offset: int, whence: int = 0) -> int:
        if not self._seekable:  # zipfile then writes as to a stream
            raise io.UnsupportedOperation("seek")
        try:
            return self._file.seek(offset, whence)
        except io.UnsupportedOperation:  # a question zipfile asks, which it answers itself
            raise
        except OSError as error:  # a buffered file flushes before it seeks: a full disk shows here
            if self._own:
                raise
            raise self._error(error) from error

    def tell(self) -> int:
        return self._file.tell()

    def end_beyond(self) -> int | None:
        """Where the file object ends, if it holds bytes after its position (it can be cut there, or this is an
        :class:`ArgumentError`); ``None`` if it holds none, or is not seekable (a pipe, a socket: nothing follows).

        One that says it is seekable but cannot seek to its end, as ``gzip.open(path, "wb")`` (which writes only
        forward, at its end), is written as a stream."""
        if not self._seekable:
            return None
        start = self.tell()
        try:
            end = self._file.seek(0, io.SEEK_END)
        except (ValueError, io.UnsupportedOperation):
            self._seekable = False
            return None
        self.seek(start)
        if end <= start:
            return None
        try:
            self._file.truncate(end)  # the size it has: a test that changes nothing
        except (AttributeError, OSError) as error:  # io.UnsupportedOperation is an OSError
            raise ArgumentError(
                f"{self._label()}: the file object holds {end - start} bytes after its position {start} (an earlier "
                f"content), which a shorter save would leave after its own, and cannot be cut ({type(error).__name__}: "
                f"{error}); nothing was written: save to an empty file object (open(path, 'wb'), io.BytesIO()) or "
                "truncate it first"
            ) from None
        return end

    def truncate(self) -> None:
        """Cut the file object where it stands."""
        try:
            self._file.truncate()
        except OSError as error:
            if self._own:
                raise
            raise self._error(error) from error

    def _label(self) -> str:
        """How errors name the file object: its name, else its type (and file descriptor)."""
        name = self.name
        if isinstance(name, str) and name:
            return name
        if isinstance(name, int) and not isinstance(name, bool):
            return f"<{type(self._file).__name__} of file descriptor {name}>"
        return f"<{type(self._file).__name__}>"

    def _refuse(self, problem: str) -> NoReturn:
        raise StorageError(f"cannot write it: {problem}", file=self._label())

    def _error(self, error: OSError) -> StorageError:
        """The :class:`StorageError` naming the file object for ``error``, to raise ``from error``."""
        name = self.name
        if isinstance(name, str) and name and os.path.exists(name):
            return storage_error(error, name)  # a file opened by its path: the words name its folder
        strerror = error.strerror or f"{type(error).__name__}: {error}"
        return StorageError(
            f"cannot write it: {strerror[:1].lower()}{strerror[1:]}", file=self._label(), errno=error.errno
        )


def _appends(file: Any) -> bool:
    """Whether ``file`` writes at its end whatever its position: opened in mode ``"a"``."""
    mode = getattr(file, "mode", "")
    return isinstance(mode, str) and "a" in mode


def _is_count(written: Any) -> bool:
    """Whether a write's result is a count of bytes (an integer, not a bool)."""
    try:
        operator.index(written)
    except TypeError:
        return False
    return not isinstance(written, bool)
