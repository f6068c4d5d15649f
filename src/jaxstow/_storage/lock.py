"""One writer per checkpoint directory: a lock file that names the writing process and its host.

Locally the lock is an ``flock`` on ``<directory>/.jaxstow.lock``. The kernel releases it when its process ends, however
it ends, so the lock of a killed writer is free at once: the next writer takes the file over (and says so in the log).
Object stores have no such lock: the lock object is created only if absent, and one that names a process of this host
that no longer runs is taken over. A lock held by a live writer gives a :class:`~jaxstow.errors.CheckpointError`
naming it.

>>> import tempfile, jaxstow
>>> from jaxstow._storage.lock import LocalLock
>>> directory = tempfile.mkdtemp()
>>> lock = LocalLock(directory)
>>> try:
...     LocalLock(directory)
... except jaxstow.errors.CheckpointError as error:
...     print(str(error).split(";")[0])
/... is being written by another checkpoint manager (process ... on host ... since ...)
>>> lock.release()
>>> LocalLock(directory).release()
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import logging
import os
import secrets
import socket
import weakref
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Protocol

from jaxstow._storage.folders import LocalStore
from jaxstow._storage.store import Store
from jaxstow.errors import CheckpointError

if TYPE_CHECKING:
    from jaxstow._storage.remote_store import RemoteStore

__all__ = ["LOCK_NAME", "Holder", "LocalLock", "Lock", "RemoteLock", "lock_store"]

logger = logging.getLogger(__name__)

#: The lock file's name in a checkpoint directory.
LOCK_NAME = ".jaxstow.lock"


@dataclass(frozen=True)
class Holder:
    """Who holds a lock: process id, host name, since when, and a token that tells two holders apart."""

    pid: int
    host: str
    since: str
    token: str

    @classmethod
    def me(cls) -> Holder:
        now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        return cls(os.getpid(), socket.gethostname(), now, secrets.token_hex(8))

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def parse(cls, data: bytes) -> Holder | None:
        """The holder a lock file names; ``None`` for an empty or unreadable one."""
        try:
            fields = json.loads(data)
            return cls(int(fields["pid"]), str(fields["host"]), str(fields["since"]), str(fields["token"]))
        except (ValueError, KeyError, TypeError):
            return None

    def describe(self) -> str:
        return f"process {self.pid} on host {self.host} since {self.since}"

    def is_gone(self) -> bool:
        """Whether the holder is a process of this host that no longer runs."""
        if self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


def _held_error(location: str, holder: Holder | None, hint: str) -> CheckpointError:
    who = holder.describe() if holder is not None else "a process whose lock file cannot be read"
    return CheckpointError(
        f"{location} is being written by another checkpoint manager ({who}); only one writer may use a checkpoint "
        f"directory at a time. {hint}"
    )


class Lock(Protocol):
    def release(self) -> None: ...


class LocalLock:
    """The ``flock`` of a local directory's lock file, held until :meth:`release` or until this object is collected."""

    def __init__(self, directory: str) -> None:
        path = os.path.join(directory, LOCK_NAME)
        while True:
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = Holder.parse(_read(descriptor))
                os.close(descriptor)
                raise _held_error(directory, holder, "Close the other manager first; reading needs no lock.") from None
            if _is_current(descriptor, path):
                break
            os.close(descriptor)  # a writer released and removed the file while it was being opened: try again
        previous = Holder.parse(_read(descriptor))
        if previous is not None:
            logger.warning(
                "%s: taking over the lock of %s, which ended without releasing it", directory, previous.describe()
            )
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, Holder.me().to_json(), 0)
        os.fsync(descriptor)
        self._release = weakref.finalize(self, _release_local, descriptor, path)

    def release(self) -> None:
        """Remove the lock file and release the lock (idempotent)."""
        self._release()


def _read(descriptor: int) -> bytes:
    return os.pread(descriptor, 1 << 16, 0)


def _is_current(descriptor: int, path: str) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(descriptor).st_ino
    except (FileNotFoundError, NotADirectoryError):  # the file, or its folder, is gone
        return False


def _release_local(descriptor: int, path: str) -> None:
    if _is_current(descriptor, path):
        os.unlink(path)
    os.close(descriptor)


class RemoteLock:
    """The lock object of a directory on an object store, created only if absent."""

    def __init__(self, store: RemoteStore) -> None:
        self._fs = store.fs
        self._path = store.path(LOCK_NAME)
        self._holder = Holder.me()
        hint = f"If that writer is gone, delete {store.url(LOCK_NAME)}."
        if self._fs.exists(self._path):
            self._take_over(store.location, hint)
            return
        try:
            with self._fs.open(self._path, "xb") as sink:  # a conditional PUT on S3: fails if another writer won
                sink.write(self._holder.to_json())
        except OSError:
            if not self._fs.exists(self._path):
                raise
            raise _held_error(store.location, Holder.parse(self._fs.cat_file(self._path)), hint) from None

    def _take_over(self, location: str, hint: str) -> None:
        previous = Holder.parse(self._fs.cat_file(self._path))
        if previous is None or not previous.is_gone():
            raise _held_error(location, previous, hint)
        logger.warning("%s: taking over the lock of %s, which no longer runs", location, previous.describe())
        self._fs.pipe_file(self._path, self._holder.to_json())

    def release(self) -> None:
        """Delete the lock object if it is still this one's (idempotent)."""
        with contextlib.suppress(FileNotFoundError):
            if Holder.parse(self._fs.cat_file(self._path)) == self._holder:
                self._fs.rm(self._path)


def lock_store(store: Store) -> Lock:
    """Take the writer's lock of a store's directory, creating the directory if needed."""
    store.ensure()
    if isinstance(store, LocalStore):
        return LocalLock(store.root)
    from jaxstow._storage.remote_store import RemoteStore  # loaded already: the store is one

    if isinstance(store, RemoteStore):
        return RemoteLock(store)
    raise TypeError(f"no lock for a store of type {type(store).__name__}")
