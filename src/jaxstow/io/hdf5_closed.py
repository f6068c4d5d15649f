"""The error of an ``h5py.File`` given to an ``HDF5Collector`` open and closed by its owner while the collector needs it."""

from __future__ import annotations

from jaxstow.errors import CollectorError

__all__ = ["closed_file"]


def closed_file(filename: str, when: str, keep: str) -> CollectorError:
    """The :class:`~jaxstow.errors.CollectorError` of the caller's file ``filename``, closed ``when``, that says to keep
    it open (``keep``: how long) or to give the collector the path.

    >>> print(closed_file("samples.h5", "after its last run", "for every run"))
    the h5py.File samples.h5 given to HDF5Collector was closed after its last run: keep the file open for every run, or give HDF5Collector the path instead, which it opens for each run and closes at its end
    """
    return CollectorError(
        f"the h5py.File {filename} given to HDF5Collector was closed {when}: keep the file open {keep}, or give "
        "HDF5Collector the path instead, which it opens for each run and closes at its end"
    )
