"""The ``h5py.File`` that jaxstow's writers of HDF5 samples open: SWMR-capable, and holding no dataset chunk in memory.

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

from typing import Any

from jaxstow._util.optional import require

__all__ = ["writable_file"]


def writable_file(name: str, mode: str) -> Any:
    """The HDF5 file at ``name`` opened in ``mode`` (``"w"``, ``"a"``) to write samples: in the latest format, which
    SWMR mode needs; without HDF5's file locks (a :class:`~jaxstow.io.swmr.WriterLock` keeps other writers out); its
    datasets without a chunk cache, so that no dataset holds data left to write when it closes (see above)."""
    h5py = require("h5py", extra="h5py", purpose=f"writing {name}")
    return h5py.File(name, mode, libver="latest", locking=False, rdcc_nbytes=0)
