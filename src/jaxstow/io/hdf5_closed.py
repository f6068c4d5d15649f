"""The error of an ``h5py.File`` given to an ``HDF5Collector`` open and closed by its owner while the collector needs it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from jaxstow.errors import CollectorError

__all__ = ["closed_file", "named_if_closed"]


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


@contextlib.contextmanager
def named_if_closed(
    closed: Callable[[], bool], filename: str, failures: contextlib.AbstractContextManager[None]
) -> Iterator[None]:
    """``failures`` around the block, whose error is :func:`closed_file`'s where the caller's file ``filename`` was
    closed meanwhile (``closed()``): closed by its owner while the collector wrote into it, h5py says only that an
    identifier is not valid."""
    try:
        with failures:
            yield
    except Exception:
        if closed():
            raise closed_file(filename, "while its run went on", "until postprocess_save returns") from None
        raise
