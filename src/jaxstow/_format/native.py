"""The native container: a valid safetensors file whose metadata carries the jaxstow manifest.

A header padded so that the data region starts on a 4096-byte boundary, tensors ordered largest item size first so
each is naturally aligned, and ``__metadata__`` holding the manifest, the user's string metadata and the header's own
checksum. docs/format.md specifies it byte by byte. A plain safetensors file's ``__metadata__`` is read as it is.

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

import os
import re
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np
import xxhash

from jaxstow._format.checksum import ZERO_CHECKSUM, checksum_bytes, raw_buffer
from jaxstow._format.columns import LeafColumns, columnar
from jaxstow._format.dtypes import MAX_AXES, checked_shape, safetensors_code
from jaxstow._format.json_codec import dump_json, parse_json
from jaxstow._format.manifest import FORMAT_VERSION, PLAIN_METADATA_VERSION, check_nesting, plain_metadata
from jaxstow._format.pieces import Deferred, HostArray
from jaxstow._format.source import ReadSource
from jaxstow._format.tensor_reads import TensorSlot, Verify, read_slots
from jaxstow._format.tensor_table import check_header
from jaxstow._util.gc_pause import gc_paused
from jaxstow.errors import CorruptFileError, FormatError, TruncatedFileError, excerpt

__all__ = [
    "DATA_ALIGNMENT",
    "MAX_HEADER_BYTES",
    "Complete",
    "NativeReader",
    "claims_manifest",
    "header_checksum",
    "raw_header",
    "stores_exactly",
    "write_native",
]

DATA_ALIGNMENT = 4096
MAX_HEADER_BYTES = 100 * 1024 * 1024
_MANIFEST_KEY = "jaxstow"
_HASH_KEY = "jaxstow_header_xxh3"
#: A jaxstow header's text ends with these bytes around its checksum (16 hex digits): the checksum is the last member
#: of ``__metadata__``, which is the last member of the header.
_HASH_PREFIX = f'"{_HASH_KEY}":"'.encode()
_HASH_SUFFIX = b'"}}'
_HEX_DIGITS = frozenset(b"0123456789abcdef")
_ZEROS = ZERO_CHECKSUM.encode("ascii")
_JAXSTOW_MARKS = (b'"jaxstow":"', _HASH_PREFIX, b'\\"format\\":\\"jaxstow\\"')

_BATCH_BYTES = 1 << 20
#: The name of a temporary sibling into which a file is written atomically (see jaxstow._storage.atomic).
_TEMPORARY_SIBLING = re.compile(r"\.(.+)\.jaxstow-tmp-\d+-[0-9a-f]{8}-[0-9a-f]{8}")

#: Finishes a manifest in place; see :func:`write_native`.
Complete = Callable[[], None]


def write_native(
    sink: BinaryIO,
    tensors: Sequence[tuple[str, HostArray]],
    manifest: dict[str, Any] | None,
    complete: Complete | None = None,
    *,
    plain: Mapping[str, str] | None = None,
) -> str | None:
    """Write ``tensors`` (name, C-contiguous array or :class:`~jaxstow._format.pieces.Deferred`) and the manifest to ``sink``, streaming each array once.

    ``complete()``, when given, finishes the manifest in place (its checksums, computed while the data is written;
    they have the same length as the placeholders they replace). On a seekable sink the header is written first with
    the placeholders and rewritten once the manifest is complete; otherwise ``complete()`` is awaited first.
    Returns the header's checksum (``jaxstow_header_xxh3``), or ``None`` for a file without a manifest; such a
    file's ``__metadata__`` is ``plain``, when given.

    Whatever the reader would refuse is refused before anything is written, with a :class:`FormatError` naming the
    file (the sink's name): a tensor named ``__metadata__`` (the header's own key), an array of more axes than
    :data:`~jaxstow._format.dtypes.MAX_AXES`, a manifest over the limits of
    :func:`~jaxstow._format.manifest.check_nesting`, and a header longer than :data:`MAX_HEADER_BYTES`.
    """
    file = _sink_name(sink)
    _check_tensors(tensors, file=file)
    if manifest is not None:
        check_nesting(manifest, file=file)
    codes = _Codes()
    itemsizes = {codes.stored_itemsize(dtype) for dtype in {array.dtype for _, array in tensors}}
    ordered = sorted(tensors, key=lambda item: -codes.stored_itemsize(item[1].dtype)) if len(itemsizes) > 1 else tensors
    patch_later = complete is not None and bool(getattr(sink, "seekable", lambda: False)())
    if complete is not None and not patch_later:
        complete()
    start = sink.tell() if patch_later else 0
    entries = _tensor_entries(ordered, codes)
    header = _header(entries, manifest, plain)
    if len(header) - 8 > MAX_HEADER_BYTES:
        raise FormatError(
            f"the header would take {len(header) - 8} bytes, more than the {MAX_HEADER_BYTES} a file may hold (its "
            f"{len(entries)} tensors and its manifest): save the tree in several files, such as a checkpoint's items",
            file=file,
        )
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
    return None if manifest is None else _recorded_checksum(header[8:])


def _sink_name(sink: BinaryIO) -> str | None:
    """The file a sink writes, for messages.

    Its name, with the suffix of a temporary sibling (an atomic write's ``.name.jaxstow-tmp-...``) taken off.
    """
    name = getattr(sink, "name", None)
    if not isinstance(name, str) or not name:
        return None
    folder, base = os.path.split(name)
    final = _TEMPORARY_SIBLING.fullmatch(base)
    return os.path.join(folder, final.group(1)) if final else name


def _check_tensors(tensors: Sequence[tuple[str, HostArray]], *, file: str | None) -> None:
    """Refuse tensors the reader would refuse: one named ``__metadata__``, one of more axes than a file holds."""
    for name, array in tensors:
        if name == "__metadata__":
            raise FormatError(
                "a safetensors file cannot hold a tensor named '__metadata__'; rename the key", file=file, path=name
            )
        if array.ndim > MAX_AXES:
            checked_shape(list(array.shape), array.dtype, file=file, path=name)


def stores_exactly(dtype: np.dtype) -> bool:
    """Whether the native container stores ``dtype`` as it is (otherwise as raw bytes, ``U8``)."""
    return safetensors_code(dtype) is not None


def _write_arrays(sink: BinaryIO, arrays: Sequence[HostArray]) -> None:
    """Write the arrays' bytes back to back.

    Small ones joined into batches of about ``_BATCH_BYTES``, each one write, large ones as they are (a join costs less
    than a write call per small array); a deferred tensor piece by piece, each piece released once written.
    """
    batch: list[memoryview] = []
    batched = 0
    for array in arrays:
        nbytes = array.nbytes
        if nbytes >= _BATCH_BYTES or isinstance(array, Deferred):
            if batch:
                sink.write(b"".join(batch))
                batch, batched = [], 0
            for piece in array.written() if isinstance(array, Deferred) else [array]:
                sink.write(raw_buffer(piece))
        elif nbytes:
            batch.append(raw_buffer(array))
            batched += nbytes
            if batched >= _BATCH_BYTES:
                sink.write(b"".join(batch))
                batch, batched = [], 0
    if batch:
        sink.write(b"".join(batch))


def _tensor_entries(ordered: Sequence[tuple[str, HostArray]], codes: _Codes) -> dict[str, Any]:
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


def _header(entries: dict[str, Any], manifest: dict[str, Any] | None, plain: Mapping[str, str] | None = None) -> bytes:
    """The length prefix and the padded JSON header of a file holding ``entries``' tensors and ``manifest``.

    ``entries`` as :func:`_tensor_entries` makes them.
    """
    header = {**entries, "__metadata__": dict(plain)} if plain else entries
    if manifest is not None:
        version = manifest.get("version")
        plain = plain_metadata(manifest.get("metadata")) if _at_least(version, PLAIN_METADATA_VERSION) else {}
        metadata = {_MANIFEST_KEY: dump_json(columnar(manifest)).decode("utf-8"), **plain, _HASH_KEY: ZERO_CHECKSUM}
        header = {**entries, "__metadata__": metadata}
    text = dump_json(header)
    if manifest is not None:  # the text ends with the zeroed checksum, which now takes the text's checksum
        text = text[: -len(ZERO_CHECKSUM) - len(_HASH_SUFFIX)] + checksum_bytes(text).encode() + _HASH_SUFFIX
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


def raw_header(source: ReadSource) -> bytes:
    """The header text of a safetensors file (padding included), after checking that the file can be one.

    Its length is checked against :data:`MAX_HEADER_BYTES` and the file's size before a byte more of it is read: one
    read of the file's first :data:`DATA_ALIGNMENT` bytes, which hold a small header whole, and one for the rest.
    """
    size = source.size
    if size < 8:
        raise TruncatedFileError(f"{source.describe_size()} is too short for a safetensors header", file=source.name)
    first = source.read(0, min(size, DATA_ALIGNMENT))
    (length,) = struct.unpack_from("<Q", first)
    if size == 8 or first[8:9] != b"{":
        raise FormatError(
            f"not a jaxstow, safetensors or npz file (it starts with {excerpt(first[:16])})", file=source.name
        )
    if length > MAX_HEADER_BYTES:
        raise CorruptFileError(
            f"header length {length} exceeds the limit of {MAX_HEADER_BYTES} bytes", file=source.name
        )
    if 8 + length > size:
        raise TruncatedFileError(
            f"the header claims {length} bytes but the file has only {size - 8} after the length", file=source.name
        )
    if 8 + length <= len(first):
        return first[8 : 8 + length]
    return first[8:] + source.read(len(first), 8 + length - len(first))


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
    raw = raw_header(source)
    if not claims_manifest(raw):
        raise FormatError("not a jaxstow file: its header has no jaxstow manifest", file=source.name)
    return _check_header_checksum(raw, file=source.name)


def claims_manifest(raw: bytes) -> bool:
    """Whether a header's text (:func:`raw_header`) shows a sign of a jaxstow manifest: its key, its checksum's key or
    its format name. Such a header must then pass its checksum; a plain safetensors file's shows none."""
    return any(mark in raw for mark in _JAXSTOW_MARKS)


def _checksum_at(raw: bytes) -> int | None:
    """Where the checksum a header's text (``raw``: the bytes after the length, padding included) ends with starts.

    The 16 hex digits between ``"jaxstow_header_xxh3":"`` and ``"}}``, the text's last bytes before the padding;
    ``None`` if it does not end so. Found from the end, without a copy of the text.
    """
    end = raw.rfind(_HASH_SUFFIX)
    start = end - len(ZERO_CHECKSUM)
    if (
        start < len(_HASH_PREFIX)
        or raw.count(b" ", end + len(_HASH_SUFFIX)) != len(raw) - end - len(_HASH_SUFFIX)
        or not raw.endswith(_HASH_PREFIX, 0, start)
        or not _HEX_DIGITS.issuperset(raw[start:end])
    ):
        return None
    return start


def _recorded_checksum(raw: bytes) -> str | None:
    """The checksum a header's text ends with (see :func:`_checksum_at`); ``None`` if it does not end with one."""
    start = _checksum_at(raw)
    return None if start is None else raw[start : start + len(ZERO_CHECKSUM)].decode("ascii")


def _check_header_checksum(raw: bytes, *, file: str) -> str:
    """The checksum a jaxstow header's text ends with.

    A :class:`CorruptFileError` unless it is the xxh3-64 of the text (padding taken off) with those 16 digits replaced
    by ``0`` (any change, keys included, is caught). Hashed in place, the digits' zeros fed between the text around
    them.
    """
    start = _checksum_at(raw)
    if start is not None:
        end = start + len(ZERO_CHECKSUM)
        text = memoryview(raw)
        digest = xxhash.xxh3_64()
        digest.update(text[:start])
        digest.update(_ZEROS)
        digest.update(text[end : end + len(_HASH_SUFFIX)])
        recorded = raw[start:end].decode("ascii")
        if digest.hexdigest() == recorded:
            return recorded
    raise CorruptFileError("the header's checksum does not match: the header is corrupt", file=file)


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
    must be its string values. ``raw``, when given, is the header's text already read (:func:`raw_header`);
    ``fast=False`` parses it with memory that follows its entries, not its length (see
    :func:`~jaxstow._format.json_codec.parse_json`).
    """

    def __init__(self, source: ReadSource, raw: bytes | None = None, *, fast: bool = True) -> None:
        self.source = source
        self.file = source.name
        self.manifest: dict[str, Any] | None = None
        self.columns: LeafColumns | None = None
        raw = raw_header(source) if raw is None else raw
        with gc_paused():  # the header read, parsing it makes objects for each tensor: see jaxstow._util.gc_pause
            header = self._read_header(raw, fast)
            self.slots = header.slots
            self.metadata = header.metadata
            if _MANIFEST_KEY in self.metadata:
                self.manifest = parse_json(self.metadata[_MANIFEST_KEY], what="the jaxstow manifest", file=self.file)
                self._check_plain_keys(self.manifest)

    def _check_plain_keys(self, manifest: Any) -> None:
        """Check that the keys beside jaxstow's own are exactly the user's string metadata.

        Only version 4 on writes them; a newer version is left to the manifest's check, which says it is newer.
        """
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

    def _read_header(self, raw: bytes, fast: bool) -> _Header:
        length = len(raw)
        claimed = claims_manifest(raw)
        recorded = _check_header_checksum(raw, file=self.file) if claimed else None
        error = CorruptFileError if claimed else FormatError
        header = parse_json(raw, what="the header", file=self.file, error=error, exact_integers=False, fast=fast)
        if not isinstance(header, dict):
            raise FormatError("the header is not a JSON object", file=self.file)
        last = next(reversed(header), None)
        metadata = header.pop("__metadata__", None) or {}
        if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
            raise FormatError("__metadata__ must map strings to strings", file=self.file)
        if claimed and not (
            last == "__metadata__"
            and _MANIFEST_KEY in metadata
            and next(reversed(metadata)) == _HASH_KEY
            and metadata[_HASH_KEY] == recorded
        ):
            raise CorruptFileError(
                f"the header's metadata keys {excerpt(list(metadata))} are not jaxstow's (the manifest, then the "
                f"checksum last, in the header's last member): the header is corrupt",
                file=self.file,
            )
        slots = check_header(header, data_start=8 + length, file_size=self.source.size, file=self.file)
        return _Header(slots, metadata)

    def read(self, names: Sequence[str], verify: Verify | None = None) -> dict[str, np.ndarray]:
        """The stored arrays of ``names``, each in its own 64-byte-aligned buffer where that matters."""
        return read_slots(self.source, [self.slots[name] for name in names], verify)

    def close(self) -> None:
        self.source.close()
