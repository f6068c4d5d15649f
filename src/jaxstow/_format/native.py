"""The native container, written: a valid safetensors file whose metadata carries the jaxstow manifest.

A header padded so that the data region starts on a 4096-byte boundary, tensors ordered largest item size first so
each is naturally aligned, and ``__metadata__`` holding the manifest, the user's string metadata and the header's own
checksum. docs/format.md specifies it byte by byte; :mod:`jaxstow._format.header` reads it back.

>>> import io, numpy as np
>>> from jaxstow._format.header import NativeReader
>>> from jaxstow._format.native import write_native
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
from typing import Any, BinaryIO

import numpy as np

from jaxstow._format.checksum import ZERO_CHECKSUM, checksum_bytes, raw_buffer
from jaxstow._format.clear_writes import write_clear
from jaxstow._format.dtypes import MAX_AXES, checked_shape, plain_code, safetensors_code
from jaxstow._format.json_codec import dump_json
from jaxstow._format.manifest import PLAIN_METADATA_VERSION, plain_metadata, version_at_least
from jaxstow._format.manifest_written import check_nesting, columnar
from jaxstow._format.pieces import Deferred, HostArray
from jaxstow.errors import FormatError

__all__ = [
    "DATA_ALIGNMENT",
    "HASH_KEY",
    "HASH_SUFFIX",
    "MANIFEST_KEY",
    "MAX_HEADER_BYTES",
    "Complete",
    "sink_name",
    "stores_exactly",
    "write_native",
]

DATA_ALIGNMENT = 4096
MAX_HEADER_BYTES = 100 * 1024 * 1024
#: The keys of a jaxstow header's ``__metadata__``: the manifest's, and its last, the header's own checksum.
MANIFEST_KEY = "jaxstow"
HASH_KEY = "jaxstow_header_xxh3"
#: A jaxstow header's text ends with these bytes after its checksum (16 hex digits): the checksum is the last member
#: of ``__metadata__``, which is the last member of the header.
HASH_SUFFIX = b'"}}'

_BATCH_BYTES = 1 << 20
#: The name of a temporary sibling into which a file is written atomically (see jaxstow._storage.atomic).
_TEMPORARY_SIBLING = re.compile(r"\.(.+)\.jaxstow-tmp-\d+(?:-[0-9a-f]{8}){3}")

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
    file's ``__metadata__`` is ``plain``, when given, and its dtypes take the newer codes too (:func:`plain_code`).

    Whatever the reader would refuse is refused before anything is written, with a :class:`FormatError` naming the
    file (the sink's name): a tensor named ``__metadata__`` (the header's own key), an array of more axes than
    :data:`~jaxstow._format.dtypes.MAX_AXES`, a manifest over the limits of
    :func:`~jaxstow._format.manifest_written.check_nesting`, and a header longer than :data:`MAX_HEADER_BYTES`.
    """
    file = sink_name(sink)
    _check_tensors(tensors, file=file)
    if manifest is not None:
        check_nesting(manifest, file=file)
    codes = _Codes(plain_code if manifest is None else safetensors_code)
    itemsizes = {codes.stored_itemsize(dtype) for dtype in {array.dtype for _, array in tensors}}
    ordered = sorted(tensors, key=lambda item: -codes.stored_itemsize(item[1].dtype)) if len(itemsizes) > 1 else tensors
    patch_later = complete is not None and bool(getattr(sink, "seekable", lambda: False)())
    if complete is not None and not patch_later:
        complete()
    start = sink.tell() if patch_later else 0
    entries = _tensor_entries(ordered, codes)
    header, checksum = _header(entries, manifest, plain)
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
        final, checksum = _header(entries, manifest)
        if len(final) != len(header):
            raise AssertionError("the completed manifest changed the header's length")
        end = sink.tell()
        sink.seek(start)
        sink.write(final)
        sink.seek(end)
    return checksum


def sink_name(sink: BinaryIO) -> str | None:
    """The file a sink writes, for messages.

    Its name, with the suffix of a temporary sibling (an atomic write's ``.name.jaxstow-tmp-...``, of the file or of
    a folder written whole) taken off.
    """
    name = getattr(sink, "name", None)
    if not isinstance(name, str) or not name:
        return None
    parts = [(final.group(1) if (final := _TEMPORARY_SIBLING.fullmatch(part)) else part) for part in name.split(os.sep)]
    return os.sep.join(parts)


def _check_tensors(tensors: Sequence[tuple[str, HostArray]], *, file: str | None) -> None:
    """Refuse tensors the reader would refuse: one named ``__metadata__``, one of more axes than a file holds, and one
    whose name is no valid Unicode (a lone surrogate), which safetensors' parser refuses with the whole header."""
    try:
        "".join(name for name, _ in tensors).encode("utf-8")
    except UnicodeEncodeError as error:
        odd = next(name for name, _ in tensors if error.object[error.start] in name)
        raise FormatError(
            "a safetensors file cannot name a tensor with a lone surrogate (no valid Unicode; the safetensors library "
            "refuses the whole file); rename the key",
            file=file,
            path=odd,
        ) from None
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


def plain_stores_exactly(dtype: np.dtype) -> bool:
    """Whether a plain safetensors file (no jaxstow manifest) stores ``dtype`` as it is: under a code a jaxstow file
    keeps for its readers' sake as raw bytes (``F8_E8M0``, the fnuz float8 codes) too."""
    return plain_code(dtype) is not None


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
                write_clear(sink, raw_buffer(piece))
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


def _header(
    entries: dict[str, Any], manifest: dict[str, Any] | None, plain: Mapping[str, str] | None = None
) -> tuple[bytes, str | None]:
    """The length prefix and the padded JSON header of a file holding ``entries``' tensors and ``manifest``, and the
    header's checksum (``None`` without a manifest).

    ``entries`` as :func:`_tensor_entries` makes them.
    """
    header = {**entries, "__metadata__": dict(plain)} if plain else entries
    if manifest is not None:
        version = manifest.get("version")
        plain = plain_metadata(manifest.get("metadata")) if version_at_least(version, PLAIN_METADATA_VERSION) else {}
        metadata = {MANIFEST_KEY: dump_json(columnar(manifest)).decode("utf-8"), **plain, HASH_KEY: ZERO_CHECKSUM}
        header = {**entries, "__metadata__": metadata}
    text = dump_json(header)
    checksum = None
    if manifest is not None:  # the text ends with the zeroed checksum, which now takes the text's checksum
        checksum = checksum_bytes(text)
        text = text[: -len(ZERO_CHECKSUM) - len(HASH_SUFFIX)] + checksum.encode() + HASH_SUFFIX
    padded = len(text) + (-(8 + len(text)) % DATA_ALIGNMENT)
    return struct.pack("<Q", padded) + text.ljust(padded, b" "), checksum


class _Codes:
    """The safetensors code of each dtype met in one write (``None``: stored as raw bytes), looked up once each by
    ``lookup`` (:func:`plain_code` for a file without a manifest, :func:`safetensors_code` else)."""

    def __init__(self, lookup: Callable[[np.dtype], str | None]) -> None:
        self._lookup = lookup
        self._codes: dict[np.dtype, str | None] = {}

    def code(self, dtype: np.dtype) -> str | None:
        try:
            return self._codes[dtype]
        except KeyError:
            return self._codes.setdefault(dtype, self._lookup(dtype))

    def stored_itemsize(self, dtype: np.dtype) -> int:
        """The item size of the dtype the file stores ``dtype`` as."""
        return dtype.itemsize if self.code(dtype) is not None else 1
