"""The dtype table: jaxstow's dtype names, their numpy dtypes and their safetensors codes.

Dtypes that safetensors has no code for (int4, most float8 variants, complex128, ...) are stored as raw bytes
(``U8``) and the manifest keeps their true dtype.

>>> from jaxstow._format.dtypes import dtype_from_name, safetensors_code
>>> dtype_from_name("bfloat16")
dtype(bfloat16)
>>> safetensors_code(dtype_from_name("bfloat16")), safetensors_code(dtype_from_name("int4"))
('BF16', None)
"""

from __future__ import annotations

from typing import TypeGuard

import ml_dtypes
import numpy as np

from jaxstow.errors import FormatError, excerpt

__all__ = [
    "MAX_ARRAY_BYTES",
    "MAX_AXES",
    "PACKED_CODES",
    "READ_CODES",
    "READ_ONLY_CODES",
    "SAFETENSORS_CODES",
    "dtype_from_code",
    "dtype_from_name",
    "is_shape",
    "name_of_dtype",
    "plain_code",
    "safetensors_code",
    "checked_shape",
    "unstored_dtype_advice",
]

_NAMES = (
    "bool",
    "int8", "int16", "int32", "int64",
    "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64",
    "complex64", "complex128",
    "bfloat16",
    "float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz", "float8_e4m3fn", "float8_e4m3fnuz",
    "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
    "float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn",
    "int2", "int4", "uint2", "uint4",
)  # fmt: skip


def _dtype_named(name: str) -> np.dtype | None:
    """numpy's dtype of that name, or ml_dtypes' (whose newer dtypes an older ml_dtypes lacks: ``None``)."""
    found = getattr(ml_dtypes, name, None)
    if found is not None:
        return np.dtype(found)  # type: ignore[no-any-return]
    try:
        return np.dtype(name)
    except TypeError:
        return None


_DTYPES: dict[str, np.dtype] = {name: dtype for name in _NAMES if (dtype := _dtype_named(name)) is not None}


def _codes(names: dict[str, str]) -> dict[str, np.dtype]:
    """The codes of ``names`` whose dtype this numpy and ml_dtypes have, and their dtypes."""
    return {code: _DTYPES[name] for code, name in names.items() if name in _DTYPES}


#: safetensors dtype codes and the dtypes they stand for.
SAFETENSORS_CODES: dict[str, np.dtype] = _codes(
    {
        "BOOL": "bool",
        "U8": "uint8",
        "I8": "int8",
        "U16": "uint16",
        "I16": "int16",
        "F16": "float16",
        "BF16": "bfloat16",
        "U32": "uint32",
        "I32": "int32",
        "F32": "float32",
        "U64": "uint64",
        "I64": "int64",
        "F64": "float64",
        "C64": "complex64",
        "F8_E5M2": "float8_e5m2",
        "F8_E4M3": "float8_e4m3fn",
    }
)
_CODE_OF = {dtype: code for code, dtype in SAFETENSORS_CODES.items()}
#: Newer safetensors codes that a reader maps (where this ml_dtypes has the dtype) but a writer never uses: their
#: dtypes are written as raw bytes, which readers that predate the codes still read.
READ_ONLY_CODES: dict[str, np.dtype] = _codes(
    {"F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz", "F8_E8M0": "float8_e8m0fnu"}
)
#: Every code a reader maps to a dtype.
READ_CODES: dict[str, np.dtype] = {**SAFETENSORS_CODES, **READ_ONLY_CODES}
#: Packed codes (several elements to a byte) that safetensors knows and no reader here unpacks.
PACKED_CODES = ("F4", "F6_E2M3", "F6_E3M2")


def dtype_from_name(name: str) -> np.dtype | None:
    """The dtype a manifest names, or ``None`` for a name outside the table (never an object dtype)."""
    return _DTYPES.get(name)


def dtype_from_code(code: str) -> np.dtype | None:
    """The dtype of a safetensors code (one written, or one of :data:`READ_ONLY_CODES`), or ``None`` for another."""
    return READ_CODES.get(code)


def safetensors_code(dtype: np.dtype) -> str | None:
    """The safetensors code that stores ``dtype`` as it is, or ``None`` when it must be stored as raw bytes."""
    return _CODE_OF.get(np.dtype(dtype))


_PLAIN_CODE_OF = {**{dtype: code for code, dtype in READ_ONLY_CODES.items()}, **_CODE_OF}


def plain_code(dtype: np.dtype) -> str | None:
    """The safetensors code that a plain file (no jaxstow manifest to name the dtype of raw bytes) stores ``dtype``
    under: :func:`safetensors_code`'s, or a newer code (:data:`READ_ONLY_CODES`: ``F8_E8M0``, ...), its only way.

    >>> plain_code(dtype_from_name("float8_e8m0fnu")), safetensors_code(dtype_from_name("float8_e8m0fnu"))
    ('F8_E8M0', None)
    """
    return _PLAIN_CODE_OF.get(np.dtype(dtype))


_NAME_OF = {dtype: name for name, dtype in _DTYPES.items()}


def name_of_dtype(dtype: np.dtype) -> str | None:
    """The table's name for ``dtype``, or ``None`` when jaxstow cannot store it (object, string, big-endian, ...)."""
    return _NAME_OF.get(dtype)


def unstored_dtype_advice(dtype: np.dtype, what: str = "an array") -> str:
    """Why a file cannot hold ``what`` (an array, a numpy scalar) of ``dtype``, outside the table, and what to save.

    >>> print(unstored_dtype_advice(np.dtype([("x", "i4"), ("y", "f4")])))
    an array of the structured dtype [('x', '<i4'), ('y', '<f4')], which a file does not store: save each field as a leaf of its own, {name: array[name] for name in array.dtype.names}
    """
    if dtype.names is not None:
        return (
            f"{what} of the structured dtype {dtype}, which a file does not store: save each field as a leaf of its "
            "own, {name: array[name] for name in array.dtype.names}"
        )
    if dtype.kind == "O":
        return f"{what} of Python objects (dtype object), which a file does not store: save them as a list instead"
    if dtype.kind in "US" or dtype.type is np.void:  # not ml_dtypes' own (int1, ...), whose kind is V too
        return f"{what} of dtype {dtype}, strings or raw bytes, which a file does not store: save .tolist() of it"
    return (
        f"{what} of dtype {dtype}, which a file does not store (docs/format.md lists the dtypes it does): convert it "
        "with .astype(...) to one of them"
    )


def is_shape(value: object) -> TypeGuard[list[int]]:
    """Whether a decoded JSON value is a valid shape: a list of non-negative integers (not bools)."""
    return type(value) is list and all(type(size) is int and size >= 0 for size in value)


#: The most bytes a stored shape may span, with every axis of size 0 counted as 1 (numpy refuses a larger shape even
#: when it holds nothing).
MAX_ARRAY_BYTES = 2**63 - 1
#: The most axes a stored shape may have: numpy 1's bound, so that a file reads wherever jaxstow runs (numpy 2 allows
#: 64); the writer refuses more.
MAX_AXES = 32


def checked_shape(value: object, dtype: np.dtype, *, file: str | None, path: str) -> list[int]:
    """A decoded JSON value as the shape of an array of ``dtype``.

    A :class:`FormatError` naming the leaf if it is not a list of non-negative integers, has more axes than numpy has,
    or spans more bytes than any array holds.

    >>> import numpy as np
    >>> from jaxstow._format.dtypes import checked_shape
    >>> checked_shape([0, 4], np.dtype(np.float32), file="f.jxs", path="w")
    [0, 4]
    >>> checked_shape([0, 2**62], np.dtype(np.float32), file="f.jxs", path="w")
    Traceback (most recent call last):
    ...
    jaxstow.errors.FormatError: leaf 'w' of f.jxs: shape [0, 4611686018427387904] of float32 spans more than 2**63 bytes (axes of size 0 counted as 1): no array holds it
    """
    if value is None:
        raise FormatError("no shape is given: a shape is a list of non-negative integers", file=file, path=path)
    if not is_shape(value):
        raise FormatError(
            f"a shape must be a list of non-negative integers, not {excerpt(value)}", file=file, path=path
        )
    if len(value) > MAX_AXES:
        raise FormatError(
            f"a shape of {len(value)} axes has more than the {MAX_AXES} a jaxstow file holds", file=file, path=path
        )
    nbytes = dtype.itemsize
    for size in value:
        nbytes *= max(size, 1)
        if nbytes > MAX_ARRAY_BYTES:
            raise FormatError(
                f"shape {value} of {dtype} spans more than 2**63 bytes (axes of size 0 counted as 1): no array holds it",
                file=file,
                path=path,
            )
    return value
