"""The tensors of a safetensors header as columns, checked in one vectorised pass.

Every field of every tensor entry is checked at once, with numpy over arrays of offsets, sizes and dtype codes: each
entry is an object with a known dtype code, a shape of non-negative integers and two integer data offsets; each
tensor's offsets span exactly its shape's bytes; the tensors fill the data region without overlaps or holes and end
within the file. :func:`slot_table` answers ``None`` at the first doubt, and the container then checks the entries one
by one, which names the tensor and the problem: this pass only makes the common case fast, never more lenient.

>>> import numpy as np
>>> from jaxstow._format.tensor_table import slot_table
>>> header = {"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
...           "b": {"dtype": "U8", "shape": [], "data_offsets": [24, 25]}}
>>> table = slot_table(header, data_start=4096, file_size=4096 + 25)
>>> table["w"]
TensorSlot(name='w', dtype=dtype('float32'), shape=(2, 3), offset=4096, nbytes=24)
>>> header["b"]["data_offsets"] = [24, True]
>>> slot_table(header, data_start=4096, file_size=4096 + 25) is None
True
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, KeysView, Mapping, Sequence
from typing import Any

import numpy as np

from jaxstow._format.dtypes import MAX_ARRAY_BYTES, MAX_AXES, SAFETENSORS_CODES
from jaxstow._format.tensor_reads import TensorSlot

__all__ = ["SlotTable", "slot_table"]

_ITEMSIZES = {code: dtype.itemsize for code, dtype in SAFETENSORS_CODES.items()}


class SlotTable(Mapping[str, TensorSlot]):
    """A file's tensors by name, kept as columns; a :class:`TensorSlot` is made only for a tensor asked for."""

    def __init__(
        self,
        names: list[str],
        dtypes: list[np.dtype],
        shapes: Sequence[Sequence[int]],
        offsets: np.ndarray,
        nbytes: np.ndarray,
    ) -> None:
        self.names = names
        self.dtypes = dtypes
        self.shapes = shapes
        self.offsets = offsets  # where each tensor starts in the file
        self.nbytes = nbytes
        self.index = dict(zip(names, range(len(names)), strict=True))

    def __getitem__(self, name: str) -> TensorSlot:
        i = self.index[name]
        return TensorSlot(name, self.dtypes[i], tuple(self.shapes[i]), int(self.offsets[i]), int(self.nbytes[i]))

    def __contains__(self, name: object) -> bool:
        return name in self.index

    def keys(self) -> KeysView[str]:
        return self.index.keys()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def _only(values: Any, kind: type) -> bool:
    """Whether every item of ``values`` has exactly the type ``kind`` (``bool`` is not ``int``)."""
    return set(map(type, values)) <= {kind}


def slot_table(header: dict[str, Any], *, data_start: int, file_size: int) -> SlotTable | None:
    """The tensors of a parsed header (without ``__metadata__``) if every entry is well formed, ``None`` otherwise."""
    names, infos = list(header), list(header.values())
    if not _only(infos, dict):
        return None
    try:
        codes = [info["dtype"] for info in infos]
        shapes = [info["shape"] for info in infos]
        spans = [info["data_offsets"] for info in infos]
        itemsizes = np.array([_ITEMSIZES[code] for code in codes], np.int64)  # an unhashable code: TypeError
    except (KeyError, TypeError):
        return None
    if not (_only(shapes, list) and _only(spans, list) and set(map(len, spans)) <= {2}):
        return None
    dims = list(itertools.chain.from_iterable(shapes))
    bounds = list(itertools.chain.from_iterable(spans))
    if not (_only(dims, int) and _only(bounds, int)):
        return None
    try:
        sizes = np.array(dims, np.int64)
        ends = np.array(bounds, np.int64).reshape(-1, 2)
    except OverflowError:
        return None
    begin, end = ends[:, 0], ends[:, 1]
    if (sizes < 0).any() or (begin < 0).any() or (begin > end).any() or (end > file_size - data_start).any():
        return None
    # Elements per tensor, as floats: a product too large for an int64 becomes inf (or nan), never a wrapped number,
    # and a product that matches a span within the file is exact.
    ndims = np.array(list(map(len, shapes)), np.int64)
    starts = np.cumsum(ndims) - ndims
    products = np.multiply.reduceat(np.append(sizes, 1).astype(np.float64), starts) if len(starts) else starts
    products = np.where(ndims == 0, 1.0, products)
    # What numpy can hold at all, as checked_shape counts it (axes of size 0 as 1), with a margin for rounding: a
    # tensor near the bound goes to the exact check.
    bounded = (
        np.multiply.reduceat(np.append(np.maximum(sizes, 1), 1).astype(np.float64), starts) if len(starts) else starts
    )
    bounded = np.where(ndims == 0, 1.0, bounded)
    if (ndims > MAX_AXES).any() or (bounded * itemsizes >= MAX_ARRAY_BYTES * (1 - 1e-9)).any():
        return None
    with np.errstate(invalid="ignore", over="ignore"):
        if not np.array_equal(products * itemsizes, (end - begin).astype(np.float64)):
            return None
    order = np.lexsort((end, begin))
    if len(order) and (begin[order[0]] != 0 or (begin[order[1:]] != end[order[:-1]]).any()):
        return None
    dtypes = [SAFETENSORS_CODES[code] for code in codes]
    return SlotTable(names, dtypes, shapes, begin + data_start, end - begin)
