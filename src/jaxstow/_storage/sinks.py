"""Files written all or nothing, wherever they go: a local path, an ``s3://`` object, any other fsspec URL.

A local path gets a temporary sibling, fsynced and renamed (:func:`~jaxstow._storage.atomic.atomic_write`); ``s3://``
a multipart upload completed only when every byte is written, after aborting a killed writer's unfinished uploads to
the same key (:class:`~jaxstow._storage.s3_upload.S3Upload`); any other URL a temporary object moved into place.

>>> import jaxstow
>>> from jaxstow._storage.sinks import atomic_sink
>>> with atomic_sink("memory://jaxstow-doc/sinks/x.bin") as sink:
...     _ = sink.write(b"hello")
>>> jaxstow._storage.remote.url_filesystem("memory://jaxstow-doc/sinks")[0].ls("/jaxstow-doc/sinks", detail=False)
['/jaxstow-doc/sinks/x.bin']
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from typing import Any, BinaryIO

from jaxstow._storage.atomic import TEMPORARY_MARKER, atomic_write
from jaxstow._storage.failures import storage_failures
from jaxstow._storage.opening import local_path
from jaxstow._storage.settings import StorageSettings
from jaxstow._storage.transfer import Transfer

__all__ = ["atomic_sink", "object_upload"]


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
