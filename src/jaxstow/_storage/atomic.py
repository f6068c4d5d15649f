"""Local files written all or nothing, and the temporary names that make it so.

A save to a path writes a temporary file in the same folder, fsyncs it, renames it over the final name and fsyncs the
folder, so a crash leaves either the old file or the new one, never a torn one.

>>> import os, tempfile
>>> from jaxstow._storage.atomic import atomic_write
>>> folder = tempfile.mkdtemp()
>>> with atomic_write(os.path.join(folder, "x.bin")) as sink:
...     _ = sink.write(b"hello")
>>> open(os.path.join(folder, "x.bin"), "rb").read(), os.listdir(folder)
(b'hello', ['x.bin'])
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
import socket
import stat
import zlib
from collections.abc import Iterator
from typing import BinaryIO

from jaxstow._storage.failures import storage_failures
from jaxstow._storage.pid_space import boot_id, machine_id, pid_space
from jaxstow._storage.sources import special_kind
from jaxstow.errors import IsAFolderError, PathError, PathNotFoundError, StorageError

__all__ = [
    "NAME_MAX",
    "TEMPORARY_MARKER",
    "atomic_write",
    "fsync_directory",
    "remove_dead_leftovers",
    "rename_durably",
    "temporary_sibling",
]

#: Part of the name of every temporary file or folder jaxstow writes; readers and listings skip such names.
TEMPORARY_MARKER = ".jaxstow-tmp-"

#: The most bytes of a file name on the usual file systems (ext4, xfs, btrfs, tmpfs).
NAME_MAX = 255

_WRITE_BUFFER = 1 << 20


def _hashed(*names: str) -> str:
    return f"{zlib.crc32(' '.join(names).encode()):08x}"


#: This host, machine and PID namespace, hashed (a process id in a temporary name is looked up only where it means
#: the same), and this boot of the machine (a writer of an earlier boot runs no more).
_PLACE = _hashed(socket.gethostname(), machine_id(), pid_space())
_BOOT = _hashed(boot_id())
_TEMPORARY_FILE = re.compile(re.escape(TEMPORARY_MARKER) + r"(\d+)-([0-9a-f]{8})-([0-9a-f]{8})-[0-9a-f]{8}$")


def temporary_sibling(path: str) -> str:
    """A fresh temporary name in the folder of ``path``: it names the writing process and (by hashes) its host,
    machine and PID namespace, and the machine's boot.

    It is never longer than :data:`NAME_MAX` bytes: the start of a long name is kept, so that any name that fits its
    file system can be written.

    >>> import os
    >>> from jaxstow._storage.atomic import NAME_MAX, temporary_sibling
    >>> len(os.path.basename(temporary_sibling("/data/" + "x" * 250 + ".jxs"))) <= NAME_MAX
    True
    """
    folder, name = os.path.split(os.path.abspath(path))
    suffix = f"{TEMPORARY_MARKER}{os.getpid()}-{_PLACE}-{_BOOT}-{secrets.token_hex(4)}"
    room = NAME_MAX - 1 - len(suffix)
    kept = os.fsencode(name)[:room].decode(errors="ignore") if len(os.fsencode(name)) > room else name
    return os.path.join(folder, f".{kept}{suffix}")


def remove_dead_leftovers(folder: str, *, staged: str | None = None) -> list[str]:
    """Delete the temporary files in ``folder`` whose writer, a process of this machine, no longer runs: one that
    does not run now, or one of the machine before it restarted (with ``staged``, the temporary folders made for the
    folder of that name too: an export's).

    A killed save cannot clean up after itself; the next save into the same folder does. Files of live processes,
    of other hosts, of other machines of the same host name (a shared folder), of other PID namespaces (a container
    sharing this host's name, whose processes are not seen from here) and temporary folders (a checkpoint manager's,
    cleaned under its lock) are left alone. Returns the names deleted.

    >>> import os, subprocess, sys, tempfile
    >>> from jaxstow._storage.atomic import remove_dead_leftovers, temporary_sibling
    >>> folder = tempfile.mkdtemp()
    >>> dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True).stdout
    >>> mine = temporary_sibling(os.path.join(folder, "model.jxs"))
    >>> theirs = mine.replace(f"-tmp-{os.getpid()}-", f"-tmp-{int(dead)}-")
    >>> for path in (mine, theirs):
    ...     open(path, "wb").close()
    >>> remove_dead_leftovers(folder) == [os.path.basename(theirs)], os.listdir(folder) == [os.path.basename(mine)]
    (True, True)
    """
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    removed = []
    for entry in entries:
        match = _TEMPORARY_FILE.search(entry.name)
        is_folder = entry.is_dir(follow_symlinks=False)
        ours = staged is not None and is_folder and entry.name.startswith(f".{staged}{TEMPORARY_MARKER}")
        if match is None or match[2] != _PLACE or (is_folder and not ours):
            continue
        if match[3] == _BOOT and _running(int(match[1])):
            continue
        with contextlib.suppress(FileNotFoundError):
            if is_folder:
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
            removed.append(entry.name)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # or no process can have that number
        return False
    except PermissionError:  # it runs, as another user
        return True
    return True


def fsync_directory(folder: str) -> None:
    """Make a rename or a deletion in ``folder`` durable."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def rename_durably(source: str, target: str) -> None:
    """Rename ``source`` to ``target`` (a new name, or an empty folder) and fsync their folder; where that fsync fails
    (a failing device), the rename is undone before its error is raised, so that nothing seems made that failed.

    >>> import os, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> os.mkdir(os.path.join(folder, "staging"))
    >>> rename_durably(os.path.join(folder, "staging"), os.path.join(folder, "run"))
    >>> os.listdir(folder)
    ['run']
    """
    os.rename(source, target)
    try:
        fsync_directory(os.path.dirname(os.path.abspath(target)))
    except BaseException:
        with contextlib.suppress(OSError):  # the error raised is the fsync's
            os.rename(target, source)
        raise


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """Write ``path`` all or nothing: a temporary sibling, fsync, rename, fsync of the folder.

    Any failure (disk full, I/O error, an exception in the block, Ctrl-C) removes the temporary file and leaves the
    previous file as it was. A symbolic link to a file is written through: the file it names is replaced, not it. A
    file replaced keeps its permissions (a file only its owner may read stays so), which the temporary file has before
    a byte is written to it; one this process may not write is refused, as ``open(path, "wb")`` refuses it, though the
    rename would replace it. Temporary files that killed saves left in the folder are removed first. An ``OSError``
    (of the block's writes too) becomes a :class:`~jaxstow.errors.StorageError` naming ``path``, not the temporary
    file.
    """
    final = os.fspath(path)
    written = os.path.realpath(final) if os.path.islink(final) and os.path.exists(final) else final  # through a link
    folder = os.path.dirname(os.path.abspath(written))
    if not os.path.isdir(folder):
        if os.path.lexists(folder):
            raise PathError(f"cannot write it: {folder} is a file, not a folder", file=final)
        raise PathNotFoundError(f"cannot write it: the folder {folder} does not exist (create it first)", file=final)
    if os.path.isdir(final):
        raise IsAFolderError("cannot write it: it is a folder", file=final)
    try:
        mode = os.stat(final).st_mode
    except OSError:
        mode = None  # nothing there yet (or a dangling link, which the file replaces)
    if mode is not None and not stat.S_ISREG(mode):  # a device, a pipe: the save would put a file in its place
        raise PathError(f"cannot write it: it is {special_kind(mode)}; jaxstow writes regular files", file=final)
    if mode is not None and _protected(written, folder):
        raise StorageError(  # the rename needs only the folder's permission: refused as open(final, "wb") is
            f"cannot write it: it is read-only ({stat.filemode(mode)}), which keeps it from being replaced; make it "
            "writable (chmod u+w) to replace it, or save elsewhere",
            file=final,
            errno=errno.EACCES,
        )
    remove_dead_leftovers(folder)
    temporary = temporary_sibling(written)
    with storage_failures(final, folder=folder):  # the folder written in: a link's file's
        sink = open(temporary, "wb", buffering=_WRITE_BUFFER)  # noqa: SIM115 - closed below on every path
        try:
            _keep_mode(written, sink.fileno())
            yield sink
            sink.flush()
            os.fsync(sink.fileno())
            sink.close()
            os.replace(temporary, written)
            fsync_directory(folder)
        except BaseException:
            with contextlib.suppress(OSError):  # closing flushes, which fails again on a full disk
                sink.close()
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise


def _protected(path: str, folder: str) -> bool:
    """Whether this process may not write the file at ``path`` but may rename another over it in ``folder`` (a file
    made read-only; on a read-only file system neither is allowed, which the write then says)."""
    effective = os.access in os.supports_effective_ids
    return not os.access(path, os.W_OK, effective_ids=effective) and os.access(folder, os.W_OK, effective_ids=effective)


def _keep_mode(final: str, descriptor: int) -> None:
    """Give the open file ``descriptor`` the permission bits of the file at ``final``, if there is one."""
    try:
        mode = os.stat(final).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISREG(mode):
        os.fchmod(descriptor, stat.S_IMODE(mode))
