"""Where a checkpoint directory lives: one interface over local folders and fsspec URLs.

A *store* holds named folders; a folder is *committed* once its marker is written, and only committed folders are
listed. Locally a folder becomes visible by one atomic rename (:mod:`jaxstow._storage.folders`); on object stores by
its marker, written last (:mod:`jaxstow._storage.remote_store`).

>>> from jaxstow._storage.store import open_store
>>> type(open_store("runs/a", marker="m.json")).__name__, type(open_store("memory://runs/a", marker="m.json")).__name__
('LocalStore', 'RemoteStore')
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import BinaryIO, Protocol

from jaxstow._format.source import ReadSource
from jaxstow._storage.folders import LocalStore
from jaxstow._storage.opening import local_path, refuse_options
from jaxstow._storage.settings import StorageSettings
from jaxstow.errors import ArgumentError, excerpt

__all__ = ["Staging", "Store", "open_store"]


class Staging(Protocol):
    """A folder being written; invisible until :meth:`commit`."""

    def open(self, file: str) -> AbstractContextManager[tuple[str, BinaryIO]]:
        """Write ``file``; yields the name it is stored under and a sink."""
        ...

    def complete(self) -> None:
        """Wait until every file written so far is stored (uploads finish in the background)."""
        ...

    def commit(self, marker: bytes) -> None:
        """Write the marker, a JSON object whose ``"files"`` lists the stored files; the folder becomes visible."""
        ...

    def abort(self) -> None:
        """Remove what was written; committed folders stay as they were."""
        ...

    @property
    def token(self) -> str:
        """What another process passes to :meth:`Store.stage` to write into this same folder."""
        ...


class Store(Protocol):
    """Named folders, each committed by its marker."""

    location: str
    #: The same in every process that names the folder, however each spells it: what processes agree on it by.
    identity: str
    marker: str

    def url(self, *parts: str) -> str: ...

    def ensure(self) -> None: ...

    def committed(self) -> list[str]: ...

    def read_marker(self, name: str) -> bytes: ...

    def source(self, name: str, file: str, header: str | None = None, *, whole: bool = False) -> ReadSource:
        """The file ``file`` of folder ``name``, its header checksum ``header`` if known; ``whole``: it is to be read
        from its start on."""
        ...

    def stage(self, name: str, *, replace: bool, token: str | None = None) -> Staging: ...

    def delete(self, name: str) -> None: ...

    def files(self) -> list[str]:
        """The names of the files directly in the root (not temporary ones, not the lock)."""
        ...

    def remove(self, name: str) -> None:
        """Delete the file ``name`` directly in the root."""
        ...

    def cleanup(self, owns: Callable[[str], bool]) -> list[str]: ...


def open_store(directory: str | os.PathLike[str], *, marker: str, settings: StorageSettings | None = None) -> Store:
    """The store for a local path, a ``file://`` URL or any other fsspec URL (reached as ``settings`` say).

    A local store keeps to the folder a relative path named when it was opened, whatever working directory the
    process changes to later.
    """
    if not isinstance(directory, str | os.PathLike):
        raise ArgumentError(f"a checkpoint folder is named by a path or a URL, not {excerpt(directory)}")
    settings = settings or StorageSettings()
    path = local_path(directory)
    if path is not None:
        refuse_options(path, settings)
        return LocalStore(path, marker=marker)
    from jaxstow._storage.remote_store import RemoteStore

    return RemoteStore(os.fspath(directory), marker=marker, settings=settings)
