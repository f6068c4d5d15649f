"""The counts of samples an HDF5 file of samples gives (a chain's ``sample_count``, its entry of ``/draws_done``),
checked before they slice a read: a whole number from 0 up to the rows each dataset of the chain holds (a finished
chain's datasets, trimmed when it finished, hold exactly its count), the rows it counts stored in the file.

A file changed by hand or by a stranger could count ``-1`` samples (read as ``x[:-1]``: the last draw lost), more
than its rows (read as all there are), ``2**62`` (shown as the draws written), or ``2.7``, ``"12"`` and ``True``
(taken as 2, 12 and 1); a finished chain could count fewer samples than it holds (its last draws dropped); a dataset
could declare ``2**40`` rows that the file never stored (read as terabytes of its fill value). Each is now a
:class:`~jaxstow.errors.FormatError` naming the chain or dataset.

>>> import numpy as np
>>> checked_count(np.int64(3), [5, 4], name="run.h5", path="/chain~0")
3
>>> checked_count(np.int64(-1), [5], name="run.h5", path="/chain~0")
Traceback (most recent call last):
jaxstow.errors.FormatError: leaf '/chain~0' of run.h5: counts -1 samples, where its datasets hold 5 rows: ...
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxstow.errors import FormatError, excerpt
from jaxstow.io.hdf5_layout import DRAWS_DONE

__all__ = ["checked_count", "draws_done", "refuse_unstored", "rows_of"]

_CHANGED = "the file was damaged, or changed by something other than jaxstow's collectors"


def draws_done(dataset: Any, chains: Sequence[int], *, name: str, refresh: bool = False) -> dict[int, Any]:
    """The entries of ``/draws_done`` (``dataset``, read now, after a ``refresh`` of it for a reader in SWMR mode) of
    the ``chains`` it counts: the samples written of each so far, in a 1-D dataset of integers (only those entries
    are read, however long the dataset claims to be)."""
    shape, dtype = getattr(dataset, "shape", None), getattr(dataset, "dtype", None)
    if shape is None or len(shape) != 1 or dtype is None or dtype.kind not in "iu":
        what = f"{dtype}{list(shape)}" if shape is not None and dtype is not None else type(dataset).__name__
        raise FormatError(
            f"is {what}, where a collector counts each chain's samples written in a 1-D dataset of integers: {_CHANGED}",
            file=name,
            path=f"/{DRAWS_DONE}",
        )
    if refresh:
        dataset.refresh()
    counted = sorted(chain for chain in set(chains) if chain < shape[0])
    return dict(zip(counted, dataset[counted] if counted else [], strict=True))


def rows_of(dataset: Any, *, name: str) -> int:
    """The rows (samples) ``dataset`` holds: its first axis; a scalar or empty dataset holds none, and is refused."""
    shape = dataset.shape
    if not shape:  # () for a scalar, None for h5py.Empty
        raise FormatError(
            f"is a dataset of no rows (shape {shape}), where a collector keeps a variable's samples along the first "
            f"axis: {_CHANGED}",
            file=name,
            path=dataset.name,
        )
    return int(shape[0])


def checked_count(count: Any, rows: Sequence[int], *, name: str, path: str, finished: bool = False) -> int:
    """``count``, the samples the chain at ``path`` holds, if it is a whole number from 0 up to each of ``rows`` (the
    rows of the chain's datasets; each of them, for a ``finished`` chain); else a
    :class:`~jaxstow.errors.FormatError` naming ``name`` and ``path``."""
    whole = isinstance(count, int | np.integer) and not isinstance(count, bool | np.bool_)
    most = min(rows, default=0)
    held = f"{most}" if len(set(rows)) <= 1 else f"{most} to {max(rows)}"
    shown = count.item() if isinstance(count, np.generic) else count
    if not whole or not 0 <= count <= most:
        raise FormatError(
            f"counts {excerpt(shown)} samples, where its datasets hold {held} rows: {_CHANGED}", file=name, path=path
        )
    if finished and any(row != count for row in rows):
        raise FormatError(
            f"counts {excerpt(shown)} samples, where a finished chain's datasets, trimmed to its samples when it "
            f"finished, hold {held} rows: {_CHANGED}",
            file=name,
            path=path,
        )
    return int(count)


def refuse_unstored(dataset: Any, rows: int, *, name: str) -> None:
    """Refuse ``dataset`` if the file does not store its first ``rows`` rows: every chunk they cover (a collector
    writes each row it counts), or the bytes they take where the dataset is not chunked. A dataset can declare any
    shape; what the file stores bounds what reading its rows allocates."""
    shape, chunks = dataset.shape, dataset.chunks
    if not rows or not math.prod(shape[1:]):
        return
    if chunks is None:
        needed, stored, unit = (
            rows * math.prod(shape[1:]) * dataset.dtype.itemsize,
            dataset.id.get_storage_size(),
            "bytes",
        )
    else:
        covering = [
            -(-rows // chunks[0]),
            *(-(-size // chunk) for size, chunk in zip(shape[1:], chunks[1:], strict=True)),
        ]
        needed, stored, unit = math.prod(covering), dataset.id.get_num_chunks(), "chunks"
    if stored < needed:
        raise FormatError(
            f"counts {rows:,} samples of shape {list(shape[1:])}, which take {needed:,} {unit}, where the file stores "
            f"{stored:,}: {_CHANGED}",
            file=name,
            path=dataset.name,
        )
