"""What a file or a folder is, from its bytes and names alone.

jaxstow's own files, the plain files it reads, and the files of other libraries (PyTorch, pickle, equinox, flax,
orbax), for which it names the call that reads them. Nothing is parsed beyond what recognising needs (a few bytes, a
zip's member names, one ``.npy`` header), and nothing is unpickled, imported or run.

>>> import io, numpy as np
>>> from jaxstow._format.kinds import file_kind
>>> from jaxstow._storage.opening import open_source
>>> buffer = io.BytesIO()
>>> np.save(buffer, np.ones(3)); np.save(buffer, np.zeros(2)); _ = buffer.seek(0)
>>> kind = file_kind(open_source(buffer))
>>> kind.label, kind.foreign, kind.reader
('equinox tree_serialise_leaves stream', True, 'equinox')
"""

from __future__ import annotations

import ast
import math
import re
import struct
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from jaxstow._format.npz import MANIFEST_MEMBER
from jaxstow._format.source import ReadSource, SourceFile

__all__ = ["KINDS", "Kind", "file_kind", "folder_kind"]


@dataclass(frozen=True)
class Kind:
    """A kind of file or folder.

    Its ``label`` (what ``jaxstow inspect`` calls it), whether jaxstow's readers read it directly (``foreign`` if not)
    and the ``from_format`` that reads it (``reader``), if any.
    """

    name: str
    label: str
    foreign: bool = True
    reader: str | None = None


KINDS = {
    kind.name: kind
    for kind in (
        Kind("jaxstow", "jaxstow", foreign=False),
        Kind("safetensors", "plain safetensors", foreign=False),
        Kind("npz", "npz from numpy", foreign=False),
        Kind("jaxstow-npz", "npz from jaxstow", foreign=False),
        Kind("torch-zip", "PyTorch zip", reader="torch"),
        Kind("torch-legacy", "PyTorch legacy", reader="torch"),
        Kind("pickle", "pickle"),
        Kind("npy", "npy from numpy"),
        Kind("equinox", "equinox tree_serialise_leaves stream", reader="equinox"),
        Kind("flax", "flax msgpack", reader="flax"),
        Kind("orbax", "orbax checkpoint", reader="orbax"),
        Kind("orbax-step", "orbax manager step", reader="orbax"),
        Kind("orbax-manager", "orbax manager folder", reader="orbax"),
        Kind("jaxstow-step", "jaxstow checkpoint step"),
        Kind("jaxstow-folder", "jaxstow checkpoint folder"),
        Kind("unknown", "unknown"),
    )
}

_ZIP = (b"PK\x03\x04", b"PK\x05\x06")
# torch.save's legacy format starts with a pickled magic number (0x1950a86a20f9469cfc6c), protocol 2.
_TORCH_LEGACY = b"\x80\x02\x8a\x0a" + (0x1950A86A20F9469CFC6C).to_bytes(10, "little")
_NPY = b"\x93NUMPY"
_MSGPACK_MAPS = {*range(0x81, 0x90), 0xDE, 0xDF}  # a map of one or more entries (flax saves a dict)
_MSGPACK_STRINGS = {*range(0xA0, 0xC0), 0xD9, 0xDA, 0xDB}
_MSGPACK_FIRST_KEY = {0xDE: 3, 0xDF: 5}  # where a map's first key starts: after its 2- or 4-byte length (16+ keys)
_MAX_NPY_HEADER = 1 << 16


def file_kind(source: ReadSource) -> Kind:
    """The kind of a file, from its first bytes.

    And, for a zip, its member names; for ``.npy`` data, whether another array follows the first.
    """
    head = source.read(0, min(source.size, 16))
    if head[:4] in _ZIP:
        return _zip_kind(source)
    if len(head) >= 9 and head[8:9] == b"{":  # first: a safetensors header's length may begin like anything
        (length,) = struct.unpack("<Q", head[:8])
        if 8 + length <= source.size:
            return KINDS["jaxstow" if _has_manifest(source.read(8, min(length, 1 << 20))) else "safetensors"]
    if head.startswith(_TORCH_LEGACY):
        return KINDS["torch-legacy"]
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return KINDS["pickle"]
    if head.startswith(_NPY):
        return KINDS["equinox" if _npy_follows(source, _npy_end(source, 0)) else "npy"]
    return KINDS["flax" if _starts_a_msgpack_dict(source, head) else "unknown"]


def _starts_a_msgpack_dict(source: ReadSource, head: bytes) -> bool:
    """Whether the file starts as flax's msgpack does: a map of one or more entries whose first key is a printable
    string followed by a value (random bytes seldom are; a file taken for one is read as one, and says why not)."""
    key = _MSGPACK_FIRST_KEY.get(head[0], 1) if head else 1  # after a map16's or map32's length
    if not (len(head) > key and head[0] in _MSGPACK_MAPS and head[key] in _MSGPACK_STRINGS):
        return False
    width = {0xD9: 1, 0xDA: 2, 0xDB: 4}.get(head[key], 0)  # of the length of a str8, str16 or str32
    start = key + 1 + width
    length = int.from_bytes(head[key + 1 : start], "big") if width else head[key] - 0xA0
    if start + length >= source.size or length > _MAX_NPY_HEADER:
        return False
    text = source.read(start, length + 1)
    try:
        name = text[:length].decode("utf-8")
    except UnicodeDecodeError:
        return False
    return name.isprintable() and text[length] != 0xC1  # a value of any type but the one msgpack never uses


def _zip_kind(source: ReadSource) -> Kind:
    try:
        with zipfile.ZipFile(SourceFile(source)) as archive:
            names = archive.namelist()
    except Exception:  # zipfile raises many kinds on a damaged archive
        return KINDS["unknown"]
    if any(re.fullmatch(r"[^/]+/data\.pkl", name) for name in names):
        return KINDS["torch-zip"]
    if f"{MANIFEST_MEMBER}.npy" in names:
        return KINDS["jaxstow-npz"]
    return KINDS["npz"] if all(name.endswith(".npy") for name in names) else KINDS["unknown"]


def _has_manifest(header: bytes) -> bool:
    return b'"jaxstow"' in header or b'"jaxstow_header_xxh3"' in header


def _npy_end(source: ReadSource, start: int) -> int | None:
    """Where the ``.npy`` array that starts at ``start`` ends, from its header; ``None`` if it has none there."""
    head = source.read(start, min(12, source.size - start))
    if len(head) < 10 or not head.startswith(_NPY):
        return None
    major = head[6]
    if major == 1:
        (length,), offset = struct.unpack("<H", head[8:10]), 10
    elif len(head) >= 12:
        (length,), offset = struct.unpack("<I", head[8:12]), 12
    else:
        return None
    if length > _MAX_NPY_HEADER or start + offset + length > source.size:
        return None
    try:
        header = ast.literal_eval(source.read(start + offset, length).decode("latin1"))
        itemsize = int(np.dtype(header["descr"]).itemsize)
        count: int = math.prod(int(size) for size in header["shape"])
    except (ValueError, SyntaxError, KeyError, TypeError, MemoryError, RecursionError):
        return None
    return int(start + offset + length + count * itemsize)


def _npy_follows(source: ReadSource, end: int | None) -> bool:
    return end is not None and end < source.size and source.read(end, min(6, source.size - end)) == _NPY


def folder_kind(listing: Callable[[str], Sequence[str] | None]) -> Kind:
    """The kind of a folder.

    ``listing(relative)`` gives the names in a subfolder (``""``: the folder itself), or ``None`` if it is not a folder.
    """
    names = set(listing("") or ())
    if "checkpoint.json" in names:
        return KINDS["jaxstow-step"]
    if "_CHECKPOINT_METADATA" in names and not ({"_METADATA", "manifest.ocdbt", "checkpoint"} & names):
        return KINDS["orbax-step"]
    if {"_METADATA", "manifest.ocdbt", "checkpoint", "_CHECKPOINT_METADATA"} & names:
        return KINDS["orbax"]
    steps = [name for name in sorted(names) if re.fullmatch(r"(?:.+_)?\d+", name)]
    if any("checkpoint.json" in (listing(name) or ()) for name in steps):
        return KINDS["jaxstow-folder"]
    if any("_CHECKPOINT_METADATA" in (listing(name) or ()) for name in steps):
        return KINDS["orbax-manager"]
    return KINDS["unknown"]
