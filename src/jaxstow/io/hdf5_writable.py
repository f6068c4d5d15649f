"""The ``h5py.File`` that jaxstow's writers of HDF5 samples write: SWMR-capable, holding no dataset chunk in memory,
and none of its samples in another file (:mod:`~jaxstow.io.hdf5_links`), whether they open it or are given it.

HDF5 keeps the chunks a write changed in a cache, written when a dataset closes. Where the disk is full, that close
fails after HDF5 has freed the dataset but kept its identifier: h5py's close of the file stops there, and the process
crashes when the file and those datasets are closed again, at its exit (a segmentation fault, even where the caller
caught the error). Without the cache a write reaches the file at once, and fails there with the error that names it;
every dataset then closes, with the file, when the run ends, failed or not. The writers flush after each block of
rows anyway, so the cache would hold a chunk only until then.

>>> import os, tempfile
>>> from jaxstow.io.hdf5_writable import writable_file
>>> with writable_file(os.path.join(tempfile.mkdtemp(), "run.h5"), "w") as file:
...     file.id.get_access_plist().get_cache()[2]   # the chunk cache's bytes
0
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from jaxstow._util.optional import require
from jaxstow.errors import ArgumentError
from jaxstow.io.hdf5_links import refuse_stored_elsewhere

__all__ = ["given_file", "writable_file"]


def writable_file(name: str, mode: str, checking: Collection[str] | None = None) -> Any:
    """The HDF5 file at ``name`` opened in ``mode`` (``"w"``, ``"a"``) to write samples: in the latest format, which
    SWMR mode needs; without HDF5's file locks (a :class:`~jaxstow.io.swmr.WriterLock` keeps other writers out); its
    datasets without a chunk cache, so that no dataset holds data left to write when it closes (see above); what
    it holds (``checking``: those of the root group's objects the run writes) in it (:mod:`~jaxstow.io.hdf5_links`)."""
    h5py = require("h5py", extra="h5py", purpose=f"writing {name}")
    file = h5py.File(name, mode, libver="latest", locking=False, rdcc_nbytes=0)
    try:
        refuse_stored_elsewhere(file, name, checking)  # a file continued: what its run wrote must be in it
    except BaseException:
        file.close()
        raise
    return file


def given_file(file: Any) -> Any:
    """``file``, an ``h5py.File`` that a caller gave a collector to write samples into, if it is one, open for
    writing, and holding none of the collector's objects in another file; else an :class:`~jaxstow.errors.ArgumentError`
    (a :class:`~jaxstow.errors.FormatError` for the last)."""
    h5py = require("h5py", extra="h5py", purpose="HDF5Collector")
    if not isinstance(file, h5py.File):
        raise ArgumentError(f"HDF5Collector needs a path or an open h5py.File, got {type(file).__name__}")
    if file.mode == "r":
        raise ArgumentError(f"{file.filename} is open read-only: open it with mode 'a' or 'w' to write samples")
    refuse_stored_elsewhere(file, file.filename)
    return file
