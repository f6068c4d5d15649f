"""One writer at a time: a lock file that names the writing process and its host.

:class:`FileLock` is an ``flock`` on a lock file that names its holder; the kernel releases it when its process ends,
however it ends, and the file left says who was killed (:attr:`FileLock.found`). The checkpoint writer
(:class:`LocalLock`) and the HDF5 writers hold it. On object stores the lock object is created only if absent, and
one naming a dead process of this host, or a manager of this process closed since, is taken over. A live writer's
lock gives a :class:`~jaxstow.errors.CheckpointError` naming it.

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
import fcntl
import functools
import logging
import os
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from jaxstow._storage import lock_lease
from jaxstow._storage.failures import storage_failures
from jaxstow._storage.folders import LocalStore
from jaxstow._storage.lock_file import open_lock_file
from jaxstow._storage.lock_holder import Holder
from jaxstow._storage.remote import storage_errors
from jaxstow._storage.small_reads import read_small
from jaxstow._storage.store import Store
from jaxstow.errors import CheckpointError, JaxstowError

if TYPE_CHECKING:
    from jaxstow._storage.remote_store import RemoteStore

__all__ = ["LOCK_NAME", "FileLock", "Holder", "LocalLock", "Lock", "RemoteLock", "lock_store"]

logger = logging.getLogger(__name__)

#: The lock file's name in a checkpoint directory.
LOCK_NAME = ".jaxstow.lock"

#: The tokens of the remote locks this process holds or is taking: a lock object naming this process with any other
#: token is a leftover of one of its managers (closed, its lock object's deletion failed), and is taken over.
_HELD_HERE: set[str] = set()


def _held_error(location: str, holder: Holder | None, hint: str) -> CheckpointError:
    who = holder.describe() if holder is not None else "a process whose lock file cannot be read"
    return CheckpointError(
        f"{location} is being written by another checkpoint manager ({who}); only one writer may use a checkpoint "
        f"directory at a time. {hint}"
    )


class Lock(Protocol):
    def check_held(self) -> None: ...
    def release(self) -> None: ...


class FileLock:
    """The exclusive ``flock`` of the lock file at ``path``, which names this process while it holds it.

    Held until :meth:`release` or until this object is collected.

    A lock held by another process raises what ``held(holder)`` makes of the holder its file names (``None`` when
    the file cannot be read). A lock file found when the lock is taken was left by a holder that ended without
    releasing it: its bytes are :attr:`found` (empty when there was none). ``release_at_exit=False`` leaves the lock
    file of a lock still held when the interpreter exits, so that the next holder learns this one never released it.
    A lock file that cannot be written (a read-only folder, a full disk) raises a
    :class:`~jaxstow.errors.StorageError` naming ``of``, the file or folder whose writer the lock keeps out (by
    default the lock file).
    """

    def __init__(
        self,
        path: str,
        held: Callable[[Holder | None], JaxstowError],
        *,
        release_at_exit: bool = True,
        of: str | None = None,
    ) -> None:
        with storage_failures(of or path, doing=f"take the writer's lock {path}" if of else "take the lock"):
            descriptor = _take(path, held)
            self._inode = os.fstat(descriptor).st_ino
            try:
                #: The lock file's bytes as found: what a holder that ended without releasing the lock left (or a copy
                #: of another folder's lock file).
                self.found = _read(descriptor)
                os.ftruncate(descriptor, 0)
                os.pwrite(descriptor, Holder.me(self._inode).to_json(), 0)
                os.fsync(descriptor)
            except BaseException:  # a full disk: the lock file is left as it was found (or removed, if new)
                _give_up(descriptor, path, getattr(self, "found", b""))
                raise
        self.path = path
        self._release = weakref.finalize(self, _release_local, descriptor, path, os.getpid())
        self._release.atexit = release_at_exit

    @property
    def previous(self) -> Holder | None:
        """The holder that ended without releasing the lock, if its lock file names one; ``None`` for a lock file
        copied from another folder, whose holder never held this one."""
        holder = Holder.parse(self.found)
        return None if holder is not None and holder.inode not in (0, self._inode) else holder

    def abandon(self) -> None:
        """Release the lock, leaving its file naming this holder, as a holder that ended without releasing it leaves
        it (idempotent)."""
        detached = self._release.detach()
        if detached is not None:
            os.close(detached[2][0])

    def release(self, *, as_found: bool = False) -> None:
        """Remove the lock file and release the lock (idempotent).

        ``as_found``: put back the lock file that was found instead, if there was one, for a holder that gives up before
        it changed anything.
        """
        if not as_found or not self.found:
            self._release()
            return
        detached = self._release.detach()
        if detached is not None:
            descriptor = detached[2][0]
            try:
                os.ftruncate(descriptor, 0)
                os.pwrite(descriptor, self.found, 0)
            finally:
                os.close(descriptor)


def _take(path: str, held: Callable[[Holder | None], JaxstowError]) -> int:
    """The descriptor of the lock file at ``path``, locked; a lock held by another process raises ``held(holder)``."""
    while True:
        descriptor = open_lock_file(path)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = Holder.parse(_read(descriptor))
            os.close(descriptor)
            raise held(holder) from None
        if _is_current(descriptor, path):
            return descriptor
        os.close(descriptor)  # a holder released and removed the file while it was being opened: try again


class LocalLock:
    """The :class:`FileLock` of a local checkpoint directory.

    Held until :meth:`release` or until this object is collected; the lock of a writer that ended without releasing it
    is taken over, with a warning in the log.
    """

    def __init__(self, directory: str) -> None:
        def held(holder: Holder | None) -> JaxstowError:
            return _held_error(directory, holder, "Close the other manager first; reading needs no lock.")

        self._lock = FileLock(os.path.join(directory, LOCK_NAME), held, of=directory)
        previous = self._lock.previous
        if previous is not None:
            logger.warning(
                "%s: taking over the lock of %s, which ended without releasing it", directory, previous.describe()
            )

    def check_held(self) -> None:
        """Nothing: the kernel holds a local lock for as long as this process runs."""

    def release(self) -> None:
        """Remove the lock file and release the lock (idempotent)."""
        self._lock.release()


def _read(descriptor: int) -> bytes:
    return os.pread(descriptor, 1 << 16, 0)


def _is_current(descriptor: int, path: str) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(descriptor).st_ino
    except (FileNotFoundError, NotADirectoryError):  # the file, or its folder, is gone
        return False


def _give_up(descriptor: int, path: str, found: bytes) -> None:
    if not found:
        _release_local(descriptor, path)
        return
    with contextlib.suppress(OSError):
        os.pwrite(descriptor, found, 0)
    os.close(descriptor)


def _release_local(descriptor: int, path: str, owner: int | None = None) -> None:
    """Remove the lock file and release the lock; a file that cannot be removed (a folder made read-only) stays, and
    the next holder takes it over as a dead holder's. A process forked from the ``owner`` that took it (which inherits
    the object) only closes its copy of the descriptor: the lock stays its parent's."""
    try:
        if (owner is None or owner == os.getpid()) and _is_current(descriptor, path):
            os.unlink(path)
    except OSError as error:
        logger.warning("%s: the lock is released, but its file stays: %s", path, error.strerror or error)
    finally:
        os.close(descriptor)


class RemoteLock:
    """The lock object of a directory on an object store, created only if absent (on a store that cannot, such as
    fsspec 2024.2's memory store: written, then read back).

    The lock of a dead holder is taken over only if it is still that holder's: on S3 by a PUT conditional on its ETag
    (``If-Match``), so that of writers taking it over at once, one wins; elsewhere by a PUT read back. What the store
    refuses is a :class:`~jaxstow.errors.StorageError` naming the lock object.
    """

    def __init__(self, store: RemoteStore) -> None:
        self._store = store
        self._fs = store.fs
        self._path = store.path(LOCK_NAME)
        self._url = store.url(LOCK_NAME)
        self._read = functools.partial(
            read_small, self._fs, self._path, url=self._url, transfer=store.settings.transfer
        )
        self._holder = Holder.me(lease=lock_lease.LEASE_SECONDS)
        hint = (
            f"If that writer is gone, delete {self._url}; a lock whose holder renews it no more is taken over after "
            "one and a half of its lease"
        )
        _HELD_HERE.add(self._holder.token)  # before the lock object names it
        try:
            with storage_errors(self._url):
                self._take(store.location, hint)
        except BaseException:
            _HELD_HERE.discard(self._holder.token)
            raise
        renew = functools.partial(_renew_remote, store, self._read, self._holder)
        withdraw = functools.partial(_delete_if_held, self._read, self._fs, self._path, self._holder)
        self._renewal = lock_lease.Renewal(renew, self._holder.lease, withdraw)
        # Released when this object goes, or when the program ends without close(): else the next run, on any host,
        # would be refused until someone deleted the lock object, or waited out its lease.
        self._finalizer = weakref.finalize(
            self, _release_remote, self._read, self._fs, self._path, self._url, self._holder, self._renewal.stop
        )
        if not self._renewal.start():
            logger.warning("%s: the lock is not renewed (no thread can start now)", self._url)

    def _take(self, location: str, hint: str) -> None:
        self._fs.invalidate_cache(self._path)  # a listing of the directory made before may not show the lock object
        if self._fs.exists(self._path):
            with contextlib.suppress(FileNotFoundError):  # released meanwhile: then created below
                self._take_over(location, hint)
                return
        try:
            with self._fs.open(self._path, "xb") as sink:  # a conditional PUT on S3: fails if another writer won
                sink.write(self._holder.to_json())
        except ValueError:  # a store that cannot create only if absent (fsspec 2024.2's memory store)
            self._write_and_read_back(location, hint)
        except OSError as error:
            self._fs.invalidate_cache(self._path)
            try:
                holder = Holder.parse(_read_again(self._read))
            except FileNotFoundError:
                raise error from None
            if self._holder.same(holder):  # this attempt's own PUT, sent again by the client after its answer was lost
                return
            raise _held_error(location, holder, hint) from None

    def _take_over(self, location: str, hint: str) -> None:
        from jaxstow._storage.s3 import is_s3

        s3 = is_s3(self._fs)
        found, etag = _s3_read(self._store, self._path) if s3 else (self._read(), None)
        previous = Holder.parse(found)
        left_here = previous is not None and previous.is_me() and previous.token not in _HELD_HERE
        how = "a closed manager of this process left" if left_here else "no longer runs"
        if previous is None or not (left_here or previous.is_gone()):
            if previous is None or not previous.lease or previous.seen_from_here():  # alive, as this host tells
                raise _held_error(location, previous, hint)
            look = functools.partial(_s3_bytes, self._store, self._path) if s3 else self._read
            logger.warning(
                "%s: the lock of %s, whose host cannot tell here whether it runs: waiting up to %g s for its holder "
                "to renew it, before taking it over",
                location,
                previous.describe(),
                1.5 * previous.lease,
            )
            if not lock_lease.lease_expired(look, previous.lease):  # another host's: watched for its renewals
                raise _held_error(location, Holder.parse(look()), hint)
            found, etag = _s3_read(self._store, self._path) if s3 else (self._read(), None)
            if not previous.same(Holder.parse(found)):
                raise _held_error(location, Holder.parse(found), hint)
            how = f"renewed it in none of {1.5 * previous.lease:g} s (its lease: {previous.lease:g} s)"
        logger.warning("%s: taking over the lock of %s, which %s", location, previous.describe(), how)
        if s3 and etag is not None:
            _s3_replace(self._store, self._path, self._holder.to_json(), etag)
            self._check_mine(location, hint)
        else:
            self._write_and_read_back(location, hint)

    def _write_and_read_back(self, location: str, hint: str) -> None:
        """Write the lock object, then read it back: another writer's, written meanwhile, is an error."""
        self._fs.pipe_file(self._path, self._holder.to_json())
        self._check_mine(location, hint)

    def _check_mine(self, location: str, hint: str) -> None:
        self._fs.invalidate_cache(self._path)
        now = Holder.parse(self._read())
        if not self._holder.same(now):  # another writer took it over first
            raise _held_error(location, now, hint)

    def check_held(self) -> None:
        """Raise a :class:`~jaxstow.errors.CheckpointError` if the lock was lost: taken over by another writer
        after this one renewed it no more (a process stopped for longer than its lease), or not renewed for a
        lease."""
        if (lost := self._renewal.lost) is not None:
            raise CheckpointError(
                f"{self._store.location}: this process no longer holds the writer's lock of the directory: {lost}; "
                "another writer may be saving there. Nothing more is saved by this manager: close it"
            )

    def release(self) -> None:
        """Delete the lock object if it is still this one's (idempotent)."""
        self._finalizer.detach()
        _release_remote(self._read, self._fs, self._path, self._url, self._holder, self._renewal.stop, quiet=False)


def _release_remote(
    read: Callable[[], bytes],
    fs: Any,
    path: str,
    url: str,
    holder: Holder,
    stop_renewing: Callable[[], None],
    *,
    quiet: bool = True,
) -> None:
    """Delete the lock object at ``path`` if ``holder`` holds it, as ``read`` reads it, once ``stop_renewing()``
    returned; ``quiet``: at exit or collection, where no one is told, a failure is logged."""
    _HELD_HERE.discard(holder.token)  # a lock object left (its deletion failed) is this process's next manager's
    if holder.pid != os.getpid():  # a process forked from the holder: the lock stays its parent's
        return
    stop_renewing()  # not in a forked process, which has no renewals
    try:
        with storage_errors(url):
            _delete_if_held(read, fs, path, holder)
    except Exception as error:
        if not quiet:
            raise
        logger.warning("%s: the lock object stays: %s", url, error)


def _delete_if_held(read: Callable[[], bytes], fs: Any, path: str, holder: Holder) -> None:
    """Delete the lock object at ``path`` if it names ``holder``, as ``read`` reads it."""
    with contextlib.suppress(FileNotFoundError):
        fs.invalidate_cache(path)
        if holder.same(Holder.parse(_read_again(read))):
            fs.rm(path)


def _read_again(read: Callable[[], bytes]) -> bytes:
    """``read()``, asked again for up to a second and a half where the object is not found: a store may answer "no
    such key" for a moment while an overwrite of the object lands."""
    for wait in (0.1, 0.3, 1.0):
        with contextlib.suppress(FileNotFoundError):
            return read()
        time.sleep(wait)
    return read()


def _renew_remote(store: RemoteStore, read: Callable[[], bytes], holder: Holder, number: int) -> str | None:
    """Renew ``holder``'s lock object (its ``number``-th renewal), if it still names it; else say who holds it now."""
    from jaxstow._storage.s3 import is_s3

    path = store.path(LOCK_NAME)
    store.fs.invalidate_cache(path)
    found, etag = _s3_read(store, path) if is_s3(store.fs) else (read(), None)
    now = Holder.parse(found)
    if not holder.same(now):
        return f"{'another writer' if now is None else now.describe()} took it over"
    if etag is None:
        store.fs.pipe_file(path, holder.renewed(number).to_json())
    elif not _s3_replace(store, path, holder.renewed(number).to_json(), etag):
        return "another writer took it over"
    return None


def _s3_read(store: RemoteStore, path: str) -> tuple[bytes, str | None]:
    """The bytes of the S3 object at ``path`` and its ETag, from one GET."""
    from jaxstow._storage.s3 import S3Bucket

    name, key, _ = store.fs.split_path(path)
    bucket = S3Bucket(store.fs, name, store.settings.transfer)

    def get() -> tuple[bytes, str | None]:
        answer = bucket.client.get_object(Bucket=name, Key=key, **bucket.extra("GetObject"))
        return bytes(answer["Body"].read()), answer.get("ETag")

    return bucket.request(get, url=store.url(LOCK_NAME), doing="reading the lock (GetObject)")


def _s3_bytes(store: RemoteStore, path: str) -> bytes:
    return _s3_read(store, path)[0]


def _s3_replace(store: RemoteStore, path: str, data: bytes, etag: str) -> bool:
    """Write ``data`` to the S3 object at ``path`` only if its ETag is still ``etag``; ``False`` where another writer
    changed it meanwhile, left as it is."""
    from jaxstow._storage.retrying import error_code
    from jaxstow._storage.s3 import S3Bucket

    name, key, _ = store.fs.split_path(path)
    bucket = S3Bucket(store.fs, name, store.settings.transfer)

    def put() -> bool:
        try:
            bucket.client.put_object(Bucket=name, Key=key, Body=data, IfMatch=etag, **bucket.extra("PutObject"))
        except Exception as error:
            if error_code(error) != "PreconditionFailed":  # replaced since it was read: another writer's now
                raise
            return False
        return True

    replaced: bool = bucket.request(put, url=store.url(LOCK_NAME), doing="writing the lock (PutObject with If-Match)")
    return replaced


def lock_store(store: Store) -> Lock:
    """Take the writer's lock of a store's directory, creating the directory if needed."""
    store.ensure()
    if isinstance(store, LocalStore):
        return LocalLock(store.root)
    from jaxstow._storage.remote_store import RemoteStore  # loaded already: the store is one

    if isinstance(store, RemoteStore):
        return RemoteLock(store)
    raise TypeError(f"no lock for a store of type {type(store).__name__}")
