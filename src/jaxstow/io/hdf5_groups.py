"""The groups of HDF5 files that the :class:`~jaxstow.io.HDF5Collector`\\ s of this process write, each claimed by
one: the chain ids of every collector start at 0, so a second collector given the same open file would otherwise
take the group of another's chain not yet finished for one of its own, and delete its samples.

>>> import os, tempfile, h5py
>>> from jaxstow.io.hdf5_groups import claim, give_up
>>> file = h5py.File(os.path.join(tempfile.mkdtemp(), "samples.h5"), "w")
>>> class Writer: ...
>>> first, second = Writer(), Writer()
>>> claim(file, "chain~0", first)
>>> claim(file, "chain~0", second)
Traceback (most recent call last):
...
jaxstow.errors.CollectorError: ...samples.h5: chain~0 holds the samples of another HDF5Collector's run, which is not over: give each collector a file of its own, or end one run (postprocess_save) before the other's init_save
>>> give_up(file.filename, "chain~0", first)
>>> claim(file, "chain~0", second)
>>> file.close()
"""

from __future__ import annotations

import os
import weakref
from typing import Any

from jaxstow.errors import CollectorError

__all__ = ["claim", "give_up"]

#: The writer of each claimed group and the file it writes, by the file's real path and the group's name; a writer
#: gone, or whose file is closed (its process would have ended), holds nothing.
_WRITERS: dict[tuple[str, str], tuple[weakref.ref[Any], weakref.ref[Any]]] = {}


def claim(file: Any, group: str, writer: Any) -> None:
    """Claim ``group`` of ``file`` (an open ``h5py.File``) for ``writer``; a
    :class:`~jaxstow.errors.CollectorError` if another writer holds it in a file still open."""
    key = (os.path.realpath(file.filename), group)
    other, other_file = (ref() for ref in _WRITERS.get(key, (_gone, _gone)))
    if other is not None and other is not writer and other_file:
        raise CollectorError(
            f"{file.filename}: {group} holds the samples of another HDF5Collector's run, which is not over: give each "
            "collector a file of its own, or end one run (postprocess_save) before the other's init_save"
        )
    _WRITERS[key] = (weakref.ref(writer), weakref.ref(file))


def give_up(filename: str, group: str, writer: Any) -> None:
    """Free ``group`` of the file named ``filename``, if ``writer`` (or a writer gone) holds it."""
    key = (os.path.realpath(filename), group)
    held = _WRITERS.get(key)
    if held is not None and held[0]() in (writer, None):
        del _WRITERS[key]


def _gone() -> None:
    """A reference to nothing: the writer and file of a group never claimed."""
    return None
