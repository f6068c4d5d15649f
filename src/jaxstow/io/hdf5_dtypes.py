"""How an :class:`~jaxstow.io.HDF5Collector`'s file holds the samples of a dtype that HDF5 lacks: those of
``ml_dtypes`` (``bfloat16``, the ``float8`` and ``int4`` families, ...), which h5py would store as opaque bytes.

Such a leaf's dataset holds the bits of each value as the unsigned integer of its width, and names its dtype in the
attribute :data:`DTYPE_ATTRIBUTE`; every reader of jaxstow's gives the values back in that dtype.

>>> import os, tempfile, h5py, ml_dtypes, numpy as np
>>> values = np.array([1.5, -2.0], ml_dtypes.bfloat16)
>>> with h5py.File(os.path.join(tempfile.mkdtemp(), "samples.h5"), "w") as file:
...     dataset = file.create_dataset("x", data=as_stored(values))
...     mark(dataset, values.dtype)
...     restored = as_sample(dataset, dataset[()])
...     dataset.dtype, sample_dtype(dataset) == values.dtype, restored.dtype == values.dtype, restored.tolist()
(dtype('uint16'), True, True, [1.5, -2.0])
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from jaxstow.errors import FormatError

__all__ = ["DTYPE_ATTRIBUTE", "as_sample", "as_stored", "mark", "sample_dtype", "stored_dtype"]

#: The attribute of a dataset whose values are of a dtype of ``ml_dtypes``: the dtype's name.
DTYPE_ATTRIBUTE = "jaxstow_dtype"


def _of_ml_dtypes(dtype: np.dtype[Any]) -> bool:
    # By its type, not its kind: ml_dtypes gives some of its dtypes the kind "f" (float8_e5m2), which h5py refuses.
    return dtype.names is None and dtype.type is getattr(ml_dtypes, dtype.name, None)


def stored_dtype(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """The dtype a dataset holds a leaf of ``dtype`` in: ``dtype``, or for one of ``ml_dtypes`` the unsigned integer
    of its width."""
    return np.dtype(f"u{dtype.itemsize}") if _of_ml_dtypes(dtype) else dtype


def as_stored(values: np.ndarray) -> np.ndarray:
    """``values`` as the dataset of their dtype holds them (a view)."""
    return values.view(stored_dtype(values.dtype))


def mark(dataset: Any, dtype: np.dtype[Any]) -> None:
    """Name ``dtype`` in the attributes of ``dataset``, made to hold leaves of it, if the dataset's dtype is another."""
    if stored_dtype(dtype) != dtype:
        dataset.attrs[DTYPE_ATTRIBUTE] = dtype.name


def sample_dtype(dataset: Any) -> np.dtype[Any]:
    """The dtype of the samples that ``dataset`` holds."""
    name = dataset.attrs.get(DTYPE_ATTRIBUTE)
    if name is None:
        held: np.dtype[Any] = np.dtype(dataset.dtype)
        return held
    name = name if isinstance(name, str) else name.decode()
    dtype = getattr(ml_dtypes, name, None)
    if dtype is None:
        raise FormatError(
            f"holds samples of the dtype {name}, which ml_dtypes {ml_dtypes.__version__} lacks: upgrade ml_dtypes",
            file=dataset.file.filename,
            path=dataset.name,
        )
    restored: np.dtype[Any] = np.dtype(dtype)
    return restored


def as_sample(dataset: Any, values: np.ndarray) -> np.ndarray:
    """``values`` read from ``dataset`` in the dtype of its samples (a view)."""
    dtype = sample_dtype(dataset)
    return values if values.dtype == dtype else values.view(dtype)
