"""The native container: a valid safetensors file whose metadata carries the jaxstow manifest.

Layout: an 8-byte little-endian header length, a JSON header padded with spaces so that the data region starts on a
4096-byte boundary, then the data region with no holes. Tensors are ordered by item size, largest first, so each is
naturally aligned. ``__metadata__`` is written last in the header: ``jaxstow`` (the manifest), then the user's
metadata whose values are strings under their own keys (format version 4 on; safetensors' own tools show them), and
last ``jaxstow_header_xxh3``, the checksum of the header text with that value zeroed, so that a flipped byte in the
header is caught too. A plain safetensors file's ``__metadata__`` is read as it is (:attr:`NativeReader.metadata`).

>>> import io, numpy as np
>>> from jaxstow._format.native import NativeReader, write_native
>>> buffer = io.BytesIO()
>>> header_checksum = write_native(buffer, [("w", np.arange(3, dtype=np.float32))], {"format": "jaxstow"})
>>> _ = buffer.seek(0)
>>> from jaxstow._storage.opening import open_source
>>> reader = NativeReader(open_source(buffer))
>>> reader.manifest, reader.read(["w"])["w"]
({'format': 'jaxstow'}, array([0., 1., 2.], dtype=float32))
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from jaxstow._format.checksum import ZERO_CHECKSUM, checksum_bytes, raw_buffer
from jaxstow._format.columns import LeafColumns, columnar
from jaxstow._format.dtypes import checked_shape, dtype_from_code, safetensors_code
from jaxstow._format.json_codec import dump_json, parse_json
from jaxstow._format.manifest import FORMAT_VERSION, PLAIN_METADATA_VERSION, check_nesting, plain_metadata
from jaxstow._format.source import ReadSource
from jaxstow._format.tensor_reads import TensorSlot, Verify, read_slots
from jaxstow._format.tensor_table import slot_table
from jaxstow.errors import CorruptFileError, FormatError, TruncatedFileError, excerpt

__all__ = [
    "DATA_ALIGNMENT",
    "MAX_HEADER_BYTES",
    "Complete",
    "NativeReader",
    "header_checksum",
    "stores_exactly",
    "write_native",
]

DATA_ALIGNMENT = 4096
MAX_HEADER_BYTES = 100 * 1024 * 1024
_MANIFEST_KEY = "jaxstow"
_HASH_KEY = "jaxstow_header_xxh3"
_HASH_TAIL = len(f'"{ZERO_CHECKSUM}"}}}}')
_JAXSTOW_MARKS = (b'"jaxstow":"', f'"{_HASH_KEY}":"'.encode(), b'\\"format\\":\\"jaxstow\\"')

_BATCH_BYTES = 1 << 20

#: Finishes a manifest in place; see :func:`write_native`.
Complete = Callable[[], None]


def write_native(
    sink: BinaryIO,
    tensors: Sequence[tuple[str, np.ndarray]],
    manifest: dict[str, Any] | None,
    complete: Complete | None = None,
) -> str | None:
    """Write ``tensors`` (name, C-contiguous array) and the manifest to ``sink``, streaming each array once.

    ``complete()``, when given, finishes the manifest in place (its checksums, computed while the data is written;
    they have the same length as the placeholders they replace). On a seekable sink the header is written first with
    the placeholders and rewritten once the manifest is complete; otherwise ``complete()`` is awaited first.
    Returns the header's checksum (``jaxstow_header_xxh3``), or ``None`` for a file without a manifest. A tensor
    named ``__metadata__`` (the header's own key) and a manifest nested too deeply to be read back are refused before
    anything is written.
    """
    for name, _ in tensors:
        if name == "__metadata__":
            raise FormatError("a safetensors file cannot hold a tensor named '__metadata__'; rename the key", path=name)
    if manifest is not None:
        check_nesting(manifest)
    codes = _Codes()
    itemsizes = {codes.stored_itemsize(dtype) for dtype in {array.dtype for _, array in tensors}}
    ordered = sorted(tensors, key=lambda item: -codes.stored_itemsize(item[1].dtype)) if len(itemsizes) > 1 else tensors
    patch_later = complete is not None and bool(getattr(sink, "seekable", lambda: False)())
    if complete is not None and not patch_later:
        complete()
    start = sink.tell() if patch_later else 0
    entries = _tensor_entries(ordered, codes)
    header = _header(entries, manifest)
    sink.write(header)
    _write_arrays(sink, [array for _, array in ordered])
    if patch_later and complete is not None:
        complete()
        final = _header(entries, manifest)
        if len(final) != len(header):
            raise AssertionError("the completed manifest changed the header's length")
        end = sink.tell()
        sink.seek(start)
        sink.write(final)
        sink.seek(end)
        header = final
    return None if manifest is None else header[8:].rstrip(b" ")[-_HASH_TAIL + 1 : -3].decode("ascii")


def stores_exactly(dtype: np.dtype) -> bool:
    """Whether the native container stores ``dtype`` as it is (otherwise as raw bytes, ``U8``)."""
    return safetensors_code(dtype) is not None


def _write_arrays(sink: BinaryIO, arrays: Sequence[np.ndarray]) -> None:
    """Write the arrays' bytes back to back: small ones joined into batches of about ``_BATCH_BYTES``, each one
    write, large ones as they are (a join costs less than a write call per small array)."""
    batch: list[memoryview] = []
    batched = 0
    for array in arrays:
        nbytes = array.nbytes
        if nbytes >= _BATCH_BYTES:
            if batch:
                sink.write(b"".join(batch))
                batch, batched = [], 0
            sink.write(raw_buffer(array))
        elif nbytes:
            batch.append(raw_buffer(array))
            batched += nbytes
            if batched >= _BATCH_BYTES:
                sink.write(b"".join(batch))
                batch, batched = [], 0
    if batch:
        sink.write(b"".join(batch))


def _tensor_entries(ordered: Sequence[tuple[str, np.ndarray]], codes: _Codes) -> dict[str, Any]:
    """The header's entry of each tensor of ``ordered``, stored back to back in that order."""
    entries: dict[str, Any] = {}
    offset = 0
    for name, array in ordered:
        code, nbytes = codes.code(array.dtype), array.nbytes
        entries[name] = {
            "dtype": code or "U8",
            "shape": array.shape if code is not None else (nbytes,),
            "data_offsets": (offset, offset + nbytes),
        }
        offset += nbytes
    return entries


def _header(entries: dict[str, Any], manifest: dict[str, Any] | None) -> bytes:
    """The length prefix and the padded JSON header of a file holding the tensors of ``entries`` (see
    :func:`_tensor_entries`) and ``manifest``."""
    header = entries
    if manifest is not None:
        version = manifest.get("version")
        plain = plain_metadata(manifest.get("metadata")) if _at_least(version, PLAIN_METADATA_VERSION) else {}
        metadata = {_MANIFEST_KEY: dump_json(columnar(manifest)).decode("utf-8"), **plain, _HASH_KEY: ZERO_CHECKSUM}
        header = {**entries, "__metadata__": metadata}
    text = dump_json(header)
    if manifest is not None:
        text = text[:-_HASH_TAIL] + f'"{checksum_bytes(text)}"}}}}'.encode()
    padded = len(text) + (-(8 + len(text)) % DATA_ALIGNMENT)
    return struct.pack("<Q", padded) + text.ljust(padded, b" ")


def _at_least(version: Any, least: int) -> bool:
    """Whether a manifest's ``version`` (anything, in a file not checked yet) is an integer of at least ``least``."""
    return type(version) is int and version >= least


class _Codes:
    """The safetensors code of each dtype met in one write (``None``: stored as raw bytes), looked up once each."""

    def __init__(self) -> None:
        self._codes: dict[np.dtype, str | None] = {}

    def code(self, dtype: np.dtype) -> str | None:
        try:
            return self._codes[dtype]
        except KeyError:
            return self._codes.setdefault(dtype, safetensors_code(dtype))

    def stored_itemsize(self, dtype: np.dtype) -> int:
        """The item size of the dtype the file stores ``dtype`` as."""
        return dtype.itemsize if self.code(dtype) is not None else 1


def _raw_header(source: ReadSource) -> bytes:
    """The header text of a safetensors file (padding included), after checking that the file can be one."""
    size = source.size
    if size < 8:
        raise TruncatedFileError(f"{source.describe_size()} is too short for a safetensors header", file=source.name)
    (length,) = struct.unpack("<Q", source.read(0, 8))
    if size == 8 or source.read(8, 1) != b"{":
        start = source.read(0, min(size, 16))
        raise FormatError(f"not a jaxstow, safetensors or npz file (it starts with {excerpt(start)})", file=source.name)
    if length > MAX_HEADER_BYTES:
        raise CorruptFileError(
            f"header length {length} exceeds the limit of {MAX_HEADER_BYTES} bytes", file=source.name
        )
    if 8 + length > size:
        raise TruncatedFileError(
            f"the header claims {length} bytes but the file has only {size - 8} after the length", file=source.name
        )
    return source.read(8, length)


def header_checksum(source: ReadSource) -> str:
    """The checksum a jaxstow file's header ends with, checked against the header text without parsing it.

    >>> import io, numpy as np
    >>> from jaxstow._storage.opening import open_source
    >>> buffer = io.BytesIO()
    >>> written = write_native(buffer, [("w", np.zeros(2))], {"format": "jaxstow"})
    >>> _ = buffer.seek(0)
    >>> header_checksum(open_source(buffer)) == written
    True
    """
    raw = _raw_header(source)
    if not any(mark in raw for mark in _JAXSTOW_MARKS):
        raise FormatError("not a jaxstow file: its header has no jaxstow manifest", file=source.name)
    _check_header_checksum(raw, file=source.name)
    return raw.rstrip(b" ")[-_HASH_TAIL + 1 : -3].decode("ascii")


def _check_header_checksum(raw: bytes, *, file: str) -> None:
    """Refuse a jaxstow header whose text does not match the checksum it ends with (any change, keys included)."""
    stripped = raw.rstrip(b" ")
    recorded = stripped[-_HASH_TAIL + 1 : -3]
    zeroed = stripped[:-_HASH_TAIL] + f'"{ZERO_CHECKSUM}"}}}}'.encode()
    intact = stripped[-_HASH_TAIL:] == b'"' + recorded + b'"}}' and checksum_bytes(zeroed).encode() == recorded
    if not intact:
        raise CorruptFileError("the header's checksum does not match: the header is corrupt", file=file)


def _check_tiling(slots: Iterable[TensorSlot], data_start: int, *, file: str) -> None:
    """Tensors must fill the data region without overlaps or holes, as safetensors requires."""
    end = data_start
    for slot in sorted(slots, key=lambda slot: (slot.offset, slot.nbytes)):
        if slot.offset != end:
            raise FormatError(
                f"the tensor starts at byte {slot.offset}, but the previous one ends at {end} (tensors must not "
                "overlap or leave holes)",
                file=file,
                path=slot.name,
            )
        end += slot.nbytes


@dataclass(frozen=True)
class _Header:
    slots: Mapping[str, TensorSlot]
    metadata: dict[str, str]


class NativeReader:
    """Reads a safetensors file, with or without a jaxstow manifest; validates the header before allocating.

    A header that shows any sign of having been written by jaxstow (its manifest key, its checksum key or the
    manifest's format name) must pass the header checksum, so a damaged key never turns a jaxstow file into a plain
    safetensors file: any damage is a :class:`CorruptFileError`. :attr:`metadata` is the header's ``__metadata__``
    (strings by string keys); in a jaxstow file the manifest's metadata is the user's, and the plain keys beside it
    must be its string values.
    """

    def __init__(self, source: ReadSource) -> None:
        self.source = source
        self.file = source.name
        header = self._read_header()
        self.slots = header.slots
        self.metadata = header.metadata
        self.manifest: dict[str, Any] | None = None
        self.columns: LeafColumns | None = None
        if _MANIFEST_KEY in self.metadata:
            self.manifest = parse_json(self.metadata[_MANIFEST_KEY], what="the jaxstow manifest", file=self.file)
            self._check_plain_keys(self.manifest)

    def _check_plain_keys(self, manifest: Any) -> None:
        """The keys beside jaxstow's own must be exactly the user's string metadata, which only version 4 on writes (a
        newer version is left to the manifest's check, which says it is newer)."""
        plain = {key: value for key, value in self.metadata.items() if key not in (_MANIFEST_KEY, _HASH_KEY)}
        version = manifest.get("version") if isinstance(manifest, dict) else None
        if _at_least(version, FORMAT_VERSION + 1):
            return
        if plain and not _at_least(version, PLAIN_METADATA_VERSION):
            raise CorruptFileError(
                f"the header's metadata keys {excerpt(sorted(self.metadata))} are not jaxstow's: the header is corrupt",
                file=self.file,
            )
        if _at_least(version, PLAIN_METADATA_VERSION) and plain != plain_metadata(manifest.get("metadata")):
            raise CorruptFileError(
                "the header's plain metadata keys differ from the manifest's string metadata: the header is corrupt",
                file=self.file,
            )

    def _read_header(self) -> _Header:
        raw = _raw_header(self.source)
        length = len(raw)
        claimed = any(mark in raw for mark in _JAXSTOW_MARKS)
        if claimed:
            _check_header_checksum(raw, file=self.file)
        error = CorruptFileError if claimed else FormatError
        header = parse_json(raw, what="the header", file=self.file, error=error, exact_integers=False)
        if not isinstance(header, dict):
            raise FormatError("the header is not a JSON object", file=self.file)
        metadata = header.pop("__metadata__", None) or {}
        if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
            raise FormatError("__metadata__ must map strings to strings", file=self.file)
        if claimed and not {_MANIFEST_KEY, _HASH_KEY} <= set(metadata):
            raise CorruptFileError(
                f"the header's metadata keys {excerpt(sorted(metadata))} lack jaxstow's: the header is corrupt",
                file=self.file,
            )
        data_start = 8 + length
        table = slot_table(header, data_start=data_start, file_size=self.source.size)
        if table is not None:
            return _Header(table, metadata)
        slots = {name: self._slot(name, info, data_start) for name, info in header.items()}  # names what is wrong
        _check_tiling(slots.values(), data_start, file=self.file)
        return _Header(slots, metadata)

    def _slot(self, name: str, info: Any, data_start: int) -> TensorSlot:
        if not isinstance(info, dict):
            raise FormatError(f"malformed tensor entry {excerpt(info)}", file=self.file, path=name)
        code = info.get("dtype")
        dtype = dtype_from_code(code) if isinstance(code, str) else None
        if dtype is None:
            raise FormatError(f"unknown safetensors dtype {excerpt(info.get('dtype'))}", file=self.file, path=name)
        shape, offsets = info.get("shape"), info.get("data_offsets")
        shape = checked_shape(shape, dtype, file=self.file, path=name)
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or type(offsets[0]) is not int
            or type(offsets[1]) is not int
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise FormatError(f"malformed data_offsets {excerpt(offsets)}", file=self.file, path=name)
        begin, end = offsets
        expected = math.prod(shape) * dtype.itemsize
        if end - begin != expected:
            raise FormatError(
                f"shape {shape} of {dtype} needs {expected} bytes, but data_offsets span {end - begin}",
                file=self.file,
                path=name,
            )
        if data_start + end > self.source.size:
            raise TruncatedFileError(
                f"the data ends at byte {data_start + end} but the file has only {self.source.size} bytes",
                file=self.file,
                path=name,
            )
        return TensorSlot(name, dtype, tuple(shape), data_start + begin, expected)

    def read(self, names: Sequence[str], verify: Verify | None = None) -> dict[str, np.ndarray]:
        """The stored arrays of ``names``, each in its own 64-byte-aligned buffer where that matters."""
        return read_slots(self.source, [self.slots[name] for name in names], verify)

    def close(self) -> None:
        self.source.close()
