"""Folders of files under one fsspec URL, committed by a marker written last.

Object stores have no atomic rename: a folder's files are uploaded first, side by side on the transfer's lanes, and
its *marker*, a JSON object listing them, last. A folder without its marker is never listed; replacing one uploads
new files under fresh names and overwrites the marker, a single PUT. :meth:`RemoteStore.cleanup` aborts a killed
writer's unfinished uploads. See docs/scaling.md ("Object stores").

>>> import json, jaxstow, jax.numpy as jnp
>>> from jaxstow._storage.remote_store import RemoteStore
>>> store = RemoteStore("memory://jaxstow-doc/runs", marker="done.json")
>>> staging = store.stage("1", replace=False)
>>> with staging.open("weights.safetensors") as (stored, sink):
...     jaxstow.save(sink, {"w": jnp.arange(3.0)})
>>> staging.commit(json.dumps({"files": [stored]}).encode())
>>> store.committed()
['1']
>>> jaxstow.load(store.source("1", stored), as_numpy=True)
{'w': array([0., 1., 2.], dtype=float32)}
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import json
import posixpath
import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

from jaxstow._format.source import ReadSource
from jaxstow._storage.atomic import TEMPORARY_MARKER
from jaxstow._storage.buckets import bucket_missing, nothing_at
from jaxstow._storage.created_once import committed_by_another, create_once
from jaxstow._storage.leftovers import removing
from jaxstow._storage.marker_limit import refuse_large_marker
from jaxstow._storage.member_names import check_member_name
from jaxstow._storage.recent import COMMITTED, DELETED, RECENT, WRITTEN, Change, note_change, recent_changes, reconciled
from jaxstow._storage.remote import forget_listings, object_source, storage_errors, url_filesystem
from jaxstow._storage.settings import StorageSettings
from jaxstow._storage.sinks import object_upload
from jaxstow._storage.small_reads import read_small
from jaxstow.errors import ArgumentError, CheckpointError, FormatError, NotAFolderError, PathNotFoundError, StorageError

__all__ = ["WRITING", "RemoteStaging", "RemoteStore", "check_segments"]

#: The object a manager puts first in a new folder it writes, naming the files it opens there before it writes them,
#: and removes once the folder is committed: what marks an unfinished folder of its own, which the next writer removes
#: with every file it names, listed yet or not (a folder without it is another's, left alone).
WRITING = ".jaxstow-writing"


def check_segments(url: str) -> None:
    """Refuse a URL whose path has an empty, ``.`` or ``..`` segment (``s3://bucket/runs//a``).

    Object stores keep such keys as they are, but listings come back normalised (s3fs drops the empty segment), so
    a directory there would be written and never found again. The error names the URL to use instead.

    >>> check_segments("s3://bucket/runs/a/"), check_segments("memory:///runs/a")
    (None, None)
    >>> check_segments("s3://bucket/runs//a")
    Traceback (most recent call last):
    ...
    jaxstow.errors.ArgumentError: s3://bucket/runs//a: a checkpoint URL cannot have an empty, '.' or '..' segment in its path (its listings would not find what is written there); use s3://bucket/runs/a
    """
    scheme, separator, path = url.rstrip("/").rpartition("://")
    rooted = path[: len(path) - len(path.lstrip("/"))]  # memory:///a, hdfs:///a: a path from the store's root
    segments = path.removeprefix(rooted).split("/")
    if not separator or not any(segment in ("", ".", "..") for segment in segments):
        return
    cleaned = rooted + posixpath.normpath("/".join(segment for segment in segments if segment)).lstrip("/")
    raise ArgumentError(
        f"{url}: a checkpoint URL cannot have an empty, '.' or '..' segment in its path (its listings would not find "
        f"what is written there); use {scheme}{separator}{cleaned}",
        file=url,
    )


def _marked_files(marker: bytes, *, where: str) -> set[str]:
    """The files a marker lists: its ``"files"``, and the files of other processes under ``"parts"``."""
    try:
        record = json.loads(marker)
        files, parts = record["files"], record.get("parts") or {}
        names = set(files.values() if isinstance(files, dict) else files)
        for part_files in parts.values():
            names.update(part_files)
    except (ValueError, RecursionError, KeyError, TypeError, AttributeError) as error:
        raise FormatError(f"the marker is not a JSON object with a 'files' entry ({error})", file=where) from None
    return {check_member_name(name, file=where) for name in names}


class RemoteStore:
    """Folders under one fsspec URL, each committed by its ``marker`` object written last.

    The settings' options go to fsspec (``{"key": ..., "secret": ..., "client_kwargs": {"endpoint_url": ...}}`` for
    an S3-compatible server); their transfer says how files move, their ``cache_dir`` where copies are kept.
    """

    def __init__(self, url: str, *, marker: str, settings: StorageSettings | None = None) -> None:
        check_segments(url)
        self.settings = settings or StorageSettings()
        self.fs, root = url_filesystem(url, self.settings.options)
        self.root = root.rstrip("/")
        self.location = url.rstrip("/")
        self.identity = self.location
        self.marker = marker

    def without_cache(self) -> RemoteStore:
        """This store with every file read from the store itself, never from the cache's copies: as a host without
        them reads it."""
        uncached = copy.copy(self)
        uncached.settings = dataclasses.replace(self.settings, cache_dir=None)
        return uncached

    def path(self, *parts: str) -> str:
        """The file system path of ``parts`` under the root."""
        return "/".join((self.root, *parts))

    def url(self, *parts: str) -> str:
        """The URL of ``parts`` under the root, for messages."""
        return "/".join((self.location, *parts))

    def ensure(self) -> None:
        """Create the root (a no-op on stores without folders); never a bucket, which a mistyped name would make."""
        with storage_errors(self.location):
            if bucket_missing(self.fs, self.root):
                raise nothing_at(self.location, bucket_missing=True)
            if self.fs.isfile(self.root):  # its steps would go under the object's key, where no reader of it looks
                raise NotAFolderError("is a file, not a folder for checkpoints", file=self.location)
            self.fs.makedirs(self.root, exist_ok=True)

    def _files(self) -> list[str]:
        """Every file under the root, as paths relative to it, fresh from the store."""
        forget_listings(self.fs, self.root)
        try:
            with storage_errors(self.location):
                found = self.fs.find(self.root)
        except FileNotFoundError:  # a folder with no step yet, unless its bucket is missing: never "no step" then
            with storage_errors(self.location):
                if bucket_missing(self.fs, self.root):
                    raise nothing_at(self.location, bucket_missing=True) from None
            return []
        prefix = self.root + "/"
        return [path.removeprefix(prefix) for path in found if path.startswith(prefix)]

    def committed(self) -> list[str]:
        """Names of the folders whose marker is present: as listed, but for the folders committed or deleted last,
        whose marker is asked for by key where the listing disagrees (:mod:`~jaxstow._storage.recent`)."""
        listed = [rel.split("/")[0] for rel in self._files() if rel.endswith("/" + self.marker) and rel.count("/") == 1]
        changes = recent_changes(self.fs, self.path(RECENT), url=self.url(RECENT), transfer=self.settings.transfer)
        return reconciled(listed, changes, holds=lambda name: self._held_marker(name) is not None)

    def note(self, name: str, change: Change) -> None:
        """Note folder ``name`` as committed, deleted or started just now, for the listings that show it late."""
        note_change(self.fs, self.path(RECENT), name, change, url=self.url(RECENT), transfer=self.settings.transfer)

    def read_marker(self, name: str) -> bytes:
        """The marker of folder ``name``, read as a file is (an answer cut short is the storage's fault, never a
        damaged record), refused unread where its size is too large (:mod:`~jaxstow._storage.marker_limit`)."""
        url = self.url(name, self.marker)
        with storage_errors(url):
            source = object_source(
                self.fs, self.path(name, self.marker), name=url, transfer=self.settings.transfer, whole=True
            )
        with contextlib.closing(source):
            refuse_large_marker(source.size, url)
            return bytes(source.read(0, source.size))

    def source(self, name: str, file: str, header: str | None = None, *, whole: bool = False) -> ReadSource:
        """The file ``file`` of folder ``name``; ``whole``: it is to be read from its start on (its first request then
        brings the first part of its data with its header).

        With a cache, its local copy (used without asking the store when its header checksum is ``header``).
        """
        url = self.url(name, file)
        opener = functools.partial(
            object_source, self.fs, self.path(name, file), name=url, transfer=self.settings.transfer, whole=whole
        )
        if self.settings.cache_dir is None:
            return opener()
        from jaxstow._storage.cache import cached_source

        return cached_source(self.settings.cache_dir, url, opener, header)

    def stage(self, name: str, *, replace: bool, token: str | None = None) -> RemoteStaging:
        """Start writing folder ``name``; ``replace`` when a committed folder of that name is to be replaced.

        With the ``token`` of another process's staging, write into that same folder.
        """
        return RemoteStaging(self, name, replace=replace, token=token)

    def delete(self, name: str) -> None:
        """Delete a committed folder: its marker first, so that it is never seen half deleted, then the files it names,
        by name (a store may list a new object seconds after it holds it), then whatever else the folder holds. A
        folder whose marker is gone already (a store may list a deleted object for seconds) is no error."""
        marker = self.url(name, self.marker)
        with storage_errors(self.url(name)):
            held = self._held_marker(name)
            try:
                files = set() if held is None else _marked_files(held, where=marker)
            except FormatError:  # a damaged marker: the listing finds its files
                files = set()
            _remove_files(self.fs, [self.path(name, self.marker)])
            self.note(name, DELETED)
            _remove_files(self.fs, [self.path(name, file) for file in sorted(files)])
            _remove_tree(self.fs, self.path(name))

    def files(self) -> list[str]:
        """The names of the files directly under the root (not temporary ones, not hidden ones such as the lock)."""
        return sorted(rel for rel in self._files() if "/" not in rel and not rel.startswith("."))

    def remove(self, name: str) -> None:
        """Delete the file ``name`` directly under the root."""
        with storage_errors(self.url(name)):
            self.fs.rm(self.path(name))

    def cleanup(self, owns: Callable[[str], bool]) -> list[str]:
        """Remove what unfinished writes left.

        Folders that ``owns`` marked as being written (:data:`WRITING`) without a marker, files no marker lists, and
        on S3 unfinished multipart uploads under the root: only the lock's holder writes here, so they are dead
        writers'. A folder of another's, even of a step's name, is left alone.

        What the listing shows is judged by what the store holds now, each marker asked for by key: a store may list
        an object seconds after it holds it, or for seconds after it is deleted, and a step committed a moment ago
        may be listed with the :data:`WRITING` it no longer holds and without its marker. A folder whose marker the
        store holds is never removed; one is removed only while the store holds its :data:`WRITING`, with the files it
        names. The folders started last (:mod:`~jaxstow._storage.recent`) are judged so too, listed or not.

        Returns the removed paths, relative to the root.
        """
        removed = [f"{key} (an unfinished upload)" for key in self._abort_uploads()]
        with storage_errors(self.location):
            by_folder: dict[str, list[str]] = {}
            for rel in self._files():
                folder, _, rest = rel.partition("/")
                if rest:
                    by_folder.setdefault(folder, []).append(rest)
                elif TEMPORARY_MARKER in folder:
                    _remove_files(self.fs, [self.path(folder)])
                    removed.append(folder)
            forget_listings(self.fs, self.root)  # what follows asks the store by key, never the listing just made
            changes = recent_changes(self.fs, self.path(RECENT), url=self.url(RECENT), transfer=self.settings.transfer)
            started = {folder for folder, change in changes.items() if change is WRITTEN}
            for folder in started:  # a killed writer's, which the listing may not show yet
                by_folder.setdefault(folder, [])
            for folder, files in by_folder.items():
                if TEMPORARY_MARKER in folder:
                    _remove_tree(self.fs, self.path(folder))
                    removed.append(folder)
                elif (marker := self._held_marker(folder)) is not None:
                    listed = _marked_files(marker, where=self.url(folder, self.marker))
                    leftovers = [file for file in files if file not in {*listed, self.marker} and _a_step_writes(file)]
                    _remove_files(self.fs, [self.path(folder, file) for file in leftovers])  # a cut replace's files
                    removed += [f"{folder}/{file}" for file in leftovers]
                    if folder in started:  # committed by a writer killed before it noted so
                        self.note(folder, COMMITTED)
                elif owns(folder) and (WRITING in files or folder in started):  # not another's
                    if (writing := self._held_writing(folder)) is not None:
                        _remove_files(self.fs, [self.path(folder, file) for file in sorted(writing)])  # listed or not
                        _remove_tree(self.fs, self.path(folder))
                        _remove_files(self.fs, [self.path(folder, WRITING)])
                        removed.append(folder)
                    if folder in started:
                        self.note(folder, DELETED)
        return removed

    def _held_writing(self, name: str) -> set[str] | None:
        """The files the :data:`WRITING` of folder ``name`` names (none in an earlier version's, which is empty), if
        the store holds it now (asked for by key, whatever the listing shows)."""
        try:
            data = read_small(
                self.fs, self.path(name, WRITING), url=self.url(name, WRITING), transfer=self.settings.transfer
            )
        except FileNotFoundError:
            return None
        try:
            return _marked_files(data, where=self.url(name, WRITING)) if data else set()
        except FormatError:
            return set()

    def _held_marker(self, name: str) -> bytes | None:
        """The marker of folder ``name`` if the store holds it now (asked for by key, whatever the listing shows)."""
        try:
            return self.read_marker(name)
        except PathNotFoundError:
            return None

    def _abort_uploads(self) -> list[str]:
        """Abort the unfinished multipart uploads under the root (S3 only); their keys, relative to the root."""
        from jaxstow._storage.s3 import S3Bucket, is_s3

        if not is_s3(self.fs):
            return []
        bucket_name, prefix, _ = self.fs.split_path(self.root)
        bucket = S3Bucket(self.fs, bucket_name, self.settings.transfer)
        uploads = bucket.unfinished_uploads(f"{prefix}/" if prefix else "", url=self.location)
        bucket.abort_uploads(uploads, url=self.location)
        return [str(upload["Key"]).removeprefix(f"{prefix}/") for upload in uploads]


def _remove_tree(fs: Any, path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        fs.rm(path, recursive=True)


def _remove_files(fs: Any, paths: list[str]) -> None:
    """Delete the files ``paths`` named, whether or not the store lists them yet; those already gone are no error."""
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            fs.rm(path)


class RemoteStaging:
    """A folder being written to a :class:`RemoteStore`; :meth:`commit` writes its marker."""

    def __init__(self, store: RemoteStore, name: str, *, replace: bool, token: str | None = None) -> None:
        self._store = store
        self._name = name
        # New files of a replaced folder get fresh names, so the committed ones stay intact until the marker switches.
        # Processes writing one folder together share the fresh names through the token of the first.
        self._joined = token is not None
        if token is not None:
            self._generation = token or None
        else:
            self._generation = secrets.token_hex(4) if replace else None
        self._written: list[str] = []
        self._uploads: list[Any] = []
        self._own = token is None and not replace  # a new folder, this write's alone
        if self._own:  # marked as this manager's, before anything is written to it
            url = store.url(name)
            with storage_errors(url):
                store.fs.invalidate_cache(store.path(name))
                found = [path.rsplit("/", 1)[-1] for path in store.fs.find(store.path(name))]
                store.fs.invalidate_cache(store.path(name))  # a listing may show objects deleted a moment ago
                found = [file for file in found if WRITING in found or store.fs.isfile(store.path(name, file))]
                if found and WRITING not in found:
                    raise CheckpointError(
                        f"{url} holds objects that no checkpoint manager wrote ({', '.join(found[:3])}): the folder of "
                        "a step is the manager's alone; move them, or give the manager a prefix of its own",
                        file=url,
                    )
                store.note(name, WRITTEN)
                self._mark()

    @property
    def token(self) -> str:
        """What another process passes to :meth:`RemoteStore.stage` to write into this same folder."""
        return self._generation or ""

    def _mark(self) -> None:
        """(Re)write the folder's :data:`WRITING`, naming the files opened so far."""
        self._store.fs.pipe_file(self._store.path(self._name, WRITING), json.dumps({"files": self._written}).encode())

    @contextlib.contextmanager
    def open(self, file: str) -> Iterator[tuple[str, BinaryIO]]:
        """Write ``file``; yields the name it is stored under and a sink to write to."""
        stored = file
        if self._generation is not None:
            stem, dot, extension = file.partition(".")
            stored = f"{stem}.{self._generation}{dot}{extension}"
        self._written.append(stored)
        store = self._store
        url = store.url(self._name, stored)
        if self._own:  # named before it is written: the next writer removes it, listed yet or not, if this one dies
            with storage_errors(url):
                self._mark()
        upload = object_upload(
            store.fs, store.path(self._name, stored), url=url, transfer=store.settings.transfer, whole=False
        )
        self._uploads.append(upload)
        yield stored, upload
        with storage_errors(url):
            upload.finish()

    def complete(self) -> None:
        """Wait until every file opened so far is in the store. Until all are, :meth:`abort` has each to abort: one
        still on its way when another failed lands before the files are removed, not after."""
        for upload in self._uploads:
            with storage_errors(upload.name):
                upload.complete()
        self._uploads = []

    def commit(self, marker: bytes) -> None:
        """Write the marker, which makes the folder visible (and, on replacing, switches to the new files), once the
        store holds every file the marker names: a store that acknowledged a file it did not keep commits nothing."""
        store = self._store
        self.complete()
        with storage_errors(url := store.url(self._name)):
            self._check_kept(_marked_files(marker, where=store.url(self._name, store.marker)))
            if self._generation is not None:  # a replaced folder: its record switches to the new files
                store.fs.pipe_file(store.path(self._name, store.marker), marker)
            elif not create_once(store.fs, store.path(self._name, store.marker), marker):
                self._written, self._own = [], False  # the folder is that writer's: an abort leaves it whole
                raise committed_by_another(url)
        with removing(store.url(self._name)):  # committed: a failure now takes nothing back
            store.note(self._name, COMMITTED)
            if self._own:
                with contextlib.suppress(FileNotFoundError):
                    store.fs.rm(store.path(self._name, WRITING))
            if self._generation is not None:
                keep = {*_marked_files(marker, where=store.url(self._name, store.marker)), store.marker}
                store.fs.invalidate_cache(store.path(self._name))
                for path in store.fs.find(store.path(self._name)):
                    if path.rsplit("/", 1)[-1] not in keep:
                        store.fs.rm(path)

    def _check_kept(self, files: set[str]) -> None:
        """Raise a :class:`StorageError` if the store does not hold one of ``files`` (after a moment's waits).

        One listing of the folder answers for most; each file it does not show is asked for by name, since a store
        may list a new object seconds after it holds it."""
        store, folder, missing = self._store, self._store.path(self._name), sorted(files)
        for attempt in range(3):
            store.fs.invalidate_cache(folder)
            listed = {path.rsplit("/", 1)[-1] for path in store.fs.find(folder)}
            store.fs.invalidate_cache(folder)
            missing = sorted(file for file in files - listed if not store.fs.isfile(store.path(self._name, file)))
            if not missing:
                return
            time.sleep(0.1 * 2**attempt)
        raise StorageError(
            f"the store acknowledged {', '.join(missing)} but does not keep {'them' if len(missing) > 1 else 'it'}: "
            "the folder is not committed",
            file=store.url(self._name, missing[0]),
        )

    def abort(self) -> None:
        """Remove what this write uploaded (joined through another process's token: only its own files).

        A committed folder it was to replace stays as it was.
        """
        uploads, self._uploads, store = self._uploads, [], self._store
        names = [*self._written, *([WRITING] if self._own else [])]  # by name, listed yet or not; its mark last
        with removing(store.url(self._name)):  # the write's own failure is the one raised
            for upload in uploads:
                upload.abort()
            _remove_files(store.fs, [store.path(self._name, name) for name in names])
            if self._own:
                _remove_tree(store.fs, store.path(self._name))
                store.note(self._name, DELETED)


def _a_step_writes(name: str) -> bool:
    """Whether a step's writer could have written the file ``name`` of a step's folder: an item's file, or a
    temporary or marking one (not a file a user put there, such as ``eval_results.json``)."""
    return name.endswith((".safetensors", ".npz", ".jxs")) or TEMPORARY_MARKER in name or name == WRITING
