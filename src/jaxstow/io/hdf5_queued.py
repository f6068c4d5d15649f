"""The error of an :class:`~jaxstow.io.HDF5Collector`'s write that failed on its writer thread.

Such a write (a block of samples, a checkpoint) fails after the call that queued it has returned: the collector's next
call raises it, whatever that call does. So the error names the write that failed (the rows and chains it held, or
the checkpoint) and the file, keeps the failure as its cause, and says how the run goes on from there.

>>> import numpy as np
>>> from jaxstow.io.hdf5_queued import queued, rows_of
>>> def write():
...     raise OSError("the disk failed")
>>> rows = rows_of({0: (32, [np.zeros((8, 2))])}, "samples.h5")
>>> job = queued(rows, write, filename="samples.h5", checkpoint=None, own_file=True)
>>> try:
...     job()
... except Exception as error:
...     print(error)
the queued write of samples 32..39 of chain 0 to samples.h5 failed: the disk failed; the run has no checkpoint to continue from: run it again to start it over
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jaxstow.errors import CollectorError, failed

__all__ = ["checkpoints_of", "queued", "rows_of"]


def rows_of(blocks: Mapping[int, tuple[int, Sequence[Any]]], filename: str) -> str:
    """What a write of blocks (chain id -> first row, each leaf's rows) to ``filename`` holds, as its failure names
    it."""
    rows = [f"{first}..{first + len(values[0]) - 1} of chain {chain}" for chain, (first, values) in blocks.items()]
    return f"samples {', '.join(rows)} to {filename}"


def checkpoints_of(checkpoints: Mapping[int, Any], path: str, filename: str) -> str:
    """What the commit of ``checkpoints`` (chain id -> its checkpoint, with its ``step``) to ``path``, after the
    samples before them to ``filename``, writes, as its failure names it."""
    chains = ", ".join(f"chain {chain} at step {checkpoint.step}" for chain, checkpoint in checkpoints.items())
    return f"the checkpoint of {chains} to {path} (after the samples before it, to {filename})"


def queued(
    what: str, job: Callable[[], None], *, filename: str, checkpoint: str | None, own_file: bool
) -> Callable[[], None]:
    """``job``, whose exception becomes a :class:`~jaxstow.errors.CollectorError` (a ``CollectorStorageError`` for a
    storage failure) saying that ``what`` was not written and how to resume: from ``checkpoint``, the path of the
    chains' checkpoints, where one was committed, the run run again as it was (``own_file``: the collector opened its
    file itself) or with its file, ``filename``, closed, its writer flags cleared and opened with mode ``"a"``."""

    def run() -> None:
        try:
            job()
        except Exception as error:
            again = (
                "run it again"
                if own_file
                else (
                    f"close {filename}, clear the writer flags its failed close may leave "
                    f"(jaxstow.io.swmr.clear_stale_writer({filename!r})), open it with mode 'a' and run it again"
                )
            )
            if checkpoint is not None and os.path.exists(checkpoint):
                resume = (
                    f"once that is fixed, {again}: it continues from the last checkpoint, in {checkpoint} (or says "
                    "that the failed write left the file cut short)"
                )
            else:
                resume = "the run has no checkpoint to continue from: run it again to start it over"
            raise failed(CollectorError, f"the queued write of {what} failed: {error}; {resume}", error) from error

    return run
