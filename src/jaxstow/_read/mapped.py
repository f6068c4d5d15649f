"""A stored leaf read from a memory map of its local file: a view of its bytes, checked against the file as it is now.

>>> import os, tempfile, numpy as np, jaxstow
>>> path = os.path.join(tempfile.mkdtemp(), "model.jxs")
>>> jaxstow.save(path, {"w": np.arange(3.0)})
>>> with jaxstow.open(path, mmap=True) as reader:
...     reader.read("w", np.s_[1:])
array([1., 2.])
"""

from __future__ import annotations

import mmap
from collections.abc import Callable

import numpy as np

from jaxstow._format.leaves import StoredLeaf
from jaxstow._format.shards import Box, Stored
from jaxstow._format.tensor_reads import TensorSlot
from jaxstow._read.block_verified import verify_box_blocks
from jaxstow._storage.sources import LocalFile
from jaxstow.errors import TruncatedFileError, excerpt

__all__ = ["mapped_leaf"]


def mapped_leaf(
    mapped: mmap.mmap | None,
    slot: TensorSlot,
    source: LocalFile,
    leaf: Stored,
    box: Box | None,
    *,
    file: str,
    check_open: Callable[[str], None],
) -> np.ndarray:
    """A view of ``leaf`` (its tensor at ``slot`` of ``source``) in ``mapped``, the blocks ``box`` touches verified
    (:func:`~jaxstow._read.block_verified.verify_box_blocks`, where it has block checksums).

    A file cut short since it was opened is a :class:`TruncatedFileError` (not a view whose pages end the process with
    SIGBUS), one written in place since a :class:`~jaxstow.errors.StorageError` (not its new bytes); a map closed
    meanwhile (by another thread) is what ``check_open`` raises.
    """
    with source.in_use(checked=False) as descriptor:  # closed: a ClosedError
        now = source.status(descriptor)
        if now.st_size < slot.offset + slot.nbytes:
            raise TruncatedFileError(
                f"the file now has {now.st_size} bytes, and the leaf's end is at byte {slot.offset + slot.nbytes}: "
                "it was cut short since it was opened",
                file=file,
                path=leaf.path,
            )
        source.check_unchanged(now)
        try:
            view: np.ndarray = np.frombuffer(mapped, np.uint8, slot.nbytes, slot.offset)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            check_open(f"reading leaf {excerpt(leaf.path)}")
            raise
    if box is not None and isinstance(leaf, StoredLeaf):
        verify_box_blocks(view, leaf.dtype, leaf.shape, box, leaf, file=file, path=leaf.path)
    return view.view(leaf.dtype).reshape(leaf.shape)
