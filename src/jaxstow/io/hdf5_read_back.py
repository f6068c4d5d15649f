"""Reading back the samples that an :class:`~jaxstow.io.HDF5Collector` given a path wrote, once its run closed the
file: from that file, never from one put in its place before ``postprocess_save`` returned.

The file is known by its :data:`~jaxstow.io.hdf5_layout.RUN_ID`, which a file started empty gets at random.

>>> import os, tempfile, h5py
>>> path = os.path.join(tempfile.mkdtemp(), "samples.h5")
>>> with h5py.File(path, "w", libver="latest") as file:
...     file.attrs["jaxstow_run_id"] = "ab" * 16
>>> with read_back(path, "ab" * 16) as file:
...     sorted(file.attrs)
['jaxstow_run_id']
>>> with read_back(path, "cd" * 16):
...     pass
Traceback (most recent call last):
jaxstow.errors.CollectorError: ...samples.h5 was deleted or replaced before postprocess_save returned (it is now the file of another run): ...
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from jaxstow.errors import CollectorError, FormatError, PathNotFoundError
from jaxstow.io.hdf5_layout import group_name, run_id_of
from jaxstow.io.swmr import open_for_reading

__all__ = ["read_back"]


@contextlib.contextmanager
def read_back(path: str, run_id: str | None, chain_ids: Sequence[int] = ()) -> Iterator[Any]:
    """The HDF5 file at ``path``, open for reading, if it is the file of ``run_id`` that the collector wrote; else a
    :class:`~jaxstow.errors.CollectorError` saying that the run's samples went with that file (deleted or replaced)."""
    try:
        file = open_for_reading(path, [group_name(chain_id) for chain_id in chain_ids])  # those read only
    except PathNotFoundError:
        raise _gone(path, "it is missing") from None
    except FormatError as error:
        raise _gone(path, "it is now no HDF5 file that can be read") from error
    with file:
        found = run_id_of(file, path)
        if found != run_id:
            raise _gone(
                path, "it is now HDF5 data of no jaxstow run" if found is None else "it is now the file of another run"
            )
        yield file


def _gone(path: str, found: str) -> CollectorError:
    return CollectorError(
        f"{path} was deleted or replaced before postprocess_save returned ({found}): the run's samples were written "
        "into the file the HDF5Collector had open, and went with it (a file in its place is left as it is); keep the "
        "file until postprocess_save returns, and run again",
        file=path,
    )
