"""h5py's errors of an HDF5 file it cannot read (damaged, cut short by a write that failed), which quote no errno, as
a :class:`~jaxstow.errors.CollectorError` that names the file and leaves it as it is.

>>> import os, tempfile
>>> from jaxstow.io.hdf5_damage import damage_refused
>>> path = os.path.join(tempfile.mkdtemp(), "run.h5")
>>> try:
...     with damage_refused(path, "write the run to another file"):
...         raise OSError("Unable to synchronously open file (truncated file: eof = 20000, stored_eof = 29184)")
... except Exception as error:
...     print(error)
/.../run.h5 cannot be read as an HDF5 file (truncated file: eof = 20000, stored_eof = 29184): the file is damaged, or not an HDF5 file; it is left as it is: move it away to start the run over, or write the run to another file
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from jaxstow._storage.failures import errno_of
from jaxstow.errors import CollectorError, JaxstowError

__all__ = ["damage_refused"]


@contextlib.contextmanager
def damage_refused(name: str, fix: str) -> Iterator[None]:
    """h5py's errors in the block of a file it cannot read, which quote no errno, as a CollectorError naming ``name``
    and saying what else to do (``fix``); a system call's failure, which quotes one, is left to the caller."""
    try:
        yield
    except JaxstowError:
        raise
    except (OSError, RuntimeError) as error:
        if errno_of(error) is not None:
            raise  # a system call's failure: the caller's StorageError names it
        reason = str(error).split("(", 1)[-1].rstrip(")") if "(" in str(error) else str(error)
        raise CollectorError(
            f"{name} cannot be read as an HDF5 file ({reason}): the file is damaged, or not an HDF5 file; it is left "
            f"as it is: move it away to start the run over, or {fix}",
            file=name,
        ) from None
