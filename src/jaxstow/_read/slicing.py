"""A part of a stored array read by byte ranges, never the whole array first.

:func:`parse_index` turns a numpy-style index into the box to read plus what is left to apply to it (steps, dropped
axes); :func:`read_box` reads the box of a row-major array with as few reads as it can, exactly the bytes it needs
unless a dense neighbourhood is cheaper to read at once.

>>> import io, numpy as np
>>> from jaxstow._read.slicing import parse_index, read_box
>>> from jaxstow._storage.opening import open_source
>>> array = np.arange(24, dtype=np.int32).reshape(4, 6)
>>> source = open_source(io.BytesIO(array.tobytes()))
>>> box, rest = parse_index(np.s_[1:3, 2:4], array.shape)
>>> box
((1, 3), (2, 4))
>>> read_box(source, 0, array.dtype, array.shape, box)[rest]
array([[ 8,  9],
       [14, 15]], dtype=int32)
"""

from __future__ import annotations

import contextlib
import math
import operator
import os
from typing import Any

import numpy as np

from jaxstow._format.shards import Box
from jaxstow._format.source import ReadSource
from jaxstow._format.tensor_reads import aligned_empty, read_range
from jaxstow._storage.sources import LocalFile
from jaxstow.errors import SliceError, excerpt

__all__ = ["Box", "box_nbytes", "full_box", "parse_index", "read_box"]

_OVER_READ = 1.05  # read whole rows at once when that reads at most this much more than needed
_MANY_RUNS = 1 << 16  # past this many ranges of under 4 KiB each, whole rows are read instead
_SMALL_RUN = 4096


def full_box(shape: tuple[int, ...]) -> Box:
    """The box of a whole array."""
    return tuple((0, n) for n in shape)


def box_nbytes(box: Box, itemsize: int) -> int:
    """How many bytes the elements of ``box`` take."""
    return math.prod(stop - start for start, stop in box) * itemsize


def parse_index(
    index: Any, shape: tuple[int, ...], *, file: str | None = None, path: str | None = None
) -> tuple[Box, tuple[Any, ...]]:
    """The box that ``index`` touches, and the index that picks the result out of that box.

    ``index`` is what numpy takes between brackets, limited to integers (a 0-d integer array, jax's too), slices (any
    nonzero step) and one ``...``; anything else (a numpy array or a list, a boolean mask, ``None``, a step of 0) is
    a :class:`SliceError` naming the leaf and saying what to do instead.

    >>> parse_index((..., np.array([0, 2])), (3, 4), file="model.jxs", path="w")
    Traceback (most recent call last):
    jaxstow.errors.SliceError: leaf 'w' of model.jxs: index (Ellipsis, array([0, 2])): ...
    """
    items = index if isinstance(index, tuple) else (index,)
    ellipses = [at for at, item in enumerate(items) if item is Ellipsis]  # by identity: == on an array is elementwise
    if len(ellipses) > 1:
        raise SliceError(f"an index can hold one '...', not {excerpt(index)}", file=file, path=path)
    for item in items:
        if item is not Ellipsis and not isinstance(item, slice) and not _is_integer(item):
            raise SliceError(f"index {excerpt(index)}: {_unsupported(item)}; {_SUPPORTED}", file=file, path=path)
    items = tuple(operator.index(item) if _is_integer(item) else item for item in items)
    if ellipses:
        at = ellipses[0]
        fill = len(shape) - (len(items) - 1)
        items = (*items[:at], *(slice(None),) * max(fill, 0), *items[at + 1 :])
    if len(items) > len(shape):
        raise SliceError(
            f"index {excerpt(index)} has {len(items)} axes but the array has shape {list(shape)}", file=file, path=path
        )
    items = (*items, *(slice(None),) * (len(shape) - len(items)))
    box: list[tuple[int, int]] = []
    rest: list[Any] = []
    for axis, (item, size) in enumerate(zip(items, shape, strict=True)):
        if _is_integer(item):
            position = int(item) + size if item < 0 else int(item)
            if not 0 <= position < size:
                raise SliceError(
                    f"index {int(item)} is out of bounds for axis {axis} of shape {list(shape)}", file=file, path=path
                )
            box.append((position, position + 1))
            rest.append(0)
        elif isinstance(item, slice):
            where = f"axis {axis} of shape {list(shape)}"
            chosen = range(*_bounds(item, size, index, where, file=file, path=path))
            if not chosen:
                box.append((0, 0))
                rest.append(slice(None))
                continue
            low, high = min(chosen[0], chosen[-1]), max(chosen[0], chosen[-1]) + 1
            stop = chosen[-1] - low + (1 if chosen.step > 0 else -1)
            box.append((low, high))
            rest.append(slice(chosen[0] - low, stop if stop >= 0 else None, chosen.step))
        else:
            raise AssertionError(f"unchecked index item {item!r}")
    return tuple(box), tuple(rest)


def _is_integer(item: Any) -> bool:
    """An integer as numpy takes one in an index: a Python or numpy integer, or a 0-d integer array (jax's too)."""
    if isinstance(item, int | np.integer):
        return not isinstance(item, bool)
    if getattr(item, "shape", None) != () or "bool" in str(getattr(item, "dtype", "bool")):
        return False
    try:
        operator.index(item)
    except TypeError:  # a float, or a value traced by jax
        return False
    return True


_SUPPORTED = (
    "only integers, slices and '...' select a part of a stored array, a slice's step not 0 (such as "
    "np.s_[2:10, ::2]); to pick elements by an array, a list or a mask, read the part that holds them and index the "
    "result in memory"
)


def _unsupported(item: Any) -> str:
    """What is wrong with an index item that :func:`parse_index` does not take, in words."""
    if isinstance(item, list | tuple) or (hasattr(item, "__array__") and getattr(item, "shape", None) != ()):
        try:
            mask = np.asarray(item).dtype == np.bool_
        except ValueError:  # a ragged list
            mask = False
        kind = (
            "a boolean mask"
            if mask
            else f"a {type(item).__name__}"
            if isinstance(item, list | tuple)
            else "a numpy array"
            if isinstance(item, np.ndarray)
            else "an array"
        )
        return f"{kind} picks elements one by one, which a lazy read does not do"
    if item is None:
        return "None (np.newaxis) adds an axis, which a lazy read does not do"
    if isinstance(item, bool | np.bool_):
        return f"{item!r} is a boolean, not an integer"
    return f"{excerpt(item, 60)} is not an integer, a slice or '...'"


def _bounds(
    item: slice, size: int, index: Any, where: str, *, file: str | None, path: str | None
) -> tuple[int, int, int]:
    """``item.indices(size)``, or a :class:`SliceError` for a step of 0, bounds that are not integers, or a bound
    past either end of the axis (numpy would cut the slice short without a word: a lazy read refuses it)."""
    try:
        bounds = item.indices(size)
    except ValueError:  # Python's words: "slice step cannot be zero"
        problem = "a slice's step cannot be 0"
    except TypeError:
        problem = f"{excerpt(item, 60)} has bounds or a step that are not integers"
    else:
        outside = [int(bound) for bound in (item.start, item.stop) if bound is not None and not -size <= bound <= size]
        if not outside:
            return bounds
        raise SliceError(
            f"index {excerpt(index)}: the slice {_shown(item)} reaches {outside[0]}, past the end of {where}, "
            f"which takes bounds from {-size} to {size}",
            file=file,
            path=path,
        )
    raise SliceError(f"index {excerpt(index)}: {problem}; {_SUPPORTED}", file=file, path=path)


def _shown(item: slice) -> str:
    """A slice as it is written in an index (``3:20``, ``::2``)."""
    parts = ["" if bound is None else str(bound) for bound in (item.start, item.stop)]
    return ":".join(parts) + (f":{item.step}" if item.step is not None else "")


def read_box(
    source: ReadSource,
    offset: int,
    dtype: np.dtype,
    shape: tuple[int, ...],
    box: Box,
    *,
    into: np.ndarray | None = None,
) -> np.ndarray:
    """The elements of ``box`` of the row-major array of ``dtype`` and ``shape`` stored at ``offset``.

    The result is ``into`` (a C-contiguous array of the box's shape and ``dtype``) filled, or a new 64-byte-aligned
    array.
    """
    extent = tuple(stop - start for start, stop in box)
    strides = [math.prod(shape[axis + 1 :]) * dtype.itemsize for axis in range(len(shape))]
    first = offset + sum(
        start * stride for (start, _), stride in zip(box, strides, strict=True)
    )  # the box's first byte
    nbytes = math.prod(extent) * dtype.itemsize
    out = aligned_empty(nbytes, first) if into is None else into.reshape(-1).view(np.uint8)
    if out.size == 0:
        return out.view(dtype).reshape(extent)
    partial_axes = [axis for axis, (start, stop) in enumerate(box) if (start, stop) != (0, shape[axis])]
    if not partial_axes or partial_axes == [0]:  # whole rows of the first axis: one range
        read_range(source, first, out.data)
        return out.view(dtype).reshape(extent)
    last = partial_axes[-1]
    run_bytes = extent[last] * strides[last]
    runs = math.prod(extent[:last])
    rows_bytes = extent[0] * strides[0]
    if rows_bytes <= _OVER_READ * out.nbytes or (runs > _MANY_RUNS and run_bytes < _SMALL_RUN):
        rows = read_box(source, offset, dtype, shape, (box[0], *full_box(shape[1:])))
        out.view(dtype).reshape(extent)[...] = rows[(slice(None), *(slice(a, b) for a, b in box[1:]))]
        return out.view(dtype).reshape(extent)
    leading = np.indices(extent[:last]).reshape(last, -1)
    starts = (
        offset
        + box[last][0] * strides[last]
        + sum((box[axis][0] + leading[axis]) * strides[axis] for axis in range(last))
    )
    _read_runs(source, starts.tolist(), run_bytes, out.data)
    return out.view(dtype).reshape(extent)


def _read_runs(source: ReadSource, starts: list[int], run_bytes: int, data: memoryview) -> None:
    """Read ``run_bytes`` at each of ``starts`` into consecutive parts of ``data``.

    One system call each on a local file.
    """
    with source.in_use() if isinstance(source, LocalFile) else contextlib.nullcontext(None) as descriptor:
        for position, start in enumerate(starts):
            part = data[position * run_bytes : (position + 1) * run_bytes]
            if descriptor is None or os.preadv(descriptor, [part], start) != run_bytes:
                source.read_into(start, part)
