"""Folders in a local directory, each made visible whole by one atomic rename.

A folder is written under a temporary name that no listing shows, every file and its marker fsynced, then renamed
into place; replacing one swaps the two folders in one step (``renameat2`` with ``RENAME_EXCHANGE``). A crash leaves
the old state or the new one, plus a temporary folder that :func:`remove_leftovers` deletes later.

>>> import os, tempfile
>>> from jaxstow._storage.folders import LocalStore
>>> store = LocalStore(tempfile.mkdtemp(), marker="done.json")
>>> staging = store.stage("1", replace=False)
>>> with staging.open("a.bin") as (stored, sink):
...     _ = sink.write(b"data")
>>> store.committed(), len(os.listdir(store.root))
([], 1)
>>> staging.commit(b'{"files": ["a.bin"]}')
>>> store.committed(), sorted(os.listdir(store.path("1")))
(['1'], ['a.bin', 'done.json'])
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from typing import BinaryIO

from jaxstow._format.source import ReadSource
from jaxstow._storage.atomic import TEMPORARY_MARKER, fsync_directory, rename_durably, temporary_sibling
from jaxstow._storage.background_fsync import FsyncFailed, Fsyncs
from jaxstow._storage.failures import storage_error, storage_failures
from jaxstow._storage.marker_limit import MAX_MARKER_BYTES, refuse_large_marker
from jaxstow._storage.member_names import is_inside
from jaxstow._storage.sources import LocalFile
from jaxstow.errors import CheckpointError, NotAFolderError, PathError, PathNotFoundError

__all__ = ["LocalStaging", "LocalStore", "make_folder", "remove_leftovers"]

logger = logging.getLogger("jaxstow.storage")
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_WRITE_BUFFER = 1 << 20


def remove_leftovers(directory: str) -> list[str]:
    """Delete the temporary files and folders that interrupted writes left in ``directory``; returns their names.

    Only the directory's writer may call this (it holds the lock): the temporary names of a live write look the same.
    """
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return []
    removed = []
    for entry in entries:
        if TEMPORARY_MARKER in entry.name:
            try:
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
            except OSError as error:  # harmless where it is (no listing shows it): no reason to refuse to save
                logger.warning("%s", storage_error(error, entry.path, doing="delete this leftover of a save"))
                continue
            removed.append(entry.name)
    return removed


def _remove_folder(path: str) -> None:
    """Delete the folder at ``path``; one that is a link (a step archived elsewhere) loses its link, never what it
    points to."""
    if os.path.islink(path):
        os.unlink(path)
    else:
        shutil.rmtree(path)


def _exchange(first: str, second: str) -> None:
    """Swap two paths atomically (Linux ``renameat2``); a clear error where the system cannot."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        raise CheckpointError(f"cannot replace {second} atomically: this system has no renameat2(RENAME_EXCHANGE)")
    result = renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE)
    if result != 0:
        code = ctypes.get_errno()
        raise CheckpointError(f"cannot replace {second} atomically with {first}: {os.strerror(code)}")


def _check_free(final: str, url: str, *, marker: str) -> None:
    """Refuse to write a new folder ``final`` where something uncommitted already is: a folder without its
    ``marker`` (a copy cut short, files put there by hand) that the commit's rename cannot replace, or a file."""
    try:
        found = sorted(os.listdir(final))
    except FileNotFoundError:
        return
    except NotADirectoryError:
        raise NotAFolderError("is a file where this folder is to be written: move it away", file=url) from None
    except OSError as error:
        raise storage_error(error, final, doing="look at it") from error
    if found:
        raise CheckpointError(
            f"{url} holds {', '.join(found[:3])}{', ...' * (len(found) > 3)} but no {marker}, so it is not committed "
            "(a copy cut short, files put there by hand), and this write would mix its files with those: move it "
            "away or delete it, then save again",
            file=url,
        )


def make_folder(root: str) -> None:
    """Create the folder ``root`` and its parents; a file in its place raises a NotAFolderError, a folder that cannot
    be made (no space, no permission) a StorageError."""
    try:
        os.makedirs(root, exist_ok=True)
    except FileExistsError:
        raise NotAFolderError("is a file, not a folder for checkpoints", file=root) from None
    except NotADirectoryError:
        raise NotAFolderError("cannot be a folder: a part of its path is a file", file=root) from None
    except OSError as error:
        raise storage_error(error, root, doing="make the folder") from error


def _may_hold(marker: str) -> bool:
    """Whether the file ``marker`` is there, or may be: its folder cannot be looked into (no permission), or the disk
    fails; reading it then says which. Only a file found missing is not there."""
    try:
        return stat.S_ISREG(os.stat(marker).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError:
        return True


def _may_be_folder(entry: os.DirEntry[str]) -> bool:
    """Whether ``entry`` is a folder, or may be: a link that cannot be followed (a loop of links) is one reading
    says why, where leaving it out would make the folder before it the latest without a word."""
    try:
        return entry.is_dir()
    except OSError:
        return True


class LocalStore:
    """Folders in the local directory ``root``, each committed by one rename once its ``marker`` file is written."""

    def __init__(self, root: str, *, marker: str) -> None:
        self.root = os.path.abspath(root)  # once: a later change of the working directory leads nowhere else
        self.location = root
        self.identity = os.path.realpath(self.root)
        self.marker = marker

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def url(self, *parts: str) -> str:
        """The path of ``parts`` under the root as it was given, for messages."""
        return os.path.join(self.location, *parts)

    def ensure(self) -> None:
        """Create the folder (:func:`make_folder`)."""
        make_folder(self.root)

    def committed(self) -> list[str]:
        """Names of the committed folders: not temporary, and holding their marker, or a folder that cannot be looked
        into (no permission): whether it holds its marker is unknown, and reading it says why, where leaving it out
        would make the folder before it the latest without a word."""
        entries = self._entries()
        return sorted(
            entry.name
            for entry in entries
            if TEMPORARY_MARKER not in entry.name
            and _may_be_folder(entry)
            and _may_hold(os.path.join(entry.path, self.marker))
        )

    def read_marker(self, name: str) -> bytes:
        """The marker of folder ``name``, refused unread where it is too large (:mod:`~jaxstow._storage.marker_limit`)."""
        path = self.path(name, self.marker)
        with storage_failures(path, doing="read it"), open(path, "rb") as file:
            refuse_large_marker(os.fstat(file.fileno()).st_size, self.url(name, self.marker))
            data = file.read(MAX_MARKER_BYTES + 1)  # grown since: read no more than the limit, and refuse it
        refuse_large_marker(len(data), self.url(name, self.marker))
        return data

    def source(self, name: str, file: str, header: str | None = None, *, whole: bool = False) -> ReadSource:
        """The file ``file`` of folder ``name``.

        ``header``, its expected header checksum, is for caches of remote files, and ``whole`` for objects in a store:
        a local file is read where it is.
        """
        del header, whole
        real_folder, resolved = os.path.realpath(self.path(name)), os.path.realpath(self.path(name, file))
        if not is_inside(resolved, real_folder):
            raise PathError(
                f"is a link to {resolved}, outside the step's folder: a step's files are read only within it (a step "
                "folder that is a link is read where it leads); copy the file into the step's folder if you trust it",
                file=self.url(name, file),
            )
        return LocalFile(resolved, name=self.url(name, file), follow=False)

    def stage(self, name: str, *, replace: bool, token: str | None = None) -> LocalStaging:
        """Start writing folder ``name`` under a temporary name.

        ``replace`` swaps it with the committed one. With the ``token`` of another process's staging, write into that
        same folder.
        """
        return LocalStaging(self, name, replace=replace, token=token)

    def delete(self, name: str) -> None:
        """Delete a committed folder: renamed to a temporary name first, so that no one sees it half deleted.

        A folder that is a link (a step archived elsewhere and linked back) loses its link; what it points to stays.
        """
        doomed = temporary_sibling(self.path(name))
        with storage_failures(self.path(name), doing="delete it"):
            os.rename(self.path(name), doomed)
            fsync_directory(self.root)
        with storage_failures(doomed, doing="delete it (a folder deleted, its files left under a temporary name)"):
            _remove_folder(doomed)

    def files(self) -> list[str]:
        """The names of the files directly in the root (not temporary ones, not hidden ones such as the lock)."""
        return sorted(entry.name for entry in self._entries() if entry.is_file() and not entry.name.startswith("."))

    def remove(self, name: str) -> None:
        """Delete the file ``name`` directly in the root."""
        with storage_failures(self.path(name), doing="delete it"):
            os.remove(self.path(name))

    def _entries(self) -> list[os.DirEntry[str]]:
        """What the root holds; nothing if it does not exist."""
        try:
            return list(os.scandir(self.root))
        except FileNotFoundError:
            return []
        except NotADirectoryError:
            if not os.path.isfile(self.root):
                raise NotAFolderError("cannot be a folder: a part of its path is a file", file=self.location) from None
            raise NotAFolderError(
                "is a file, not a folder for checkpoints: give a folder (jaxstow.load reads a file)", file=self.location
            ) from None
        except OSError as error:
            raise storage_error(error, self.root, doing="list the folder") from error

    def cleanup(self, owns: Callable[[str], bool]) -> list[str]:
        """Remove temporary leftovers. Committed folders appear by rename only, so ``owns`` has nothing to add here."""
        del owns
        return remove_leftovers(self.root)


class LocalStaging:
    """A folder being written under a temporary name; :meth:`commit` renames it into place.

    Files in it are written in place and fsynced (each in the background while the next is written, all before the
    commit); the folder itself is fsynced once, at commit, before the rename.
    """

    def __init__(self, store: LocalStore, name: str, *, replace: bool, token: str | None = None) -> None:
        self._store = store
        self._final = store.path(name)
        self._replace = replace
        self._joined = token is not None
        self._written: list[str] = []
        self._fsyncs = Fsyncs()
        if token is None:
            if not replace:
                _check_free(self._final, store.url(name), marker=store.marker)
            self._temporary = temporary_sibling(self._final)
            with self._failures(self._final):
                os.mkdir(self._temporary)
        else:  # another process made it
            self._temporary = os.path.join(store.root, os.path.basename(token))
            if not os.path.isdir(self._temporary):
                raise CheckpointError(f"the folder {self._temporary} that process 0 made for step {name} is not here")

    @property
    def token(self) -> str:
        """What another process passes to :meth:`LocalStore.stage` to write into this same folder."""
        return os.path.basename(self._temporary)

    @contextlib.contextmanager
    def open(self, file: str) -> Iterator[tuple[str, BinaryIO]]:
        """Write ``file``; yields the name it is stored under and a sink. Once the block ends the file is fsynced and
        closed in the background while the next is written (:mod:`~jaxstow._storage.background_fsync`);
        :meth:`complete` and :meth:`commit` wait for that.

        An ``OSError`` (of the block's writes and of the fsync too) becomes a :class:`~jaxstow.errors.StorageError`
        naming the file in the folder's final place, not in the temporary one.
        """
        self._written.append(file)
        final = os.path.join(self._final, file)
        with self._failures(final):
            sink = open(os.path.join(self._temporary, file), "xb", buffering=_WRITE_BUFFER)  # noqa: SIM115
            try:
                yield file, sink
                sink.flush()
            except BaseException:
                sink.close()
                raise
        try:
            self._fsyncs.hand_over(sink, final)
        except BaseException:  # interrupted waiting for the oldest file in flight: this one was not handed over
            sink.close()
            raise

    def complete(self) -> None:
        """Wait until every file written is fsynced and closed; a failure is a StorageError naming its file."""
        try:
            self._fsyncs.wait()
        except FsyncFailed as failed:
            with self._failures(failed.name):
                raise failed.error from None

    def commit(self, marker: bytes) -> None:
        """Write the marker, then make the folder visible (or swap it with the one it replaces) in one rename.

        Where the root cannot be fsynced after the rename (an I/O error), the rename is undone before the error is
        raised: a commit that failed leaves the folder that was there before, as the error says.
        """
        with self.open(self._store.marker) as (_, sink):
            sink.write(marker)
        self.complete()
        with self._failures(self._final):
            fsync_directory(self._temporary)
            if not self._replace:
                rename_durably(self._temporary, self._final)
                return
            _exchange(self._temporary, self._final)
            try:
                fsync_directory(self._store.root)
            except BaseException:
                with contextlib.suppress(OSError, CheckpointError):  # swapped back; the error raised is the fsync's
                    _exchange(self._temporary, self._final)
                raise
            _remove_folder(self._temporary)  # now the replaced folder

    @contextlib.contextmanager
    def _failures(self, target: str) -> Iterator[None]:
        """:func:`storage_failures` naming ``target``; where the root was deleted (or moved) meanwhile, it says so."""
        try:
            with storage_failures(target):
                yield
        except PathNotFoundError:
            if os.path.isdir(self._store.root):
                raise
            raise PathNotFoundError(
                f"cannot write it: the folder {self._store.location} is gone, deleted or moved after its writer took "
                "the lock in it (which went with it); nothing of this save is there. Close the writer (a "
                "CheckpointManager) and open a new one, which makes the folder again and takes its lock, or save "
                "elsewhere",
                file=self._store.url(os.path.basename(self._final)),
            ) from None

    def abort(self) -> None:
        """Remove the temporary folder (joined through another process's token: only this one's files).

        Nothing committed is touched.
        """
        with contextlib.suppress(FsyncFailed):
            self._fsyncs.wait()  # every file closed first
        if not self._joined:
            shutil.rmtree(self._temporary, ignore_errors=True)
            return
        for file in self._written:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self._temporary, file))
