"""How long an HDF5 reader in SWMR mode retries a structure that fails its checksum: a bounded time, not for ever.

A reader in SWMR mode reads metadata a writer may be rewriting, so HDF5 reads a structure whose checksum fails again,
waiting twice as long before each try; its default of 100 tries waits for ever on a file that is simply damaged (a
flipped byte in an object header hangs ``h5py.File(path, "r", swmr=True).visit(...)``). :func:`reading_access`
gives the file access property list that jaxstow's readers open with: at most :data:`METADATA_READ_ATTEMPTS` tries,
tens of milliseconds in all, after which HDF5 raises and the caller may open the file again. h5py does not expose the
setting, so it is set through the HDF5 library h5py has loaded; where that library cannot be found (not Linux), the
list keeps HDF5's default.

>>> import h5py
>>> from jaxstow.io.hdf5_retries import reading_access
>>> isinstance(reading_access(), h5py.h5p.PropFAID)
True
"""

from __future__ import annotations

import ctypes
import functools
import re
from collections.abc import Callable
from typing import Any

from jaxstow._util.optional import require

__all__ = ["METADATA_READ_ATTEMPTS", "reading_access"]

#: Tries of a metadata read in SWMR mode: about 20 ms of waiting in all (HDF5's default, 100, never ends).
METADATA_READ_ATTEMPTS = 24

_HDF5_LIBRARY = re.compile(r"\s(/\S*/libhdf5[^/]*\.so[^/]*)$")  # h5py's own copy, or a system's libhdf5_serial.so


def reading_access() -> Any:
    """A new file access property list for opening an HDF5 file to read, its metadata read attempts bounded."""
    h5py = require("h5py", extra="h5py", purpose="reading an HDF5 file")
    access = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    set_attempts = _attempts_setter()
    if set_attempts is not None:
        set_attempts(access.id, METADATA_READ_ATTEMPTS)
    return access


@functools.cache
def _attempts_setter() -> Callable[[int, int], int] | None:
    """``H5Pset_metadata_read_attempts`` of the HDF5 library loaded in this process, or ``None`` if none is found."""
    require("h5py", extra="h5py", purpose="reading an HDF5 file")  # loads the library
    try:
        with open("/proc/self/maps") as maps:
            paths = {match.group(1) for line in maps if (match := _HDF5_LIBRARY.search(line.rstrip("\n")))}
    except OSError:
        return None
    for path in sorted(paths):
        function = getattr(ctypes.CDLL(path), "H5Pset_metadata_read_attempts", None)
        if function is not None:
            function.argtypes = [ctypes.c_int64, ctypes.c_uint]
            function.restype = ctypes.c_int
            return function  # type: ignore[no-any-return]
    return None
