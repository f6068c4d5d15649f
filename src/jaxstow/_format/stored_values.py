"""Tensors whose bytes numpy and jax read as the same values, checked as they are read from a file.

A bool is stored as a byte of 0 or 1, and a dtype narrower than a byte (int2, int4, float4_e2m1fn, float6, ...) in
the low bits of its byte, the bits above them zero (``docs/format.md``). A file made by hand may set other bits:
numpy then keeps them and jax drops them, so that one array reads as two sets of values (a float4 ``-0.0`` in numpy
and ``0.0`` in jax, ``x == True`` false where ``x`` prints ``True``). Such a tensor is refused.

>>> import ml_dtypes, numpy as np
>>> from jaxstow._format.stored_values import values_checked
>>> values_checked(np.array([1, -1], ml_dtypes.int4), file="f.jxs", path="w").tolist()
[1, -1]
>>> values_checked(np.array([0x18], np.uint8).view(ml_dtypes.int4), file="f.jxs", path="w")
Traceback (most recent call last):
jaxstow.errors.CorruptFileError: leaf 'w' of f.jxs: a tensor of int4 holds a byte with bits set above its 4 bits (0x18): ...
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from jaxstow._format.dtypes import dtype_from_name
from jaxstow.errors import CorruptFileError

__all__ = ["CHECKED_DTYPES", "all_values_checked", "values_checked"]

#: The dtypes narrower than a byte (those this ml_dtypes has), and their widths in bits.
_NARROW: dict[np.dtype, int] = {
    dtype: bits
    for name, bits in {
        "int2": 2, "uint2": 2, "int4": 4, "uint4": 4, "float4_e2m1fn": 4, "float6_e2m3fn": 6, "float6_e3m2fn": 6,
    }.items()
    if (dtype := dtype_from_name(name)) is not None
}  # fmt: skip
#: The dtypes whose bytes :func:`values_checked` checks.
CHECKED_DTYPES: frozenset[np.dtype] = frozenset({np.dtype(np.bool_), *_NARROW})


def values_checked(array: np.ndarray, *, file: str, path: str) -> np.ndarray:
    """``array``, unless it is of bools whose bytes are not all 0 or 1, or of a dtype narrower than a byte whose
    bytes set bits above its width: a :class:`~jaxstow.errors.CorruptFileError` then, naming ``file`` and ``path``."""
    if not array.size:
        return array
    if array.dtype == np.bool_:
        if int(array.reshape(-1).view(np.uint8).max()) > 1:
            raise CorruptFileError("a bool tensor holds bytes other than 0 and 1", file=file, path=path)
        return array
    bits = _NARROW.get(array.dtype)
    if bits is not None:
        stored = array.reshape(-1).view(np.uint8)
        if int(stored.max()) >> bits:  # a bit above the width set: the byte is 2**bits or more (no copy made)
            first = int(stored[np.flatnonzero(stored >> bits)[0]])
            raise CorruptFileError(
                f"a tensor of {array.dtype} holds a byte with bits set above its {bits} bits ({first:#04x}): a file "
                "written by jaxstow keeps them zero, and numpy and jax would read different values from it",
                file=file,
                path=path,
            )
    return array


def all_values_checked(
    arrays: Sequence[np.ndarray], dtypes: Sequence[np.dtype], *, file: str, paths: Sequence[str]
) -> None:
    """:func:`values_checked` for each of ``arrays`` (of ``dtypes``, at ``paths``) whose dtype is one of
    :data:`CHECKED_DTYPES`."""
    for array, dtype, path in zip(arrays, dtypes, paths, strict=True):
        if dtype in CHECKED_DTYPES:
            values_checked(array, file=file, path=path)
