"""A safetensors header's tensor entries checked one by one, to say which tensor is wrong and how.

The rules are docs/format.md's ("Tensor entries"). The one decision on whether a tensor table is valid is
:func:`~jaxstow._format.header.slot_table`'s, over all entries at once with numpy; when it refuses, :func:`entry_slots`
applies the same rules entry by entry only to name the first tensor that breaks one and the rule
(``tests/format/test_validator_fuzz.py`` checks that the two refuse the same headers).

>>> from jaxstow._format.tensor_table import entry_slots
>>> header = {"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
...           "b": {"dtype": "U8", "shape": [], "data_offsets": [24, True]}}
>>> entry_slots(header, data_start=4096, file_size=4096 + 25, file="f.jxs")
Traceback (most recent call last):
...
jaxstow.errors.FormatError: leaf 'b' of f.jxs: malformed data_offsets [24, True]
"""

from __future__ import annotations

import math
from typing import Any

from jaxstow._format.dtypes import PACKED_CODES, checked_shape, dtype_from_code
from jaxstow._format.tensor_reads import TensorSlot
from jaxstow.errors import CorruptFileError, FormatError, TruncatedFileError, excerpt

__all__ = ["entry_slots"]


def entry_slots(header: dict[str, Any], *, data_start: int, file_size: int, file: str) -> dict[str, TensorSlot]:
    """The same rules as :func:`~jaxstow._format.header.slot_table`, entry by entry.

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
    if end != file_size:  # bytes after the tensors: a file written over in place, or two files joined
        raise CorruptFileError(
            f"the tensors end at byte {end}, but the file has {file_size} bytes (the data region must hold the "
            "tensors and nothing else): it was written over in place, or holds more after its end, as a file object "
            "saved into twice does (load each save from its own file or buffer)",
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
    if end - begin != expected:  # a header damaged (one without a checksum, a plain file's): not another format
        raise CorruptFileError(
            f"shape {shape} of {dtype} needs {expected} bytes, but data_offsets span {end - begin}",
            file=file,
            path=name,
        )
    if data_start + end > file_size:
        raise TruncatedFileError(
            f"the data ends at byte {data_start + end} but the file has only {file_size} bytes", file=file, path=name
        )
    return TensorSlot(name, dtype, tuple(shape), data_start + begin, expected)
