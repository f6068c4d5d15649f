"""A file's container opened: an npz archive, or a native (safetensors) file whose header is read and checked first.

The first bytes decide: a zip archive is an npz; anything else must be a safetensors file. A native header is checked
before anything is allocated, in one place: its length against the file, the checksum a jaxstow header ends with, its
JSON, its tensor table as a whole with numpy (:func:`slot_table`; docs/format.md, "Tensor entries", explained entry by
entry by :mod:`jaxstow._format.tensor_table`), the manifest's schema (:mod:`jaxstow._format.manifest`) and that it
lists exactly the file's tensors. A header that passed is kept by its bytes (:class:`HeaderCache`) for a file opened
again with the same header and size (a manifest before version 3 is parsed and checked whole again).

>>> import io, numpy as np
>>> from jaxstow._format.header import open_container
>>> from jaxstow._format.native import write_native
>>> from jaxstow._storage.opening import open_source
>>> buffer = io.BytesIO()
>>> _ = write_native(buffer, [("w", np.arange(3, dtype=np.float32))], None); _ = buffer.seek(0)
>>> container = open_container(open_source(buffer))
>>> type(container).__name__, container.slots["w"].offset, container.read(["w"])["w"]
('NativeReader', 4096, array([0., 1., 2.], dtype=float32))
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import math
import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Iterator, KeysView, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Generic, TypeVar

import numpy as np
import xxhash

from jaxstow._format.checksum import ZERO_CHECKSUM
from jaxstow._format.dtypes import MAX_ARRAY_BYTES, MAX_AXES, READ_CODES
from jaxstow._format.json_codec import check_containers, parse_json, tensor_names_problem
from jaxstow._format.manifest import ColumnMarks, LeafColumns, check_leaves, columns_again
from jaxstow._format.native import DATA_ALIGNMENT, HASH_KEY, HASH_SUFFIX, MANIFEST_KEY, MAX_HEADER_BYTES
from jaxstow._format.native_or_npz import Container
from jaxstow._format.npz import NpzReader
from jaxstow._format.source import ReadSource
from jaxstow._format.tensor_reads import TensorSlot, Verify, read_slots
from jaxstow._format.tensor_table import entry_slots
from jaxstow._util.gc_pause import PAUSED_FROM, gc_paused
from jaxstow.errors import CorruptFileError, FormatError, TruncatedFileError, excerpt

__all__ = [
    "HeaderCache",
    "NativeReader",
    "SlotTable",
    "check_header",
    "check_header_checksum",
    "claims_manifest",
    "open_container",
    "raw_header",
    "slot_table",
]

#: The bytes before a jaxstow header's checksum (16 hex digits, then :data:`~jaxstow._format.native.HASH_SUFFIX`).
_HASH_PREFIX = f'"{HASH_KEY}":"'.encode()
_HEX_DIGITS = frozenset(b"0123456789abcdef")
_ZEROS = ZERO_CHECKSUM.encode("ascii")
#: The signs of a header written by jaxstow: its manifest's key, its checksum's key, its format's name.
_JAXSTOW_MARKS = (b'"jaxstow":"', _HASH_PREFIX, b'\\"format\\":\\"jaxstow\\"')
_UNSEALED = (
    'the header shows a jaxstow key or "format":"jaxstow" but does not end with jaxstow\'s header checksum: a jaxstow '
    'file\'s header is damaged, or another tool gave its file metadata that jaxstow reserves (the key "jaxstow", '
    '"jaxstow_header_xxh3", or that text in a value): rename it in that tool to read the file here'
)
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
#: The bytes of the length and header of the file last opened by each name (up to 1 MiB): what its next first read takes.
_HEADER_BYTES: dict[str, int] = {}


def open_container(source: ReadSource) -> Container:
    """Open a source as the container its first bytes announce, which then owns the source.

    The first read decides: a page, or the bytes of the header of the file opened last by that name (read whole in one
    read then, one request to a store). The manifest must be well formed and list exactly the file's tensors (an npz
    member hidden by damage is caught). Closing the container closes the source. On failure the source stays open, for
    the caller to tell what else the file is, and to close. A native header that passed every check before, byte for
    byte in a file of the same size, is taken as it was then, with a copy of its manifest (version 3 on).
    """
    first = source.read(0, min(source.size, max(DATA_ALIGNMENT, _HEADER_BYTES.get(source.name, 0))))
    raw = None if first[:4] in _ZIP_MAGIC else raw_header(source, first)
    kept = None if raw is None else _CHECKED.get(raw, source.size)
    reader: Container = NpzReader(source) if raw is None else NativeReader(source, raw, header=kept)
    manifest = reader.manifest
    if manifest is not None and kept is not None and kept.manifest is not None:  # version 3 on
        reader.columns = columns_again(manifest, reader.slots, file=reader.file, marks=kept.marks)  # passed before
    elif manifest is not None:  # checked whole (a manifest before version 3 has its entries completed so)
        plain = reader.plain if isinstance(reader, NativeReader) else None
        reader.columns, stored = check_leaves(manifest, reader.slots, plain=plain, file=reader.file)
        if stored != reader.slots.keys():
            missing, extra = sorted(stored - reader.slots.keys()), sorted(reader.slots.keys() - stored)
            raise CorruptFileError(
                f"the file's tensors do not match its manifest (missing: {missing[:5]}, not in the manifest: "
                f"{extra[:5]})",
                file=reader.file,
            )
    if raw is not None and kept is None and isinstance(reader, NativeReader):  # every check passed
        marks = None if reader.columns is None else reader.columns.marks
        parsed = None if reader.columns is None or manifest is None else _own_copy(manifest, file=reader.file)
        _CHECKED.keep(raw, source.size, replace(reader.header, marks=marks, manifest=parsed))
    if raw is not None:
        if len(_HEADER_BYTES) >= 256:  # bounded: names seen long ago forgotten
            _HEADER_BYTES.clear()
        _HEADER_BYTES[source.name] = min(8 + len(raw), 1 << 20)
    return reader


def raw_header(source: ReadSource, first: bytes | None = None) -> bytes:
    """The header text of a safetensors file (padding included), after checking that the file can be one.

    Its length is checked against :data:`MAX_HEADER_BYTES` and the file's size before more of it is read than ``first``
    (the file's first bytes, read by the caller), or its first page.
    """
    size = source.size
    if size < 8:
        raise TruncatedFileError(f"{source.describe_size()} is too short for a safetensors header", file=source.name)
    first = source.read(0, min(size, DATA_ALIGNMENT)) if first is None else first
    (length,) = struct.unpack_from("<Q", first)
    if size == 8 or first[8:9] != b"{":
        # What it starts with is not shown: the file may be anything a path leads to (a symlink to a token, a key).
        raise FormatError("not a jaxstow, safetensors or npz file (no safetensors header starts it)", file=source.name)
    if length > MAX_HEADER_BYTES:
        limit = MAX_HEADER_BYTES
        raise CorruptFileError(f"header length {length} exceeds the limit of {limit} bytes", file=source.name)
    if 8 + length > size:
        claim = f"the header claims {length} bytes but the file has only {size - 8} after the length"
        raise TruncatedFileError(claim, file=source.name)
    if 8 + length <= len(first):
        return first[8 : 8 + length]
    return first[8:] + source.read(len(first), 8 + length - len(first))


def claims_manifest(raw: bytes) -> bool:
    """Whether a header's text shows a sign of a jaxstow manifest (its key, its checksum's key, its format name),
    which must then pass its checksum; a plain safetensors file's shows none."""
    return any(mark in raw for mark in _JAXSTOW_MARKS)


def _checksum_at(raw: bytes) -> int | None:
    """Where the checksum a header's text (``raw``: the bytes after the length, padding included) ends with starts:
    the 16 hex digits between ``"jaxstow_header_xxh3":"`` and ``"}}``, the text's last bytes before the padding;
    ``None`` if it does not end so. Found from the end, without a copy of the text."""
    end = raw.rfind(HASH_SUFFIX)
    start = end - len(ZERO_CHECKSUM)
    if (
        start < len(_HASH_PREFIX)
        or raw.count(b" ", end + len(HASH_SUFFIX)) != len(raw) - end - len(HASH_SUFFIX)
        or not raw.endswith(_HASH_PREFIX, 0, start)
        or not _HEX_DIGITS.issuperset(raw[start:end])
    ):
        return None
    return start


def check_header_checksum(raw: bytes, *, file: str) -> str:
    """The checksum a jaxstow header's text ends with.

    A :class:`CorruptFileError` unless it is the xxh3-64 of the text (padding taken off) with those 16 digits replaced
    by ``0`` (any change, keys included, is caught). Hashed in place, the digits' zeros fed between the text around
    them.
    """
    start = _checksum_at(raw)
    if start is None:  # a jaxstow file damaged there, or another tool's file that took jaxstow's words
        raise CorruptFileError(_UNSEALED, file=file)
    end = start + len(ZERO_CHECKSUM)
    text = memoryview(raw)
    digest = xxhash.xxh3_64()
    digest.update(text[:start])
    digest.update(_ZEROS)
    digest.update(text[end : end + len(HASH_SUFFIX)])
    recorded = raw[start:end].decode("ascii")
    if digest.hexdigest() != recorded:
        raise CorruptFileError("the header's checksum does not match: the header is corrupt", file=file)
    return recorded


T = TypeVar("T")


class HeaderCache(Generic[T]):
    """What was derived from headers that passed every check, by their bytes and their file's size; thread-safe.

    Found by the xxh3 of the bytes and the size, then compared byte for byte: a header that differs in any byte, or a
    file of another size, is never taken for one kept. At most ``most`` headers of ``most_bytes`` bytes, LRU.

    >>> cache = HeaderCache(most=2, most_bytes=100)
    >>> cache.keep(b'{"a":1}', 50, "checked")
    >>> cache.get(b'{"a":1}', 50), cache.get(b'{"a":1}', 51), cache.get(b'{"a":2}', 50)
    ('checked', None, None)
    """

    def __init__(self, most: int, most_bytes: int) -> None:
        self.most, self.most_bytes = most, most_bytes
        self.reset()

    def reset(self) -> None:
        """Start empty, with a lock of its own (in a forked child, whose parent's lock may be held by a thread gone)."""
        self.lock = threading.RLock()  # re-entrant: a collection started under it may run code that opens a file
        self.kept: OrderedDict[tuple[int, int], tuple[bytes, T]] = OrderedDict()
        self.held = 0

    def get(self, raw: bytes, size: int) -> T | None:
        """What was kept for the header ``raw`` of a file of ``size`` bytes, or ``None``."""
        key = (xxhash.xxh3_64_intdigest(raw), size)
        with self.lock:
            found = self.kept.get(key)
            if found is None or found[0] != raw:
                return None
            self.kept.move_to_end(key)
            return found[1]

    def keep(self, raw: bytes, size: int, derived: T) -> None:
        """Keep ``derived``, what the header ``raw`` of a file of ``size`` bytes gave after passing every check."""
        if len(raw) > self.most_bytes:
            return
        raw, gone = bytes(raw), []
        key = (xxhash.xxh3_64_intdigest(raw), size)
        with self.lock:
            before = self.kept.pop(key, None)
            self.held += len(raw) - (0 if before is None else len(before[0]))
            self.kept[key] = (raw, derived)
            while len(self.kept) > self.most or self.held > self.most_bytes:
                gone.append(self.kept.popitem(last=False)[1])
                self.held -= len(gone[-1][0])
        del before, gone  # let go outside the lock


@dataclass(frozen=True)
class _Header:
    """What a checked header holds, kept as it is (:data:`_CHECKED`): each reader copies what it may change."""

    slots: SlotTable
    metadata: MappingProxyType[str, str]
    #: The manifest's columns' read-only :attr:`~jaxstow._format.manifest.LeafColumns.marks`, from version 3 on.
    marks: ColumnMarks | None = None
    #: The manifest parsed then, from version 3 on: never handed out, each reader takes its own copy of it.
    manifest: Mapping[str, Any] | None = None


#: The headers of native files opened, kept for the next open of the same bytes; a forked child starts with none.
_CHECKED: HeaderCache[_Header] = HeaderCache(most=32, most_bytes=16 << 20)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_CHECKED.reset)


def _own_copy(manifest: Mapping[str, Any], *, file: str) -> dict[str, Any]:
    """A copy of a version 3 manifest whose parts a reader hands out or may change are its own (metadata, details,
    paths; the rest is only ever read, and shared); parts too deep to copy are a FormatError (limits come later)."""
    own = {**manifest, "paths": list(manifest["paths"])}
    try:
        own.update({key: copy.deepcopy(own[key]) for key in ("metadata", "details") if own.get(key)})
    except RecursionError:
        raise FormatError("the manifest nests deeper than a jaxstow file holds", file=file) from None
    return own


class NativeReader:
    """Reads a safetensors file, with or without a jaxstow manifest; validates the header before allocating.

    A header that shows any sign of having been written by jaxstow (its manifest key, its checksum key or the
    manifest's format name) must pass the header checksum, so a damaged key never turns a jaxstow file into a plain
    safetensors file: any damage is a :class:`CorruptFileError`. :attr:`metadata` is the header's ``__metadata__``
    (strings by string keys); in a jaxstow file the manifest's metadata is the user's, and the plain keys beside it
    must be its string values (:attr:`plain`, which :func:`open_container` checks). ``raw``, when given, is the
    header's text already read (:func:`raw_header`), ``header`` what it gave when checked before; ``fast=False``
    parses it with memory that follows its entries, not its length (:func:`~jaxstow._format.json_codec.parse_json`).
    """

    def __init__(
        self, source: ReadSource, raw: bytes | None = None, *, fast: bool = True, header: _Header | None = None
    ) -> None:
        self.source = source
        self.file = source.name
        self.manifest: dict[str, Any] | None = None
        self.columns: LeafColumns | None = None
        raw = raw_header(source) if raw is None and header is None else raw  # read unpaused; parsed paused if long
        with gc_paused() if raw is not None and len(raw) >= PAUSED_FROM else contextlib.nullcontext():
            self.header = header or self._read_header(raw or b"", fast)
            self.slots, self.metadata = self.header.slots, dict(self.header.metadata)
            text = self.metadata.get(MANIFEST_KEY)
            if self.header.manifest is not None:
                self.manifest = _own_copy(self.header.manifest, file=self.file)
            elif text is not None:
                self.manifest = parse_json(text, what="the jaxstow manifest", file=self.file)
        #: The keys of ``__metadata__`` beside jaxstow's own: the user's string metadata, in a jaxstow file.
        self.plain = {key: value for key, value in self.metadata.items() if key not in (MANIFEST_KEY, HASH_KEY)}

    def _read_header(self, raw: bytes, fast: bool) -> _Header:
        claimed = claims_manifest(raw)
        recorded = check_header_checksum(raw, file=self.file) if claimed else None
        error = CorruptFileError if claimed else FormatError
        check_containers(raw, file=self.file, error=error)
        header = parse_json(raw, what="the header", file=self.file, error=error, exact_integers=False, fast=fast)
        if not isinstance(header, dict):
            raise FormatError("the header is not a JSON object", file=self.file)
        if (problem := tensor_names_problem(raw, header)) is not None:
            raise error(problem[1], file=self.file, path=problem[0])
        last = next(reversed(header), None)
        metadata = {} if (metadata := header.pop("__metadata__", None)) is None else metadata  # not [], 0, ""
        if not isinstance(metadata, dict) or not set(map(type, metadata.values())) <= {str}:
            raise FormatError("__metadata__ must map strings to strings", file=self.file)
        if claimed and not (
            last == "__metadata__"
            and MANIFEST_KEY in metadata
            and next(reversed(metadata)) == HASH_KEY
            and metadata[HASH_KEY] == recorded
        ):
            raise CorruptFileError(
                f"the header's metadata keys {excerpt(list(metadata))} are not jaxstow's (the manifest, then the "
                f"checksum last, in the header's last member): the header is corrupt",
                file=self.file,
            )
        slots = check_header(header, data_start=8 + len(raw), file_size=self.source.size, file=self.file)
        return _Header(slots, MappingProxyType(metadata))

    def read(self, names: Sequence[str], verify: Verify | None = None) -> dict[str, np.ndarray]:
        """The stored arrays of ``names``, each in its own 64-byte-aligned buffer where that matters."""
        return read_slots(self.source, [self.slots[name] for name in names], verify)

    def close(self) -> None:
        self.source.close()


_ITEMSIZES = {code: dtype.itemsize for code, dtype in READ_CODES.items()}
#: Below this many bytes (as a float product), a shape's bytes surely fit MAX_ARRAY_BYTES: the float product of at
#: most MAX_AXES factors is off by far less than this margin. Shapes at or above it are counted exactly.
_SURELY_FITS = MAX_ARRAY_BYTES * (1 - 1e-9)


class SlotTable(Mapping[str, TensorSlot]):
    """A file's tensors by name, kept as columns that cannot change (readers of one file share them); a
    :class:`TensorSlot` is made only for a tensor asked for."""

    def __init__(
        self,
        names: list[str],
        dtypes: list[np.dtype],
        shapes: Sequence[Sequence[int]],
        offsets: np.ndarray,
        nbytes: np.ndarray,
    ) -> None:
        self.names = tuple(names)
        self.dtypes = tuple(dtypes)
        self.shapes = tuple(map(tuple, shapes))
        self.offsets = offsets  # where each tensor starts in the file
        self.nbytes = nbytes
        offsets.flags.writeable = nbytes.flags.writeable = False
        self.index = MappingProxyType(dict(zip(names, range(len(names)), strict=True)))

    def __getitem__(self, name: str) -> TensorSlot:
        i = self.index[name]
        return TensorSlot(name, self.dtypes[i], self.shapes[i], int(self.offsets[i]), int(self.nbytes[i]))

    def __contains__(self, name: object) -> bool:
        return name in self.index

    def keys(self) -> KeysView[str]:
        return self.index.keys()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def check_header(header: dict[str, Any], *, data_start: int, file_size: int, file: str) -> SlotTable:
    """The tensors of a parsed header (without ``__metadata__``), checked; else the error of the first entry that
    breaks a rule, naming the tensor: a :class:`~jaxstow.errors.TruncatedFileError` for data beyond the end of the
    file, a :class:`~jaxstow.errors.FormatError` otherwise."""
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
    if not _only(header.values(), dict):  # checked before the lists are made: every entry may be wrong
        return None
    names, infos = list(header), list(header.values())
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
    """Whether every shape (non-negative, of at most MAX_AXES axes) spans at most MAX_ARRAY_BYTES, axes of size 0
    counted as 1: computed as floats (a product too large becomes inf, never a wrapped number), and exactly in Python
    for the few shapes near the bound."""
    if not len(ndims):
        return True
    starts = np.cumsum(ndims) - ndims
    bounded = np.multiply.reduceat(np.append(np.maximum(sizes, 1), 1).astype(np.float64), starts)
    bounded = np.where(ndims == 0, 1.0, bounded) * itemsizes
    near = np.flatnonzero(~(bounded < _SURELY_FITS))
    return all(math.prod(max(size, 1) for size in shapes[row]) * int(itemsizes[row]) <= MAX_ARRAY_BYTES for row in near)
