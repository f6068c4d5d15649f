"""Checksums of leaf bytes: xxh3-64, as 16 hex digits.

>>> import numpy as np
>>> from jaxstow._format.checksum import checksum
>>> checksum(np.zeros(4, np.float32))
'd0a66a65c7528968'
"""

from __future__ import annotations

import numpy as np
import xxhash

from jaxstow._format.block_checksums import Checksums

__all__ = ["ZERO_CHECKSUM", "as_bytes", "checksum", "checksum_bytes", "checksums", "raw_buffer"]

ZERO_CHECKSUM = "0" * 16


def checksum_bytes(data: bytes | memoryview) -> str:
    """The xxh3-64 of raw bytes."""
    return xxhash.xxh3_64_hexdigest(data)


def checksum(array: np.ndarray) -> str:
    """The xxh3-64 of a C-contiguous array's bytes."""
    return xxhash.xxh3_64_hexdigest(array.data if _exports_buffer(array) else as_bytes(array))


def checksums(array: np.ndarray, blocks: list[str] | None = None) -> tuple[str, list[str] | None]:
    """The xxh3-64 of a C-contiguous array's bytes, and of its blocks, into ``blocks`` when given
    (:class:`~jaxstow._format.block_checksums.Checksums`)."""
    return Checksums.of(raw_buffer(array), blocks)


def as_bytes(array: np.ndarray) -> memoryview:
    """A C-contiguous array's bytes, without a copy (any dtype, including bfloat16 and int4)."""
    return array.reshape(-1).view(np.uint8).data


def raw_buffer(array: np.ndarray) -> memoryview:
    """What :func:`as_bytes` gives, made faster for numpy's own dtypes (the ml_dtypes export no buffer)."""
    return array.data.cast("B") if _exports_buffer(array) and array.size else as_bytes(array)


def _exports_buffer(array: np.ndarray) -> bool:
    return array.dtype.isbuiltin == 1 and array.flags.c_contiguous
