"""The containers of a file, native safetensors or npz: the one a save writes, and what the read path needs of one.

A name ending in ``.npz`` gets an npz archive, any other the native container; :func:`write_container` writes either.
:class:`Container` is what the loaders need of a file opened (:func:`jaxstow._format.header.open_container`).

>>> import io, numpy as np
>>> from jaxstow._format.native_or_npz import container_kind, write_container
>>> buffer = io.BytesIO()
>>> write_container(buffer, "native", [("w", np.zeros(2))], None)
>>> container_kind("model.npz"), container_kind("model.jxs"), buffer.getvalue()[8:9]
('npz', 'native', b'{')
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, BinaryIO, Literal, Protocol

import numpy as np

from jaxstow._format.dtypes import name_of_dtype
from jaxstow._format.manifest import FORMAT_NAME, FORMAT_VERSION, LeafColumns
from jaxstow._format.native import Complete, write_native
from jaxstow._format.native import stores_exactly as native_stores_exactly
from jaxstow._format.npz import stores_exactly as npz_stores_exactly
from jaxstow._format.npz import write_npz
from jaxstow._format.pieces import HostArray
from jaxstow._format.tensor_reads import TensorSlot, Verify

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "Container",
    "container_kind",
    "describe_raw_leaves",
    "write_container",
]

Kind = Literal["native", "npz"]


class Container(Protocol):
    """What the loaders need of a file: its manifest, its tensors and a way to read them."""

    file: str
    manifest: dict[str, Any] | None
    #: A native file's ``__metadata__`` (an npz has none).
    metadata: dict[str, str]
    #: The leaves of a version 3 manifest, set when the manifest is checked.
    columns: LeafColumns | None

    @property
    def slots(self) -> Mapping[str, TensorSlot]: ...

    def read(self, names: Sequence[str], verify: Verify | None = None) -> dict[str, np.ndarray]: ...

    def close(self) -> None: ...


def container_kind(target: str | os.PathLike[str] | BinaryIO) -> Kind:
    """The container a save writes: npz for a ``.npz`` name, native otherwise."""
    name = os.fspath(target) if isinstance(target, str | os.PathLike) else str(getattr(target, "name", ""))
    return "npz" if name.lower().endswith(".npz") else "native"


def write_container(
    sink: BinaryIO,
    kind: Kind,
    tensors: Sequence[tuple[str, HostArray]],
    manifest: dict[str, Any] | None,
    complete: Complete | None = None,
) -> str | None:
    """Write tensors and manifest in the given container; ``complete()`` finishes the manifest in place.

    Returns the native header's checksum (``None`` for npz or without a manifest). An npz archive takes each deferred
    tensor whole.
    """
    if kind == "npz":
        whole = [(name, _whole(array)) for name, array in tensors]
        write_npz(sink, whole, manifest, complete)
        return None
    return write_native(sink, tensors, manifest, complete)


def _whole(array: HostArray) -> np.ndarray:
    if isinstance(array, np.ndarray):
        return array
    return np.concatenate([piece.reshape(-1) for piece in array.written()]).reshape(array.shape)


def describe_raw_leaves(kind: Kind, tensors: Sequence[tuple[str, HostArray, dict[str, Any]]]) -> None:
    """Give each stored leaf whose bytes ``kind`` stores raw its dtype and shape in its entry.

    Raw bytes (``uint8``) do not tell them. ``tensors`` are (name, bytes, entry) of a snapshot.

    >>> import ml_dtypes, numpy as np
    >>> entries = [{"path": "a", "kind": "array"}, {"path": "b", "kind": "array"}]
    >>> arrays = [np.zeros(2, np.float32), np.zeros(2, ml_dtypes.int4)]
    >>> describe_raw_leaves("native", [(entry["path"], array, entry) for entry, array in zip(entries, arrays)])
    >>> entries
    [{'path': 'a', 'kind': 'array'}, {'path': 'b', 'kind': 'array', 'dtype': 'int4', 'shape': [2]}]
    """
    stores_exactly = native_stores_exactly if kind == "native" else npz_stores_exactly
    raw = {dtype for dtype in {array.dtype for _, array, _ in tensors} if not stores_exactly(dtype)}
    if not raw:
        return
    for name, array, entry in tensors:
        if array.dtype in raw and entry.get("path") == name:  # a shard's dtype is its leaf's
            entry["dtype"], entry["shape"] = name_of_dtype(array.dtype), list(array.shape)
