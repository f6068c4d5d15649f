"""A safetensors header's tensor entries, checked as wholes: the one decision on whether the tensor table is valid.

The rules are docs/format.md's ("Tensor entries"). :func:`slot_table` decides, exactly, with numpy over columns of
offsets, sizes and dtype codes; when it refuses, :func:`entry_slots` applies the same rules entry by entry only to say
which tensor is wrong and how (``tests/format/test_validator_fuzz.py`` checks that the two refuse the same headers).

>>> import numpy as np
>>> from jaxstow._format.tensor_table import check_header
>>> header = {"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
...           "b": {"dtype": "U8", "shape": [], "data_offsets": [24, 25]}}
>>> check_header(header, data_start=4096, file_size=4096 + 25, file="f.jxs")["w"]
TensorSlot(name='w', dtype=dtype('float32'), shape=(2, 3), offset=4096, nbytes=24)
>>> header["b"]["data_offsets"] = [24, True]
>>> check_header(header, data_start=4096, file_size=4096 + 25, file="f.jxs")
Traceback (most recent call last):
...
jaxstow.errors.FormatError: leaf 'b' of f.jxs: malformed data_offsets [24, True]
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, KeysView, Mapping, Sequence
from typing import Any

import numpy as np

from jaxstow._format.dtypes import MAX_ARRAY_BYTES, MAX_AXES, PACKED_CODES, READ_CODES, checked_shape, dtype_from_code
from jaxstow._format.tensor_reads import TensorSlot
from jaxstow.errors import FormatError, TruncatedFileError, excerpt

__all__ = ["SlotTable", "check_header", "entry_slots", "slot_table"]

_ITEMSIZES = {code: dtype.itemsize for code, dtype in READ_CODES.items()}
#: Below this many bytes (as a float product), a shape's bytes surely fit MAX_ARRAY_BYTES: the float product of at
#: most MAX_AXES factors is off by far less than this margin. Shapes at or above it are counted exactly.
_SURELY_FITS = MAX_ARRAY_BYTES * (1 - 1e-9)


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


def check_header(header: dict[str, Any], *, data_start: int, file_size: int, file: str) -> SlotTable:
    """The tensors of a parsed header (without ``__metadata__``), checked.

    Else the error of the first entry that breaks a rule, naming the tensor: a
    :class:`~jaxstow.errors.TruncatedFileError` for data beyond the end of the file, a
    :class:`~jaxstow.errors.FormatError` otherwise.
    """
    table = slot_table(header, data_start=data_start, file_size=file_size)
    if table is not None:
        return table
    entry_slots(header, data_start=data_start, file_size=file_size, file=file)  # raises, naming what is wrong
    raise FormatError("the header's tensor entries are malformed", file=file)  # the two disagree: still refused


def _only(values: Any, kind: type) -> bool:
    """Whether every item of ``values`` has exactly the type ``kind`` (``bool`` is not ``int``)."""
    return set(map(type, values)) <= {kind}


def slot_table(header: dict[str, Any], *, data_start: int, file_size: int) -> SlotTable | None:
    """The tensors of a parsed header (without ``__metadata__``) if every rule holds, ``None`` otherwise."""
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
    except OverflowError:  # beyond int64: no shape or offset within the bounds is that large
        return None
    ndims = np.array(list(map(len, shapes)), np.int64)
    begin, end = ends[:, 0], ends[:, 1]
    if (sizes < 0).any() or (ndims > MAX_AXES).any() or (begin < 0).any() or (begin > end).any():
        return None
    if not _shapes_fit(shapes, sizes, ndims, itemsizes):
        return None
    # Every shape now spans at most MAX_ARRAY_BYTES (axes of size 0 counted as 1), so its bytes fit an int64 exactly.
    starts = np.cumsum(ndims) - ndims
    elements = np.multiply.reduceat(np.append(sizes, 1), starts) if len(starts) else starts
    nbytes = np.where(ndims == 0, 1, elements) * itemsizes
    if not np.array_equal(nbytes, end - begin):
        return None
    order = np.lexsort((end, begin))
    data_size = file_size - data_start
    if len(order):
        tiled = begin[order[0]] == 0 and (begin[order[1:]] == end[order[:-1]]).all() and end[order[-1]] == data_size
    else:
        tiled = data_size == 0
    if not tiled:
        return None
    dtypes = [READ_CODES[code] for code in codes]
    return SlotTable(names, dtypes, shapes, begin + data_start, nbytes)


def _shapes_fit(shapes: list[Any], sizes: np.ndarray, ndims: np.ndarray, itemsizes: np.ndarray) -> bool:
    """Whether every shape spans at most MAX_ARRAY_BYTES, axes of size 0 counted as 1.

    Shapes are non-negative, of at most MAX_AXES axes. Computed as floats (a product too large becomes inf, never a
    wrapped number), and exactly in Python for the few shapes near the bound.
    """
    if not len(ndims):
        return True
    starts = np.cumsum(ndims) - ndims
    bounded = np.multiply.reduceat(np.append(np.maximum(sizes, 1), 1).astype(np.float64), starts)
    bounded = np.where(ndims == 0, 1.0, bounded) * itemsizes
    near = np.flatnonzero(~(bounded < _SURELY_FITS))
    return all(math.prod(max(size, 1) for size in shapes[row]) * int(itemsizes[row]) <= MAX_ARRAY_BYTES for row in near)


def entry_slots(header: dict[str, Any], *, data_start: int, file_size: int, file: str) -> dict[str, TensorSlot]:
    """The same rules as :func:`slot_table`, entry by entry.

    The tensors of a parsed header, or the :class:`~jaxstow.errors.JaxstowError` of the first entry (in the header's
    order) that breaks one, naming it.
    """
    slots = {name: _entry_slot(name, info, data_start, file_size, file) for name, info in header.items()}
    end = data_start
    for slot in sorted(slots.values(), key=lambda slot: (slot.offset, slot.nbytes)):
        if slot.offset != end:
            raise FormatError(
                f"the tensor starts at byte {slot.offset}, but the previous one ends at {end} (tensors must not "
                "overlap or leave holes)",
                file=file,
                path=slot.name,
            )
        end += slot.nbytes
    if end != file_size:
        raise FormatError(
            f"the tensors end at byte {end}, but the file has {file_size} bytes (the data region must hold the "
            "tensors and nothing else)",
            file=file,
        )
    return slots


def _entry_slot(name: str, info: Any, data_start: int, file_size: int, file: str) -> TensorSlot:
    """One tensor entry as a slot, or the error of the first rule it breaks."""
    if not isinstance(info, dict):
        raise FormatError(f"malformed tensor entry {excerpt(info)}", file=file, path=name)
    code = info.get("dtype")
    dtype = dtype_from_code(code) if isinstance(code, str) else None
    if dtype is None:
        if code in PACKED_CODES:
            raise FormatError(
                f"safetensors dtype {code} packs several elements to a byte: not read", file=file, path=name
            )
        raise FormatError(f"unknown safetensors dtype {excerpt(code)}", file=file, path=name)
    shape = checked_shape(info.get("shape"), dtype, file=file, path=name)
    offsets = info.get("data_offsets")
    if not (
        type(offsets) is list
        and len(offsets) == 2
        and type(offsets[0]) is int
        and type(offsets[1]) is int
        and 0 <= offsets[0] <= offsets[1]
    ):
        raise FormatError(f"malformed data_offsets {excerpt(offsets)}", file=file, path=name)
    begin, end = offsets
    expected = math.prod(shape) * dtype.itemsize
    if end - begin != expected:
        raise FormatError(
            f"shape {shape} of {dtype} needs {expected} bytes, but data_offsets span {end - begin}",
            file=file,
            path=name,
        )
    if data_start + end > file_size:
        raise TruncatedFileError(
            f"the data ends at byte {data_start + end} but the file has only {file_size} bytes", file=file, path=name
        )
    return TensorSlot(name, dtype, tuple(shape), data_start + begin, expected)
