"""A whole restore of a version 3 native file, read by columns.

Every stored leaf in one pass over the slot table, with no Python object per leaf but the array itself, and every
checksum compared at once.

>>> import io, numpy as np, jaxstow
>>> from jaxstow._read.column_reads import read_all
>>> buffer = io.BytesIO()
>>> jaxstow.save(buffer, {"w": np.arange(3.0), "n": 2})
>>> with jaxstow.open(io.BytesIO(buffer.getvalue())) as opened:  # a Reader is an OpenedFile
...     print(read_all(opened))
[2, array([0., 1., 2.])]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxstow._format.leaves import decode_value_entry
from jaxstow._format.tensor_reads import read_tensors
from jaxstow._format.tensor_table import SlotTable
from jaxstow._read.opened import OpenedFile
from jaxstow.errors import CorruptFileError

__all__ = ["read_all"]


def read_all(opened: OpenedFile) -> list[Any] | None:
    """Every leaf of a version 3 native file in leaf order (arrays as numpy, verified), read by columns.

    ``None`` for a file this cannot read so (another container or version, sharded leaves, a memory map).
    """
    container, columns = opened.container, opened.container.columns
    slots = container.slots
    source = getattr(container, "source", None)
    if (
        columns is None
        or not isinstance(slots, SlotTable)
        or source is None
        or opened.memory_mapped
        or "s" in columns.kinds
        or "p" in columns.kinds
    ):
        return None
    paths = columns.stored_paths()
    rows = np.fromiter(map(slots.index.__getitem__, paths), np.int64, len(paths))
    row_list = rows.tolist()
    dtypes = [slots.dtypes[row] for row in row_list]
    shapes = [slots.shapes[row] for row in row_list]
    positions = np.flatnonzero(columns.stored).tolist()
    special = [(k, i) for k, i in enumerate(positions) if i in columns.entries or columns.kinds[i] != "a"]
    leaves = {k: opened.stored[columns.paths[i]] for k, i in special}
    for k, leaf in leaves.items():  # leaves stored as raw bytes have their dtype and shape in their details
        dtypes[k], shapes[k] = leaf.dtype, leaf.shape
    nbytes = slots.nbytes[rows]
    opened.on_read(int(nbytes.sum()))
    digests: list[str] = []
    arrays: list[Any] = read_tensors(source, slots.offsets[rows], nbytes, dtypes, shapes, digests)
    if digests != columns.checksums:
        k = next(k for k, (found, wanted) in enumerate(zip(digests, columns.checksums, strict=True)) if found != wanted)
        raise CorruptFileError(
            f"checksum mismatch (expected xxh3 {columns.checksums[k]}, found {digests[k]}): the file is corrupt",
            file=opened.file,
            path=paths[k],
        )
    for k, leaf in leaves.items():
        arrays[k] = opened.as_leaf(leaf, arrays[k])
    if len(positions) == len(columns.paths):
        return arrays
    values: list[Any] = [None] * len(columns.paths)
    for i, array in zip(positions, arrays, strict=True):
        values[i] = array
    for i, entry in columns.entries.items():
        if entry["kind"] == "value":
            values[i] = decode_value_entry(entry, file=opened.file)
    return values
