"""HDF5 files written by one process while others read them: HDF5's single-writer/multi-reader (SWMR) mode.

A file created with ``libver="latest"`` has a superblock whose *consistency flags* say whether a writer has it
open, and whether in SWMR mode; readers open it with ``swmr=True``. A killed writer leaves the flags set:
:func:`clear_stale_writer` clears them (as HDF5's ``h5clear -s`` does), and a jaxstow writer's :class:`WriterLock`
tells the next writer that the last one was killed. A file created otherwise cannot enter SWMR mode
(:func:`writes_live` says which). The bytes this module writes go through :mod:`jaxstow._storage`.

>>> import os, tempfile, h5py
>>> from jaxstow.io.swmr import open_for_reading, read_superblock
>>> path = os.path.join(tempfile.mkdtemp(), "live.h5")
>>> writer = h5py.File(path, "w", libver="latest")
>>> writer["x"] = [1.0, 2.0]
>>> writer.swmr_mode = True
>>> read_superblock(path).writer
'a writer in SWMR mode'
>>> with open_for_reading(path) as reader:          # another process could do the same
...     reader["x"][:]
array([1., 2.])
>>> writer.close()
>>> read_superblock(path).writer is None
True
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import struct
import warnings
from collections.abc import Collection
from types import TracebackType
from typing import Any

from jaxstow._storage.atomic import temporary_sibling
from jaxstow._storage.failures import errno_of
from jaxstow._storage.in_place import rewrite_range
from jaxstow._storage.lock import FileLock, Holder
from jaxstow._storage.sources import LocalFile
from jaxstow._util.optional import require
from jaxstow.errors import CheckpointError, CollectorError, FormatError, JaxstowError, excerpt
from jaxstow.io.hdf5_damage import damage_refused
from jaxstow.io.hdf5_layout import DRAWS_DONE, RUN_ATTRIBUTE, RUN_ID
from jaxstow.io.hdf5_links import refuse_stored_elsewhere
from jaxstow.io.hdf5_resume import refuse_lost_checkpoint
from jaxstow.io.hdf5_retries import reading_access
from jaxstow.io.hdf5_writable import writable_file
from jaxstow.io.lookup3 import lookup3

__all__ = [
    "DISK_DRIVERS",
    "LiveReadWarning",
    "Superblock",
    "WriterLock",
    "clear_stale_writer",
    "hold_metadata_in_memory",
    "open_appending",
    "open_for_reading",
    "open_writer",
    "read_superblock",
    "writes_live",
]

_SIGNATURE = b"\x89HDF\r\n\x1a\n"
#: The consistency flags of a version 3 superblock: open for writing, and in SWMR mode.
WRITE_ACCESS = 0x01
SWMR_WRITE = 0x04
#: What a collector whose file is damaged can do instead of moving it away.
_ANOTHER_FILE = "give the collector another file"
#: The first superblock version with the consistency flags that SWMR mode needs (``libver="latest"`` makes it).
SWMR_SUPERBLOCK = 3
#: The h5py drivers of files on disk, which other processes can open.
DISK_DRIVERS = ("sec2", "stdio", "direct")


class LiveReadWarning(UserWarning):
    """A file is written in a way no other process can read before it is closed: it lacks ``libver="latest"``."""


@dataclasses.dataclass(frozen=True)
class Superblock:
    """Where a file's superblock is, its version, its consistency flags and (versions 2 and 3) its end of file."""

    offset: int
    version: int
    flags: int
    offset_size: int
    #: Where the file ends by the superblock (its base address and end of file address; versions 2 and 3).
    recorded_end: int | None = None
    #: The file's size when the superblock was read.
    file_size: int = 0

    @property
    def writer(self) -> str | None:
        """Who the flags say has the file open for writing, or ``None``."""
        if self.version < SWMR_SUPERBLOCK or not self.flags & (WRITE_ACCESS | SWMR_WRITE):
            return None
        return "a writer in SWMR mode" if self.flags & SWMR_WRITE else "a writer not in SWMR mode"

    @property
    def size(self) -> int:
        """The superblock's bytes before its checksum (versions 2 and 3)."""
        return 12 + 4 * self.offset_size

    @property
    def cut_short(self) -> bool:
        """Whether the file ends before the end its superblock records, though no writer has it open (a writer may
        not have written yet all it placed): HDF5 checks that itself, but not for a reader in SWMR mode."""
        return self.writer is None and self.recorded_end is not None and self.recorded_end > self.file_size


def read_superblock(path: str | os.PathLike[str]) -> Superblock:
    """The superblock of the HDF5 file at ``path`` (looked for at 0, 512, 1024, ... as HDF5 does); a path that is not
    a regular file (a folder, a FIFO) is a :class:`~jaxstow.errors.PathError`, never waited on."""
    name = os.fspath(path)
    source = LocalFile(name, live=True)  # a live writer may change it meanwhile
    with contextlib.closing(source):
        end, offset = source.size, 0
        while offset + 12 <= end:
            head = source.read(offset, 12)
            if head[:8] == _SIGNATURE:
                version, offset_size = head[8], head[9]
                flags = head[11] if version >= 2 else 0
                addresses = offset + 12 + 3 * offset_size  # base, superblock extension, end of file
                if version < 2 or addresses > end:
                    return Superblock(offset, version, flags, offset_size, None, end)
                raw = source.read(offset + 12, 3 * offset_size)
                base, _, last = (
                    int.from_bytes(raw[at : at + offset_size], "little")
                    for at in range(0, 3 * offset_size, offset_size)
                )
                return Superblock(offset, version, flags, offset_size, base + last, end)
            offset = 512 if offset == 0 else 2 * offset
    raise FormatError("is not an HDF5 file: no HDF5 signature at 0, 512, 1024, ...", file=name)


def open_for_reading(path: str | os.PathLike[str], checking: Collection[str] | None = None) -> Any:
    """``h5py.File`` open for reading, in SWMR mode where the file allows it, so that a live writer may go on.

    A file whose writer is not in SWMR mode cannot be read until that writer closes it (or enters SWMR mode):
    that raises a :class:`~jaxstow.errors.FormatError` saying so, as does a file whose writer holds HDF5's lock on it
    (one opened without ``libver="latest"``, which cannot enter SWMR mode). So does a file whose samples HDF5 would
    read from another file (:mod:`~jaxstow.io.hdf5_links`; ``checking`` names the root group's objects read, where
    not every chain is). A file shorter than its superblock says, no writer having
    it open, raises the ``OSError`` HDF5 raises for it, which HDF5 skips in SWMR mode.
    """
    name = os.fspath(path)
    h5py = require("h5py", extra="h5py", purpose=f"reading {name}")
    superblock = read_superblock(name)
    if superblock.writer == "a writer not in SWMR mode":
        raise FormatError(
            "is open for writing by a writer not in SWMR mode (or one that was killed before entering it), so no "
            "other process can read it yet; jaxstow.io's writers enter SWMR mode as soon as they get the file",
            file=name,
        )
    if superblock.version >= SWMR_SUPERBLOCK and superblock.cut_short:  # HDF5 checks this, except in SWMR mode
        raise OSError(  # HDF5's own error for it, which every caller handles
            f"Unable to synchronously open file (truncated file: eof = {superblock.file_size}, stored_eof = "
            f"{superblock.recorded_end})"
        )
    try:
        flags = h5py.h5f.ACC_RDONLY | (h5py.h5f.ACC_SWMR_READ if superblock.version >= SWMR_SUPERBLOCK else 0)
        file = h5py.File(h5py.h5f.open(os.fsencode(name), flags, fapl=reading_access()))
    except BlockingIOError:
        raise FormatError(
            'is locked by its writer: a file opened without libver="latest" cannot be read by another process '
            'before its writer closes it; write it with h5py.File(path, "w", libver="latest") to read it while '
            "it is written",
            file=name,
        ) from None
    except OSError as error:
        if "locking flag values don't match" not in str(error):
            raise
        raise CollectorError(  # HDF5 opens a file once per process, with the flags of its first opening
            f"{name} is open for writing in this process (a run of an HDF5Collector), where HDF5 cannot open it "
            "again to read: read it from another process, or once the run's postprocess_save has returned (which "
            "returns its samples here); a collector with chains of a run that failed keeps it open until its close()"
        ) from None
    try:
        refuse_stored_elsewhere(file, name, checking)
    except BaseException:
        file.close()
        raise
    return file


def open_writer(path: str | os.PathLike[str], checkpoint: str) -> tuple[Any, WriterLock]:
    """Open the HDF5 file at ``path`` for writing in SWMR mode under its :class:`WriterLock`: to continue its run if
    it and ``checkpoint`` (where the run commits its progress) exist, else emptied; return the file and the lock.

    The writer flags that a killed writer left are cleared first. A file that is not HDF5, or whose flags no killed
    writer left, is refused before anything is changed, unless a killed writer left it before its first checkpoint
    (killed while it first wrote the file): that run starts over. A run that starts over removes ``checkpoint`` before it
    empties the file, so that a kill in between leaves no checkpoint of rows the file lost; it empties the file by
    putting an empty one in its place, so that a reader in the middle of a read goes on reading the file as it was
    (an HDF5 file emptied in place would have the reader take the new run's bytes for the old run's rows).
    """
    name = os.fspath(path)
    h5py = require("h5py", extra="h5py", purpose=f"writing {name}")
    lock = WriterLock(name)
    try:
        with damage_refused(name, _ANOTHER_FILE):
            exists = os.path.exists(name) and os.path.getsize(name) > 0
            continued = exists and os.path.exists(checkpoint)
            try:
                if exists:
                    lock.clear_stale_flags()
                if not continued and exists:
                    _check_collectors_own(name, checkpoint)
            except JaxstowError:
                raise
            except (OSError, RuntimeError) as error:  # h5py cannot read it: started over only where
                if errno_of(error) is not None or continued or not lock.killed:  # a killed run of ours never
                    raise  # checkpointed it (killed while it first wrote the file)
            if not continued and os.path.exists(checkpoint):
                os.unlink(checkpoint)
            if not continued and os.path.exists(name):
                _replace_with_empty(h5py, os.path.realpath(name))
            return writable_file(name, "a" if continued else "w"), lock
    except BaseException:
        lock.release(failed=True)
        raise


def open_appending(path: str | os.PathLike[str]) -> tuple[Any, WriterLock]:
    """Open the HDF5 file at ``path``, which a collector's last run wrote, again under its :class:`WriterLock`, for
    the chains of the collector's next run; return the file and the lock.

    The file is the collector's as long as nothing else was put in its place meanwhile: a file that is not the
    collector's (another program's HDF5 data, a damaged file) is refused, left as it is; a file removed meanwhile is
    created again.
    """
    name = os.fspath(path)
    require("h5py", extra="h5py", purpose=f"writing {name}")
    lock = WriterLock(name)  # another process may have taken the file meanwhile: a CheckpointError names it
    try:
        with damage_refused(name, _ANOTHER_FILE):
            if os.path.exists(name) and os.path.getsize(name) > 0:
                _check_collectors_own(name)
            return writable_file(name, "a", (DRAWS_DONE,)), lock  # new chains, and the counts of every chain
    except BaseException:
        lock.release(failed=True)
        raise


def _check_collectors_own(name: str, checkpoint: str | None = None) -> None:
    """Refuse to start a run over in an HDF5 file that a collector's run did not write (what it holds is not ours to
    empty): one that holds anything but is not marked as a collector's, or one of ``io.run_chains``; and, given the
    ``checkpoint`` it lacks, one whose run stopped after a checkpoint."""
    with open_for_reading(name, ()) as file:  # its root's names and attributes only
        keys, attributes = sorted(file.keys()), set(file.attrs.keys())
        if checkpoint is not None and RUN_ATTRIBUTE not in attributes and RUN_ID in attributes:
            refuse_lost_checkpoint(file, checkpoint)
    if RUN_ATTRIBUTE in attributes:
        raise CollectorError(
            f"{name} holds a run of io.run_chains (or io.blackjax.sample, io.numpyro.run): it is left as it is; continue it "
            "with the call that started it, or give the collector another file",
            file=name,
        )
    if (keys or attributes) and RUN_ID not in attributes:
        raise CollectorError(
            f"{name} holds HDF5 data that no jaxstow collector wrote ({excerpt(keys or sorted(attributes))}): it is left "
            "as it is; give the collector another file",
            file=name,
        )


def _replace_with_empty(h5py: Any, path: str) -> None:
    """Put an empty HDF5 file in the place of the one at ``path``, which a reader that has it open keeps whole."""
    empty = temporary_sibling(path)
    try:
        h5py.File(empty, "w", libver="latest", locking=False).close()
        os.replace(empty, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(empty)
        raise


def writes_live(file: Any, *, stacklevel: int = 2) -> bool:
    """Whether the open ``h5py.File`` can be written in SWMR mode, so that other processes read it meanwhile.

    That takes a file on disk, open for writing, created with ``libver="latest"``. A file on disk open for writing
    without it gets a :class:`LiveReadWarning` that names the mode to open it with, attributed ``stacklevel`` frames
    up (2: the caller).
    """
    if file.driver not in DISK_DRIVERS or file.mode != "r+":
        return False
    if file.id.get_create_plist().get_version()[0] >= SWMR_SUPERBLOCK:
        return True
    warnings.warn(
        f'{file.filename} was opened without libver="latest", so no other process can read it before it is '
        'closed (jaxstow watch, io.to_inference_data): open it with h5py.File(path, "w", libver="latest") to '
        "read it while it is written. It is written, and checkpointed, all the same",
        LiveReadWarning,
        stacklevel=stacklevel + 1,
    )
    return False


def hold_metadata_in_memory(file: Any) -> None:
    """Let HDF5 write the open ``h5py.File``'s metadata only when it is flushed, never on its own in between.

    A writer that flushes only where the file is whole then leaves a whole file, however it is killed.
    """
    config = file.id.get_mdc_config()
    config.incr_mode = config.decr_mode = config.flash_incr_mode = 0  # adaptive resizing off, as HDF5 requires
    config.evictions_enabled = False
    file.id.set_mdc_config(config)


def clear_stale_writer(path: str | os.PathLike[str]) -> bool:
    """Clear the consistency flags a killed writer left in the superblock (what ``h5clear -s`` does).

    A writer that holds no :class:`WriterLock` (an ``h5py.File`` a program opened itself) cannot be told from a
    killed one: call this only when no program writes the file.

    Returns:
        Whether the flags were set.

    Raises:
        CheckpointError: A live writer holds the file's :class:`WriterLock` (an :class:`~jaxstow.io.HDF5Collector`
            given a path, :func:`jaxstow.io.run_chains`); the error names its process.

    >>> import os, tempfile, h5py
    >>> path = os.path.join(tempfile.mkdtemp(), "samples.h5")
    >>> h5py.File(path, "w", libver="latest").close()
    >>> clear_stale_writer(path)                       # a file closed by its writer: nothing to clear
    False
    """
    with WriterLock(path):
        return _clear_flags(os.fspath(path))


def _clear_flags(name: str) -> bool:
    """Clear the superblock's consistency flags; the end of file it records is raised to the file's size, as
    ``h5clear --increment=0`` does, so that nothing the killed writer placed beyond it is overwritten."""
    superblock = read_superblock(name)
    if superblock.writer is None:
        return False
    if superblock.offset_size != 8:
        raise FormatError(f"has {superblock.offset_size}-byte addresses; jaxstow clears only 8-byte ones", file=name)

    def cleared(found: bytes, file_size: int) -> bytes:
        block = bytearray(found)
        stored = struct.unpack_from("<I", block, superblock.size)[0]
        if stored != lookup3(bytes(block[: superblock.size])):
            raise FormatError("has a superblock whose checksum does not match: the file is damaged", file=name)
        end_of_file = 12 + 2 * superblock.offset_size  # after base address and superblock extension address
        recorded = struct.unpack_from("<Q", block, end_of_file)[0]
        struct.pack_into("<Q", block, end_of_file, max(recorded, file_size - superblock.offset))
        block[11] = 0
        struct.pack_into("<I", block, superblock.size, lookup3(bytes(block[: superblock.size])))
        return bytes(block)

    rewrite_range(name, superblock.offset, superblock.size + 4, cleared)
    return True


class WriterLock:
    """``<file>.lock``: the lock that the one process writing an HDF5 file (or a collector's folder) holds, until
    :meth:`release`.

    The kernel releases it when its process ends, but only :meth:`release` removes the lock file, which names the
    process: one found when the lock is taken was left by a killed writer (:attr:`killed`), whose flags in the file
    :meth:`clear_stale_flags` clears. A second writer gets a :class:`~jaxstow.errors.CheckpointError` naming it.

    >>> import os, tempfile
    >>> from jaxstow.errors import CheckpointError
    >>> path = os.path.join(tempfile.mkdtemp(), "samples.h5")
    >>> with WriterLock(path) as lock:
    ...     try:
    ...         WriterLock(path)                       # another process would get the same
    ...     except CheckpointError as error:
    ...         print(error)
    /.../samples.h5 is being written by another run (process ..., this one); one process at a time writes a file, any number may read it: a collector of this file whose run did not reach postprocess_save (it failed?) is still open; call that collector's close() first (again, once the cause is gone, if it raised: a full disk)
    >>> lock.killed, os.path.exists(path + ".lock")
    (False, False)
    """

    def __init__(self, path: str | os.PathLike[str], *, lock_file: str | None = None) -> None:
        self.path = os.fspath(path)
        folder = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(folder):
            raise CheckpointError(f"{self.path}: the folder {folder} does not exist", file=self.path)
        lock_file = f"{self.path}.lock" if lock_file is None else lock_file  # a folder's: one inside it
        self._lock = FileLock(lock_file, self._held, release_at_exit=False, of=self.path)
        #: Whether the last writer left the lock file: it was killed, and the writer flags in the file are its.
        self.killed = bool(self._lock.found)

    def _held(self, holder: Holder | None) -> CheckpointError:
        who = "a process" if holder is None else f"process {holder.pid}{', this one' if holder.is_me() else ''}"
        fix = (
            ": a collector of this file whose run did not reach postprocess_save (it failed?) is still open; call "
            "that collector's close() first (again, once the cause is gone, if it raised: a full disk)"
            if holder is not None and holder.is_me()
            else ""
        )
        return CheckpointError(
            f"{self.path} is being written by another run ({who}); one process at a time writes a file, any number "
            f"may read it{fix}",
            file=self.path,
        )

    def clear_stale_flags(self) -> bool:
        """Clear the writer flags in the file, which the killed last writer left; return whether there were any.

        Flags that no killed writer of the lock left raise a :class:`~jaxstow.errors.CheckpointError`, and the file
        is left as it is: they may be those of a live program that holds no lock.
        """
        writer = read_superblock(self.path).writer
        if writer is not None and not self.killed:
            raise CheckpointError(
                f"{self.path} is open for writing by {writer} that holds no writer lock of jaxstow (another program, "
                "or one killed while it wrote the file): it is left as it is. If no program writes it, clear its "
                "flags with jaxstow.io.swmr.clear_stale_writer (what `h5clear -s` does) and try again",
                file=self.path,
            )
        return writer is not None and _clear_flags(self.path)

    def release(self, *, failed: bool = False) -> None:
        """Remove the lock file and release the lock; ``failed``: leave the lock file as it was found (idempotent)."""
        self._lock.release(as_found=failed)

    def abandon(self) -> None:
        """Release the lock, leaving the lock file naming this process, as a killed writer's: the next writer then
        clears the writer flags in the file that this one could not (a full disk failed its close)."""
        self._lock.abandon()

    def __enter__(self) -> WriterLock:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.release(failed=kind is not None)
