"""fsspec URLs (``s3://``, ``gs://``, ``memory://``, ...): range reads, and folders committed by a marker written last.

This module is imported only when a URL is given, and it needs fsspec (``pip install 'jaxstow[fsspec]'``).

Object stores have no atomic rename, so a folder of files is made visible the other way round: its files are uploaded
first and its *marker*, a small JSON object whose ``"files"`` lists the folder's files, is written last. A folder
without its marker is unfinished and is never listed; files that a marker does not list are leftovers. Replacing a
committed folder uploads the new files under fresh names and switches to them by overwriting the marker, a single PUT.

>>> import json, jaxstow, jax.numpy as jnp
>>> from jaxstow._storage.remote import RemoteStore
>>> store = RemoteStore("memory://jaxstow-doc/runs", marker="done.json")
>>> staging = store.stage("1", replace=False)
>>> with staging.open("weights.safetensors") as (stored, sink):
...     jaxstow.save(sink, {"w": jnp.arange(3.0)})
>>> store.committed()
[]
>>> staging.commit(json.dumps({"files": [stored]}).encode())
>>> store.committed()
['1']
>>> jaxstow.load(store.source("1", stored), as_numpy=True)
{'w': array([0., 1., 2.], dtype=float32)}
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

from jaxstow._storage.atomic import TEMPORARY_MARKER
from jaxstow._storage.sources import SourceBase
from jaxstow._util.optional import require
from jaxstow.errors import FormatError, JaxstowError, MissingDependencyError, PathNotFoundError, StorageError

__all__ = ["RemoteSource", "RemoteStaging", "RemoteStore", "open_remote_source", "storage_errors", "url_filesystem"]


@contextlib.contextmanager
def storage_errors(url: str) -> Iterator[None]:
    """Turn what fsspec and a store's client raise (missing credentials, a server out of reach, a refused request)
    into jaxstow errors naming ``url``: a missing object is a :class:`PathNotFoundError`, the rest a
    :class:`StorageError` whose cause is the client's exception.

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


def url_filesystem(url: str, storage_options: dict[str, Any] | None = None) -> tuple[Any, str]:
    """The fsspec file system of ``url`` and the path in it; a missing package names the extra that installs it."""
    fsspec = require("fsspec", extra="fsspec", purpose=f"reading or writing {url}")
    try:
        with storage_errors(url):
            fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    except StorageError as error:
        if isinstance(error.__cause__, ImportError):  # the protocol's own package (s3fs, gcsfs, ...) is missing
            raise MissingDependencyError(f"{url}: {error.__cause__} (pip install 'jaxstow[fsspec]')") from None
        raise
    return fs, path


def open_remote_source(url: str, *, storage_options: dict[str, Any] | None = None) -> RemoteSource:
    """The object at ``url``, read by byte ranges."""
    fs, path = url_filesystem(url, storage_options)
    return RemoteSource(fs, path, name=url)


class RemoteSource(SourceBase):
    """One object of an fsspec file system read by byte ranges: a :class:`~jaxstow._format.source.ReadSource`."""

    parallel = True

    def __init__(self, fs: Any, path: str, *, name: str) -> None:
        self.name = name
        self._fs = fs
        self._path = path
        with storage_errors(name):
            self.size = int(fs.size(path))

    def read(self, offset: int, length: int) -> bytes:
        with storage_errors(self.name):
            data = bytes(self._fs.cat_file(self._path, start=offset, end=offset + length)) if length else b""
        if len(data) != length:
            raise self._truncated(offset, length, len(data))
        return data

    def read_into(self, offset: int, buffer: memoryview) -> None:
        buffer = buffer.cast("B")
        buffer[:] = self.read(offset, len(buffer))

    def close(self) -> None:
        """Nothing to release: every read is its own request."""


def _marked_files(marker: bytes, *, where: str) -> set[str]:
    """The files a marker lists: its ``"files"``, and the files of other processes under ``"parts"``."""
    try:
        record = json.loads(marker)
        files, parts = record["files"], record.get("parts") or {}
        names = set(files.values() if isinstance(files, dict) else files)
        for part_files in parts.values():
            names.update(part_files)
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise FormatError(f"the marker is not a JSON object with a 'files' entry ({error})", file=where) from None
    return names


class RemoteStore:
    """Folders under one fsspec URL, each committed by its ``marker`` object written last.

    ``storage_options`` go to fsspec (``{"key": ..., "secret": ..., "client_kwargs": {"endpoint_url": ...}}`` for
    an S3-compatible server).
    """

    def __init__(self, url: str, *, marker: str, storage_options: dict[str, Any] | None = None) -> None:
        self.fs, root = url_filesystem(url, storage_options)
        self.root = root.rstrip("/")
        self.location = url.rstrip("/")
        self.marker = marker

    def path(self, *parts: str) -> str:
        """The file system path of ``parts`` under the root."""
        return "/".join((self.root, *parts))

    def url(self, *parts: str) -> str:
        """The URL of ``parts`` under the root, for messages."""
        return "/".join((self.location, *parts))

    def ensure(self) -> None:
        """Create the root (a no-op on stores without folders)."""
        with storage_errors(self.location):
            self.fs.makedirs(self.root, exist_ok=True)

    def _files(self) -> list[str]:
        """Every file under the root, as paths relative to it, fresh from the store."""
        self.fs.invalidate_cache(self.root)
        try:
            with storage_errors(self.location):
                found = self.fs.find(self.root)
        except FileNotFoundError:
            return []
        prefix = self.root + "/"
        return [path.removeprefix(prefix) for path in found if path.startswith(prefix)]

    def committed(self) -> list[str]:
        """Names of the folders whose marker is present."""
        return sorted(
            {rel.split("/")[0] for rel in self._files() if rel.endswith("/" + self.marker) and rel.count("/") == 1}
        )

    def read_marker(self, name: str) -> bytes:
        with storage_errors(self.url(name, self.marker)):
            return bytes(self.fs.cat_file(self.path(name, self.marker)))

    def source(self, name: str, file: str) -> RemoteSource:
        return RemoteSource(self.fs, self.path(name, file), name=self.url(name, file))

    def stage(self, name: str, *, replace: bool, token: str | None = None) -> RemoteStaging:
        """Start writing folder ``name``; ``replace`` when a committed folder of that name is to be replaced. With the
        ``token`` of another process's staging, write into that same folder."""
        return RemoteStaging(self, name, replace=replace, token=token)

    def delete(self, name: str) -> None:
        """Delete a committed folder: its marker first, so that it is never seen half deleted."""
        with storage_errors(self.url(name)):
            self.fs.rm(self.path(name, self.marker))
            _remove_tree(self.fs, self.path(name))

    def cleanup(self, owns: Callable[[str], bool]) -> list[str]:
        """Remove what unfinished writes left (folders that ``owns`` without a marker, files no marker lists).

        Returns the removed paths, relative to the root.
        """
        by_folder: dict[str, list[str]] = {}
        removed = []
        for rel in self._files():
            folder, _, rest = rel.partition("/")
            if rest:
                by_folder.setdefault(folder, []).append(rest)
            elif TEMPORARY_MARKER in folder:
                self.fs.rm(self.path(folder))
                removed.append(folder)
        for folder, files in by_folder.items():
            if self.marker in files:
                listed = _marked_files(self.read_marker(folder), where=self.url(folder, self.marker))
                for file in files:
                    if file != self.marker and file not in listed:
                        self.fs.rm(self.path(folder, file))
                        removed.append(f"{folder}/{file}")
            elif owns(folder) or TEMPORARY_MARKER in folder:
                _remove_tree(self.fs, self.path(folder))
                removed.append(folder)
        return removed


def _remove_tree(fs: Any, path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        fs.rm(path, recursive=True)


class RemoteStaging:
    """A folder being written to a :class:`RemoteStore`; :meth:`commit` writes its marker."""

    def __init__(self, store: RemoteStore, name: str, *, replace: bool, token: str | None = None) -> None:
        self._store = store
        self._name = name
        # New files of a replaced folder get fresh names, so the committed ones stay intact until the marker switches.
        # Processes writing one folder together share the fresh names through the token of the first.
        if token is not None:
            self._generation = token or None
        else:
            self._generation = secrets.token_hex(4) if replace else None
        self._written: list[str] = []

    @property
    def token(self) -> str:
        """What another process passes to :meth:`RemoteStore.stage` to write into this same folder."""
        return self._generation or ""

    @contextlib.contextmanager
    def open(self, file: str) -> Iterator[tuple[str, BinaryIO]]:
        """Write ``file``; yields the name it is stored under and a sink to write to."""
        stored = file
        if self._generation is not None:
            stem, dot, extension = file.partition(".")
            stored = f"{stem}.{self._generation}{dot}{extension}"
        self._written.append(stored)
        with self._store.fs.open(self._store.path(self._name, stored), "wb") as sink:
            yield stored, sink

    def commit(self, marker: bytes) -> None:
        """Write the marker, which makes the folder visible (and, on replacing, switches to the new files)."""
        store = self._store
        with storage_errors(store.url(self._name)):
            store.fs.pipe_file(store.path(self._name, store.marker), marker)
            if self._generation is not None:
                keep = {*_marked_files(marker, where=store.url(self._name, store.marker)), store.marker}
                store.fs.invalidate_cache(store.path(self._name))
                for path in store.fs.find(store.path(self._name)):
                    if path.rsplit("/", 1)[-1] not in keep:
                        store.fs.rm(path)

    def abort(self) -> None:
        """Remove what this write uploaded; a committed folder it was to replace stays as it was."""
        if self._generation is None:
            _remove_tree(self._store.fs, self._store.path(self._name))
            return
        for stored in self._written:
            with contextlib.suppress(FileNotFoundError):
                self._store.fs.rm(self._store.path(self._name, stored))
