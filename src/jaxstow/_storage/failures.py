"""What the operating system says when storage fails, turned into a :class:`~jaxstow.errors.StorageError` that names
the file a user asked for (never a temporary name) and the cause in words.

Used where bytes meet the operating system (atomic writes, sinks, sources, folders, locks, HDF5 files), so that
every face gets the same errors.

>>> import errno, os, tempfile
>>> from jaxstow._storage.failures import storage_error
>>> folder = tempfile.mkdtemp()
>>> full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.path.join(folder, ".model.jxs.jaxstow-tmp-1-0-0"))
>>> error = storage_error(full, os.path.join(folder, "model.jxs"))
>>> print(error)
/.../model.jxs: cannot write it: no space left on the device holding /...; free some space there, or write elsewhere
>>> error.errno == errno.ENOSPC, error.filename == os.path.join(folder, "model.jxs"), isinstance(error, OSError)
(True, True, True)
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Iterator

from jaxstow.errors import JaxstowError, PathNotFoundError, StorageError

__all__ = ["errno_of", "storage_error", "storage_failures"]

#: Per errno: the cause and the fix, in words; ``{target}`` is the target, ``{folder}`` the nearest existing folder
#: holding it, ``{place}`` the target and its folder if it exists, else that folder.
_WORDS: dict[int, tuple[str, str]] = {
    errno.ENOSPC: ("no space left on the device holding {folder}", "free some space there, or write elsewhere"),
    errno.EDQUOT: ("disk quota exceeded on the device holding {folder}", "free some of your quota, or write elsewhere"),
    errno.EROFS: ("the folder {folder} is read-only", "write to a folder of a file system mounted read-write"),
    errno.EACCES: ("permission denied", "check the permissions of {place}"),
    errno.EPERM: ("operation not permitted", "check the permissions of {place}"),
    errno.EIO: ("I/O error", "the device holding {folder} failed: check it (dmesg) before trusting its files"),
    errno.EFBIG: ("file too large for its file system", "write it to another file system"),
    errno.ENOENT: ("no such file or folder", "check that {folder} exists and is not removed meanwhile"),
}
#: How HDF5 reports the errno of a failed system call in its message (``errno = 28, error message = ...``).
_ERRNO_IN_TEXT = re.compile(r"\berrno = (\d+)")


def errno_of(error: BaseException) -> int | None:
    """The errno of ``error``: its own, or one its message quotes as HDF5 does (``errno = 28``); ``None`` if none."""
    code = getattr(error, "errno", None)
    if isinstance(code, int):
        return code
    found = _ERRNO_IN_TEXT.search(str(error))
    return int(found[1]) if found else None


def storage_error(
    error: BaseException, target: str | os.PathLike[str], *, doing: str = "write it", folder: str | None = None
) -> StorageError:
    """A :class:`StorageError` naming ``target`` for ``error``, met while ``doing`` (``"write it"``, ``"read it"``).

    ``error.errno`` (or the errno an HDF5 message quotes) picks the words: no space left (no inodes left, where free
    blocks remain), a read-only folder, permission denied, disk quota exceeded, an I/O error, a file name too long;
    another errno gets the system's own words. The words name ``target``'s folder, or ``folder``, where the file is
    written elsewhere (the file a symbolic link names). The error keeps the errno; raise it ``from error``.
    """
    name = os.fspath(target)
    code = errno_of(error)
    if folder is None:
        folder = name.rpartition("/")[0] if "://" in name else name if os.path.isdir(name) else _existing(name)
    if code == errno.ENAMETOOLONG:
        cause, fix = _name_too_long(name)
    elif code == errno.ENOSPC and (blocks := _free_blocks_without_inodes(folder)):
        cause, fix = _no_inodes(blocks)
    elif code in _WORDS:
        cause, fix = _WORDS[code]
    else:
        strerror = getattr(error, "strerror", None)
        cause, fix = (strerror[:1].lower() + strerror[1:] if strerror else f"{type(error).__name__}: {error}"), ""
    place = f"{name} and of its folder" if os.path.exists(name) and name != folder else folder
    cause, fix = cause.format(folder=folder, target=name), fix.format(folder=folder, target=name, place=place)
    return StorageError(f"cannot {doing}: {cause}{'; ' + fix if fix else ''}", file=name, errno=code)


@contextlib.contextmanager
def storage_failures(
    target: str | os.PathLike[str], *, doing: str = "write it", hdf5: bool = False, folder: str | None = None
) -> Iterator[None]:
    """Turn an ``OSError`` raised in the block into :func:`storage_error`'s :class:`StorageError` naming ``target``.

    A ``FileNotFoundError`` becomes a :class:`~jaxstow.errors.PathNotFoundError`; jaxstow's own errors pass unchanged
    (a source's read error already names its file). ``hdf5=True`` is for h5py's calls, which raise an ``OSError`` or
    a ``RuntimeError`` for a format's problems and a system call's failure alike: only those whose message quotes an
    errno are turned, and one raised while a jaxstow error of the block goes up (a file closed after a full disk
    failed a write) gives way to that error. ``folder``: as :func:`storage_error` takes it.
    """
    try:
        yield
    except JaxstowError:
        raise
    except (OSError, RuntimeError) as error:
        block = error.__context__  # HDF5 failing again as the block's file closes: the block's own error tells why
        if hdf5 and errno_of(error) is None and isinstance(block, JaxstowError):
            raise block from block.__cause__
        if errno_of(error) is None if hdf5 else not isinstance(error, OSError):
            raise
        if isinstance(error, FileNotFoundError):  # still a FileNotFoundError, for the callers that look for one
            raise PathNotFoundError(f"cannot {doing}: no such file or folder", file=os.fspath(target)) from None
        raise storage_error(error, target, doing=doing, folder=folder) from error


def _name_too_long(name: str) -> tuple[str, str]:
    longest = max((len(os.fsencode(part)) for part in name.split(os.sep)), default=0)
    try:
        limit = os.pathconf(_existing(name), "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    if longest > limit:
        return f"file name too long ({longest} bytes; this file system takes at most {limit})", "use a shorter name"
    return "file name too long", "use a shorter name or path"


def _no_inodes(blocks: int) -> tuple[str, str]:
    """The words for :data:`errno.ENOSPC` where the file system has ``blocks`` free blocks but no free inodes."""
    return (
        f"the file system holding {{folder}} has no free inodes (files) left, though it has {blocks} free blocks: "
        "it holds as many files as it can, and space is not what ran out",
        "delete files there (many small files use up inodes: a checkpoint manager keeps fewer steps with a smaller "
        "KeepPolicy(keep_last=...)), or write elsewhere",
    )


def _free_blocks_without_inodes(folder: str) -> int:
    """The free blocks of the file system holding ``folder`` where it has no free inodes left; else 0 (also where it
    has no inode limit, or cannot be asked: a URL)."""
    try:
        status = os.statvfs(folder)
    except (OSError, ValueError):
        return 0
    return status.f_bavail if status.f_files > 0 and status.f_favail == 0 else 0


def _existing(name: str) -> str:
    """The nearest folder of ``name`` that exists."""
    folder = os.path.dirname(os.path.abspath(name))
    while not os.path.isdir(folder) and folder != os.path.dirname(folder):
        folder = os.path.dirname(folder)
    return folder
