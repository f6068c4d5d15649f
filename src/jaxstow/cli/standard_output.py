"""A command's standard output that cannot be written (a full disk under the file it is redirected to), named in
the one line of its error, and then let go so that the interpreter's flush at exit does not fail again.

>>> from jaxstow.cli.standard_output import output_failure
>>> output_failure(KeyError("w")) is None  # not standard output's
True
"""

from __future__ import annotations

import errno
import os
import stat
import sys

from jaxstow._storage.failures import storage_error
from jaxstow.errors import JaxstowError, StorageError

__all__ = ["discard_output", "output_failure"]

#: The errors of a write that the file it goes to meets, not the writer.
_WRITE_FAILURES = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO)


def output_failure(error: BaseException) -> StorageError | None:
    """The :class:`StorageError` naming the file standard output goes to, if ``error`` is its write's failure (an
    ``OSError`` of no file, of no space, quota or I/O, with standard output a file); standard output is then
    discarded. ``None`` for any other error (jaxstow's own name their files already)."""
    if not isinstance(error, OSError) or isinstance(error, JaxstowError) or error.filename is not None:
        return None
    if error.errno not in _WRITE_FAILURES or not _to_a_file():
        return None
    name = _output_name()
    discard_output()
    return storage_error(error, name, doing="write the command's output there")


def discard_output() -> None:
    """Point standard output at the null device, so that flushing it at exit does not fail again."""
    try:
        descriptor = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (captured output): nothing will be flushed
        return
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, descriptor)
    os.close(null)


def _to_a_file() -> bool:
    """Whether standard output goes to a file (or a device such as ``/dev/full``), not a terminal, pipe or socket."""
    try:
        descriptor = sys.stdout.fileno()
        mode = os.fstat(descriptor).st_mode
    except (AttributeError, OSError, ValueError):
        return False
    return stat.S_ISREG(mode) or (stat.S_ISCHR(mode) and not os.isatty(descriptor))


def _output_name() -> str:
    """The path of the file standard output is redirected to, else ``"standard output"``."""
    try:
        name = os.readlink(f"/proc/self/fd/{sys.stdout.fileno()}")
    except (AttributeError, OSError, ValueError):
        return "standard output"
    return name if name.startswith("/") else "standard output"
