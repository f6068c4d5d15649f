"""Local copies of files read from URLs (``cache_dir=``), read from the local disk while their header matches.

A copy is used when its header checksum (which covers every leaf's) is the one a checkpoint's record names, or, for a
single file, the one of the header read from the store; otherwise the file is fetched again by ranged requests,
under a temporary name renamed into place. Files without a jaxstow header (plain safetensors, npz) have nothing to
check a copy against and are read from the store. See docs/object-storage.md.

>>> import os, tempfile, jaxstow, numpy as np
>>> cache = tempfile.mkdtemp()
>>> jaxstow.save("memory://jaxstow-doc/cache/w.jxs", {"w": np.arange(3)})
>>> jaxstow.load("memory://jaxstow-doc/cache/w.jxs", cache_dir=cache, as_numpy=True)
{'w': array([0, 1, 2])}
>>> os.listdir(os.path.join(cache, "memory", "jaxstow-doc", "cache"))
['w.jxs']
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable

import numpy as np

from jaxstow._format.header_checksum import header_checksum
from jaxstow._format.source import ReadSource
from jaxstow._format.tensor_reads import run_all
from jaxstow._storage.atomic import remove_dead_leftovers, temporary_sibling
from jaxstow._storage.failures import storage_failures
from jaxstow._storage.sources import LocalFile
from jaxstow.errors import CorruptFileError, FormatError, PathError, StorageError

__all__ = ["CachedCopy", "cache_path", "cached_source"]

logger = logging.getLogger(__name__)


class CachedCopy(LocalFile):
    """The local copy of a remote file, matched to it by its header: a leaf found damaged in it is the copy's damage
    (the disk's, or a hand's), not the store's, and :meth:`evict` lets the file be fetched again, which
    :meth:`fetched_again` does (``fetch()``, given by :func:`cached_source`)."""

    def __init__(self, path: str, fetch: Callable[[], ReadSource]) -> None:
        super().__init__(path)
        self._fetch = fetch
        self._replaced: list[ReadSource] = []

    def evict(self) -> None:
        """Remove the copy: the next read of the file fetches it again."""
        logger.warning("the copy of a file at %s was found damaged: it is fetched again from the store", self.name)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.name)

    def fetched_again(self) -> ReadSource:
        """Remove the copy and fetch the file again: its new copy (its header checksum the same as this one's), which
        closes this one when it closes (a read of another thread may still be on this one)."""
        self.evict()
        again = self._fetch()
        if isinstance(again, CachedCopy):
            again._replaced.append(self)
        return again

    def close(self) -> None:
        for replaced in self._replaced:
            replaced.close()
        super().close()


def cache_path(cache_dir: str, url: str) -> str:
    """Where the copy of ``url`` is kept under ``cache_dir``: its scheme, then its path (no ``..`` climbs out).

    >>> cache_path("/cache", "s3://bucket/runs/../a/model.jxs")
    '/cache/s3/bucket/runs/a/model.jxs'
    """
    scheme, _, rest = url.partition("://")
    parts = [part for part in rest.split("/") if part not in ("", ".", "..")]
    return os.path.join(cache_dir, scheme or "file", *parts)


def cached_source(
    cache_dir: str, url: str, open_remote: Callable[[], ReadSource], expected: str | None = None
) -> ReadSource:
    """The local copy of ``url``, fetched into the cache first unless its header checksum matches.

    It must match ``expected``, or without ``expected`` the one of the file in the store. ``open_remote()`` opens the
    file in the store.
    """
    path = cache_path(cache_dir, url)
    if expected is not None and _checksum_of(path) == expected:
        return CachedCopy(path, functools.partial(cached_source, cache_dir, url, open_remote, expected))
    remote = open_remote()
    if expected is None:
        try:
            expected = header_checksum(remote)
        except FormatError:  # not a jaxstow file: nothing to check a copy against, so it is read from the store
            return remote
        except BaseException:
            remote.close()
            raise
    try:
        if _checksum_of(path) != expected:
            _fetch(remote, path)
    finally:
        remote.close()
    found = _checksum_of(path)
    if found != expected:
        raise CorruptFileError(
            f"the copy fetched from {url} has the header checksum {found}, not {expected}: the file in the store is "
            "not the one expected",
            file=path,
        )
    return CachedCopy(path, functools.partial(cached_source, cache_dir, url, open_remote, expected))


def _checksum_of(path: str) -> str | None:
    """The header checksum of the local file at ``path``; ``None`` if there is none, or no valid header."""
    try:
        local = LocalFile(path)
    except (PathError, StorageError):  # none there, or one that cannot be read: fetched again
        return None
    try:
        return header_checksum(local)
    except FormatError:
        return None
    finally:
        local.close()


def _fetch(remote: ReadSource, path: str) -> None:
    """Copy ``remote`` to ``path``.

    Ranged reads on the source's pool, each written at its offset, under a temporary name renamed into place once
    complete.
    """
    with storage_failures(path, doing=f"keep a copy of {remote.name} in the cache"):
        _fetch_into(remote, path)
    logger.info("kept a copy of %s at %s (%d bytes)", remote.name, path, remote.size)


def _fetch_into(remote: ReadSource, path: str) -> None:
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    remove_dead_leftovers(folder)
    temporary = temporary_sibling(path)
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.ftruncate(descriptor, remote.size)
        plan = remote.parallel
        piece = plan.piece if plan is not None else 16 << 20
        jobs = [
            functools.partial(_copy, remote, descriptor, at, min(piece, remote.size - at))
            for at in range(0, remote.size, piece)
        ]
        if plan is not None:
            run_all(plan.pool(), jobs)
        else:
            for job in jobs:
                job()
        os.close(descriptor)
        descriptor = -1
        os.replace(temporary, path)
    except BaseException:
        if descriptor >= 0:
            os.close(descriptor)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def _copy(remote: ReadSource, descriptor: int, offset: int, length: int) -> None:
    buffer = np.empty(length, np.uint8)
    remote.read_into(offset, buffer.data)
    done = 0
    while done < length:
        done += os.pwrite(descriptor, buffer.data[done:], offset + done)
