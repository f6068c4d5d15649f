"""The counts of samples an HDF5 file of samples gives (a chain's ``sample_count``, its entry of ``/draws_done``),
checked before they slice a read: a whole number from 0 up to the rows each dataset of the chain holds.

A file changed by hand or by a stranger could count ``-1`` samples (read as ``x[:-1]``: the last draw lost), more
than its rows (read as all there are), ``2**62`` (shown as the draws written), or ``2.7``, ``"12"`` and ``True``
(taken as 2, 12 and 1); each is now a :class:`~jaxstow.errors.FormatError` naming the chain.

>>> import numpy as np
>>> checked_count(np.int64(3), [5, 4], name="run.h5", path="/chain~0")
3
>>> checked_count(np.int64(-1), [5], name="run.h5", path="/chain~0")
Traceback (most recent call last):
jaxstow.errors.FormatError: leaf '/chain~0' of run.h5: counts -1 samples, where its datasets hold 5 rows: ...
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxstow.errors import FormatError, excerpt
from jaxstow.io.hdf5_layout import DRAWS_DONE

__all__ = ["checked_count", "draws_done", "rows_of"]

_CHANGED = "the file was damaged, or changed by something other than jaxstow's collectors"


def draws_done(dataset: Any, *, name: str, refresh: bool = False) -> np.ndarray:
    """The entries of ``/draws_done`` (``dataset``, read now, after a ``refresh`` of it for a reader in SWMR mode):
    the samples written of each chain so far, a 1-D dataset of integers."""
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
    return np.asarray(dataset[()])


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


def checked_count(count: Any, rows: Sequence[int], *, name: str, path: str) -> int:
    """``count``, the samples the chain at ``path`` holds, if it is a whole number from 0 up to each of ``rows`` (the
    rows of the chain's datasets); else a :class:`~jaxstow.errors.FormatError` naming ``name`` and ``path``."""
    whole = isinstance(count, int | np.integer) and not isinstance(count, bool | np.bool_)
    most = min(rows, default=0)
    if not whole or not 0 <= count <= most:
        held = f"{most}" if len(set(rows)) <= 1 else f"{most} to {max(rows)}"
        shown = count.item() if isinstance(count, np.generic) else count
        raise FormatError(
            f"counts {excerpt(shown)} samples, where its datasets hold {held} rows: {_CHANGED}", file=name, path=path
        )
    return int(count)
