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

from typing import Any, NoReturn

import ml_dtypes
import numpy as np

from jaxstow.errors import FormatError, excerpt

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
    """The dtype of the samples that ``dataset`` holds: its own, a number's (bool, integer, float or complex), or the
    dtype of ``ml_dtypes`` its :data:`DTYPE_ATTRIBUTE` names, held as the unsigned integer of that dtype's width.

    Anything else (strings, records, references; a name that is no dtype of ``ml_dtypes``, or one of another width
    than the dataset's, whose bytes it would misread) is a :class:`~jaxstow.errors.FormatError`: no collector writes it.
    """
    held: np.dtype[Any] = np.dtype(dataset.dtype)
    name = dataset.attrs.get(DTYPE_ATTRIBUTE)
    if name is None:
        if held.kind not in "biufc" or held.names is not None or held.subdtype is not None:
            _refuse(dataset, f"holds samples of the dtype {held}, which no collector writes (it writes numbers)")
        return held
    if isinstance(name, bytes):
        name = name.decode("utf-8", "backslashreplace")
    if not isinstance(name, str):
        _refuse(dataset, f"names its samples' dtype by {excerpt(name)}, which is no dtype's name")
    dtype = getattr(ml_dtypes, name, None)
    if dtype is None and name.isidentifier() and not name.startswith("_"):
        _refuse(
            dataset, f"holds samples of the dtype {name}, which ml_dtypes {ml_dtypes.__version__} lacks: upgrade it"
        )
    restored = np.dtype(dtype) if isinstance(dtype, type) and issubclass(dtype, np.generic) else None
    if restored is None or not _of_ml_dtypes(restored):
        _refuse(dataset, f"names its samples' dtype {excerpt(name)}, which is none of ml_dtypes'")
    elif held != stored_dtype(restored):
        _refuse(dataset, f"holds {held}, where samples of {restored} are held as {stored_dtype(restored)}")
    return restored


def _refuse(dataset: Any, problem: str) -> NoReturn:
    raise FormatError(
        f"{problem}: the file was damaged, or changed by something other than jaxstow's collectors",
        file=dataset.file.filename,
        path=dataset.name,
    )


def as_sample(dataset: Any, values: np.ndarray) -> np.ndarray:
    """``values`` read from ``dataset`` in the dtype of its samples (a view)."""
    dtype = sample_dtype(dataset)
    return values if values.dtype == dtype else values.view(dtype)
