"""Leaves as the file stores them, and back.

Every leaf of a tree becomes one manifest entry. Arrays (jax, numpy or torch), numpy scalars and typed PRNG keys are
*stored leaves*: their bytes go to the data region, checksummed. Everything else (Python scalars, strings, registered
functions) is a *value* kept in the manifest as tagged JSON.

>>> import jax, numpy as np
>>> from jaxstow.format.leaves import encode_leaf
>>> encode_leaf("w", np.ones((2, 3), np.float32)).entry
{'path': 'w', 'kind': 'array', 'dtype': 'float32', 'shape': [2, 3]}
>>> encode_leaf("act", jax.nn.relu).entry
{'path': 'act', 'kind': 'value', 'value': {'ref': 'jax.nn.relu'}}
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxstow.errors import FormatError, UnsaveableObjectError
from jaxstow.format.dtypes import dtype_from_name, is_shape, name_of_dtype
from jaxstow.format.torch_leaves import is_tensor, tensor_to_numpy
from jaxstow.structure import decode_value, encode_value

__all__ = ["EncodedLeaf", "StoredLeaf", "decode_value_entry", "encode_leaf", "stored_leaf_from_entry"]

Entry = dict[str, Any]


@dataclass(frozen=True)
class EncodedLeaf:
    """A leaf ready to write: its manifest entry and, for stored leaves, its bytes as a C-contiguous array."""

    entry: Entry
    array: np.ndarray | None = None


def encode_leaf(path: str, leaf: Any, *, file: str | None = None) -> EncodedLeaf:
    """Classify one leaf and turn it into a manifest entry (plus its host array for stored leaves)."""
    if isinstance(leaf, jax.Array):
        if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            data = _host_array(jax.random.key_data(leaf), path=path, file=file)
            impl = str(jax.random.key_impl(leaf))
            return EncodedLeaf({**_array_entry(path, "key", data, file=file), "impl": impl}, data)
        data = _host_array(leaf, path=path, file=file)
        return EncodedLeaf(_array_entry(path, "array", data, file=file), data)
    if is_tensor(leaf):
        data = _host_array(tensor_to_numpy(leaf), path=path, file=file)
        return EncodedLeaf(_array_entry(path, "torch", data, file=file), data)
    if isinstance(leaf, np.ndarray):
        data = _host_array(leaf, path=path, file=file)
        return EncodedLeaf(_array_entry(path, "array", data, file=file), data)
    if isinstance(leaf, np.generic) and not isinstance(leaf, np.void | np.str_ | np.bytes_ | np.object_):
        data = _host_array(np.asarray(leaf), path=path, file=file)
        return EncodedLeaf(_array_entry(path, "npscalar", data, file=file), data)
    return EncodedLeaf({"path": path, "kind": "value", "value": encode_value(leaf, path=path, file=file)})


def _host_array(leaf: Any, *, path: str, file: str | None) -> np.ndarray:
    array = np.asarray(leaf)
    if name_of_dtype(array.dtype) is None:
        native = array.dtype.newbyteorder("=")
        if array.dtype.byteorder not in "=|" and name_of_dtype(native) is not None:
            array = array.astype(native)
        else:
            raise UnsaveableObjectError(leaf, file=file, path=path)
    return array if array.flags.c_contiguous else array.copy(order="C")


def _array_entry(path: str, kind: str, data: np.ndarray, *, file: str | None) -> Entry:
    dtype = name_of_dtype(data.dtype)
    if dtype is None:
        raise UnsaveableObjectError(data, file=file, path=path)
    return {"path": path, "kind": kind, "dtype": dtype, "shape": list(data.shape)}


class StoredLeaf(NamedTuple):
    """A validated manifest entry of a stored leaf."""

    path: str
    kind: str
    dtype: np.dtype
    shape: tuple[int, ...]
    checksum: str | None
    impl: str | None

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def stored_leaf_from_entry(entry: Any, *, file: str) -> StoredLeaf:
    """Check one manifest entry of a stored leaf; every number is validated before it is trusted."""
    path = entry.get("path") if isinstance(entry, dict) else None
    if not isinstance(path, str):
        raise FormatError(f"malformed manifest entry {entry!r}", file=file)
    dtype = dtype_from_name(entry.get("dtype")) if isinstance(entry.get("dtype"), str) else None
    if dtype is None:
        raise FormatError(f"unknown dtype {entry.get('dtype')!r}", file=file, path=path)
    shape = entry.get("shape")
    if not is_shape(shape):
        raise FormatError(f"a shape must be a list of non-negative integers, not {shape!r}", file=file, path=path)
    checksum = entry.get("xxh3")
    if checksum is not None and not isinstance(checksum, str):
        raise FormatError(f"malformed checksum {checksum!r}", file=file, path=path)
    impl = entry.get("impl")
    if entry["kind"] == "key" and not isinstance(impl, str):
        raise FormatError("a PRNG key entry needs its implementation name", file=file, path=path)
    if entry["kind"] == "npscalar" and shape:
        raise FormatError(f"a numpy scalar has shape [], not {shape}", file=file, path=path)
    return StoredLeaf(path, entry["kind"], dtype, tuple(shape), checksum, impl)


def decode_value_entry(entry: Entry, *, file: str) -> Any:
    """The Python value of a ``value`` entry."""
    return decode_value(entry.get("value"), path=entry["path"], file=file)
