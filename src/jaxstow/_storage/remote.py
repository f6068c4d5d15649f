"""fsspec URLs (``s3://``, ``gs://``, ...): a URL's file system, and its objects read by byte ranges, many at once.

Imported only when a URL is given; it needs fsspec (``pip install 'jaxstow[fsspec]'``), which resolves the storage
options and its own configuration. Objects of ``s3://`` URLs are then read by :mod:`jaxstow._storage.s3`, those of
other stores through fsspec, ``requests`` at a time as the :class:`~jaxstow.Transfer` says, each request retried
under its policy (:mod:`jaxstow._storage.retrying`): a body cut short is read again, never taken for the file's end.

>>> import jaxstow, jax.numpy as jnp
>>> from jaxstow._storage.remote import open_remote_source
>>> jaxstow.save("memory://jaxstow-doc/w.jxs", {"w": jnp.arange(3.0)})
>>> source = open_remote_source("memory://jaxstow-doc/w.jxs")
>>> source.size, jaxstow.load(source, as_numpy=True)
(4108, {'w': array([0., 1., 2.], dtype=float32)})
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from jaxstow._format.source import ReadSource
from jaxstow._storage.retrying import BrokenBody
from jaxstow._storage.s3_endpoint import with_endpoint
from jaxstow._storage.settings import StorageSettings
from jaxstow._storage.sources import SourceBase
from jaxstow._storage.transfer import Transfer, lanes
from jaxstow._util.optional import require
from jaxstow.errors import IsAFolderError, JaxstowError, MissingDependencyError, PathNotFoundError, StorageError

__all__ = ["RemoteSource", "object_source", "open_remote_source", "storage_errors", "url_filesystem"]


@contextlib.contextmanager
def storage_errors(url: str) -> Iterator[None]:
    """Turn what fsspec and a store's client raise into jaxstow errors naming ``url``.

    Missing credentials, a server out of reach, a refused request: a missing object is a :class:`PathNotFoundError`, the
    rest a :class:`StorageError` whose cause is the client's exception.

    >>> from jaxstow._storage.remote import storage_errors
    >>> with storage_errors("s3://bucket/model.jxs"):
    ...     raise ConnectionRefusedError(111, "Connection refused")
    Traceback (most recent call last):
    ...
    jaxstow.errors.StorageError: s3://bucket/model.jxs: the storage failed: ConnectionRefusedError: [Errno 111] Connection refused
    """
    try:
        yield
    except JaxstowError:
        raise
    except FileNotFoundError:
        raise PathNotFoundError("no such file or folder", file=url) from None
    except Exception as error:
        text = f"{type(error).__name__}: {error}".replace("\n", " ")
        hint = (
            "; give credentials in storage_options or in fsspec's configuration (FSSPEC_S3_KEY, FSSPEC_S3_SECRET)"
            if "credentials" in text.lower()
            else ""
        )
        raise StorageError(f"the storage failed: {text}{hint}", file=url) from error


def url_filesystem(url: str, storage_options: Mapping[str, Any] | None = None) -> tuple[Any, str]:
    """The fsspec file system of ``url`` and the path in it; a missing package names the extra that installs it."""
    scheme = url.partition("://")[0].lower()
    fsspec = require("fsspec", extra="s3" if scheme in _S3 else "fsspec", purpose=f"reading or writing {url}")
    try:
        with storage_errors(url):
            options = dict(storage_options or {})
            if scheme in _S3:  # an endpoint given wins over a configured one, wherever each is given
                configured = fsspec.config.apply_config(fsspec.get_filesystem_class(scheme), {})
                options = with_endpoint(url, options, configured)
            fs, path = fsspec.core.url_to_fs(url, **options)
    except StorageError as error:
        if isinstance(error.__cause__, ImportError):  # the protocol's own package (s3fs, gcsfs, ...) is missing
            package = _PROTOCOL_PACKAGES.get(scheme)
            install = "'jaxstow[s3]'" if scheme in _S3 else f"'jaxstow[fsspec]' {package or '<the package it names>'}"
            raise MissingDependencyError(f"{url}: {error.__cause__} (pip install {install})") from None
        if isinstance(error.__cause__, ValueError) and "Protocol not known" in str(error.__cause__):
            close = difflib.get_close_matches(scheme, fsspec.available_protocols(), n=3)
            raise StorageError(
                f"no storage is known by the URL scheme {scheme!r}"
                + (f" (did you mean {' or '.join(map(repr, close))}?)" if close else "")
                + ": give a local path, or a URL of a scheme fsspec knows (s3://, gs://, az://, https://, ...)",
                file=url,
            ) from None
        raise
    return fs, path


def forget_listings(fs: Any, root: str) -> None:
    """Drop what ``fs`` listed before of ``root`` and below, in this process: fsspec keeps listings (``dircache``),
    and ``invalidate_cache(root)`` drops only those of ``root`` and its parents, so a folder listed while a step was
    being written hid its ``checkpoint.json`` from every later read of this process."""
    fs.invalidate_cache(root)
    below = root.rstrip("/") + "/"
    for listed in [path for path in list(getattr(fs, "dircache", {})) if str(path).startswith(below)]:
        fs.invalidate_cache(listed)


#: The URL schemes of S3, whose package the extra ``jaxstow[s3]`` installs, and the packages of other stores.
_S3 = ("s3", "s3a")
_PROTOCOL_PACKAGES = {"gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs", "abfss": "adlfs"}


def open_remote_source(url: str, settings: StorageSettings | None = None) -> ReadSource:
    """The object at ``url``, read by byte ranges; with a ``cache_dir`` in the settings, a verified local copy."""
    settings = settings or StorageSettings()
    fs, path = url_filesystem(url, settings.options)
    if settings.cache_dir is not None:
        from jaxstow._storage.cache import cached_source

        return cached_source(
            settings.cache_dir, url, lambda: object_source(fs, path, name=url, transfer=settings.transfer)
        )
    return object_source(fs, path, name=url, transfer=settings.transfer)


def object_source(fs: Any, path: str, *, name: str, transfer: Transfer, whole: bool = False) -> ReadSource:
    """The object at ``path`` of the fsspec file system ``fs``, read by ranged requests as ``transfer`` says.

    Through botocore for S3, through fsspec for any other store. ``whole``: it is to be read from its start on, so an
    S3 object's first request asks for a whole part (its header and the first of its data), not only for its head.
    """
    from jaxstow._storage.s3 import HEAD_BYTES, S3Bucket, S3Object, is_s3

    if is_s3(fs):
        bucket, key, version = fs.split_path(path)
        first = transfer.part_size if whole else HEAD_BYTES
        return S3Object(S3Bucket(fs, bucket, transfer), key, name=name, version=version, first=first)
    return RemoteSource(fs, path, name=name, transfer=transfer)


class RemoteSource(SourceBase):
    """One object of an fsspec file system read by byte ranges: a :class:`~jaxstow._format.source.ReadSource`."""

    def __init__(self, fs: Any, path: str, *, name: str, transfer: Transfer | None = None) -> None:
        self.name = name
        self._fs = fs
        self._path = path
        transfer = transfer or Transfer()
        self._lanes = lanes(transfer)
        self._retries = transfer.retries()
        self.parallel = self._lanes.reads
        with storage_errors(name):
            info = self._retries.call(lambda: fs.info(path), url=name, doing="reading its size")
        if info.get("type") == "directory":  # a store of folders (memory://, a local file system) has them
            raise IsAFolderError("is a folder, not a file", file=name)
        self.size = int(info["size"])

    def read(self, offset: int, length: int) -> bytes:
        if not length:
            return b""
        if offset + length > self.size:  # the object ends before: damage, found without asking the store
            raise self._truncated(offset, length, max(0, self.size - offset))

        def whole() -> bytes:
            data = bytes(self._fs.cat_file(self._path, start=offset, end=offset + length))
            if len(data) < length:
                raise BrokenBody(len(data), length)
            return data

        with self._lanes.reading:
            if self._lanes.read_pace is not None:
                self._lanes.read_pace.wait(length)
            with storage_errors(self.name):
                data = self._retries.call(whole, url=self.name, doing=f"reading bytes {offset}-{offset + length - 1}")
        if len(data) != length:
            raise StorageError(
                f"the storage failed: it answered {len(data)} bytes for the {length} bytes at offset {offset}",
                file=self.name,
            )
        return data

    def read_into(self, offset: int, buffer: memoryview) -> None:
        buffer = buffer.cast("B")
        buffer[:] = self.read(offset, len(buffer))

    def read_scatter(self, offset: int, buffers: Sequence[memoryview]) -> None:
        """Fill ``buffers``, one after another, with the bytes from ``offset`` on: one request, its answer copied."""
        views = [buffer.cast("B") for buffer in buffers]
        data = memoryview(self.read(offset, sum(len(view) for view in views)))
        at = 0
        for view in views:
            view[:] = data[at : at + len(view)]
            at += len(view)

    def forget(self) -> bool:
        """Nothing is kept: every read is its own request, over a network."""
        return True

    def close(self) -> None:
        """Nothing to release: every read is its own request."""
