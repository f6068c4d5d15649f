"""The npz container: a zip of ``.npy`` members that ``numpy.load(..., allow_pickle=False)`` reads.

Leaves are members named by their paths; the jaxstow manifest, when there is one, is the member ``__jaxstow__``
(a uint8 array of JSON). Dtypes numpy cannot describe portably (bfloat16, int4, ...) are stored as raw bytes.

>>> import io, numpy as np
>>> from jaxstow._format.npz import NpzReader, write_npz
>>> from jaxstow._storage.opening import open_source
>>> buffer = io.BytesIO()
>>> write_npz(buffer, [("a/b", np.ones(2, np.int8))], {"format": "jaxstow"})
>>> _ = buffer.seek(0)
>>> sorted(np.load(io.BytesIO(buffer.getvalue()), allow_pickle=False).files)
['__jaxstow__', 'a/b']
>>> NpzReader(open_source(buffer)).read(["a/b"])["a/b"]
array([1, 1], dtype=int8)
"""

from __future__ import annotations

import io
import struct
import sys
import zipfile
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO

import numpy as np

from jaxstow._format.checksum import as_bytes, checksum_bytes
from jaxstow._format.dtypes import MAX_AXES, checked_shape
from jaxstow._format.json_codec import dump_json, has_lone_surrogate, parse_json
from jaxstow._format.manifest import LeafColumns
from jaxstow._format.manifest_written import check_nesting, columnar
from jaxstow._format.native import sink_name
from jaxstow._format.source import ReadSource, SourceFile
from jaxstow._format.tensor_reads import TensorSlot, Verify
from jaxstow.errors import CorruptFileError, FormatError, JaxstowError, excerpt

__all__ = ["MANIFEST_MEMBER", "NpzReader", "check_member_name", "stores_exactly", "write_npz"]

MANIFEST_MEMBER = "__jaxstow__"
_NUMPY_DTYPES = frozenset(np.dtype(code) for code in "?bhilqBHILQefdFD")
#: The header reader of each npy format version: 3.0 is 2.0 with UTF-8 text, which differs only in the names of
#: a structured dtype's fields (refused whatever they are).
_HEADER_READERS = {
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
    (3, 0): np.lib.format.read_array_header_2_0,
}
#: How a jaxstow manifest starts (format.md: its first member is ``format``), to find one under another name.
_MANIFEST_START = b'{"format":"jaxstow"'
_MAX_INFLATION = 1032  # deflate's largest ratio of output to input
_LOCAL_HEADER = struct.Struct("<4s5H3L2H")  # a member's local header, its name's and extra field's lengths last
_EOCD = struct.Struct("<4s4H2LH")  # end of central directory: signature, disks, counts, size, offset, comment length
_EOCD_SIGNATURE = b"PK\x05\x06"
_EOCD_SEARCH = _EOCD.size + 0xFFFF  # the record ends the file, followed by a comment of at most 65535 bytes
_ZIP64_LOCATOR = struct.Struct("<4sLQL")
_ZIP64_LOCATOR_SIGNATURE = b"PK\x06\x07"
_ZIP64_EOCD = struct.Struct("<4sQ2H2L4Q")
_ZIP64_EOCD_SIGNATURE = b"PK\x06\x06"


def stores_exactly(dtype: np.dtype) -> bool:
    """Whether an npz member stores ``dtype`` as it is (otherwise as raw bytes, ``uint8``)."""
    return dtype in _NUMPY_DTYPES


def _refused_dtype(dtype: np.dtype, members: set[str], file: str | None) -> str:
    """Why a member of ``dtype`` is not loaded from the archive of ``members``, and what reads the archive: Objax's
    and FlareJax's own archives hold text (their names, their description) beside arrays named ``0``, ``1``, ..."""
    if dtype.kind == "O":
        return f"unsupported dtype {dtype} (object arrays are never loaded)"
    shown = repr(file) if file is not None and not file.startswith("<") else "path"
    numbered = {str(index) for index in range(len(members) - 1)}
    if dtype.kind == "U" and members == {"names", *numbered}:
        return (
            "the variable names of an Objax archive (objax.io.save_var_collection), which holds variables, not a "
            f"tree: load them into a module with jaxstow.objax.load_var_collection({shown}, module.vars())"
        )
    if dtype.kind == "U" and members == {"data", *numbered}:
        return (
            "the description of a FlareJax archive (flarejax.save), which only FlareJax reads: load the model with "
            f"flarejax.load({shown}) and save it again with jaxstow.save(..., model)"
        )
    return (
        f"unsupported dtype {dtype}, which no jaxstow leaf has (the archive was written by another tool): read it with "
        f"numpy.load({shown})"
    )


def _numpy_native(array: np.ndarray) -> np.ndarray:
    return array if stores_exactly(array.dtype) else array.reshape(-1).view(np.uint8)


def write_npz(
    sink: BinaryIO,
    tensors: Sequence[tuple[str, np.ndarray]],
    manifest: dict[str, Any] | None,
    complete: Callable[[], None] | None = None,
) -> None:
    """Write ``tensors`` and then the manifest (finished by ``complete()``) as an uncompressed npz.

    Leaf names a zip member cannot hold faithfully, arrays of more axes than a file holds and a manifest over the
    limits of :func:`~jaxstow._format.manifest_written.check_nesting` are refused before anything is written. Every member
    carries its CRC-32, and the manifest each leaf's xxh3 and the list of members, so any damage is found on reading.
    """
    file = sink_name(sink)
    for name, array in tensors:
        check_member_name(name, file=file)
        if array.ndim > MAX_AXES:  # what the manifest of raw bytes, and numpy 1, could not read back
            checked_shape(list(array.shape), array.dtype, file=file, path=name)
    if manifest is not None:
        check_nesting(manifest, file=file)
    with zipfile.ZipFile(sink, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, array in tensors:
            _write_member(archive, name, array)
        if complete is not None:
            complete()
        if manifest is not None:
            text = dump_json(columnar(manifest))
            _write_member(archive, MANIFEST_MEMBER, np.frombuffer(text, dtype=np.uint8))


def check_member_name(name: str, *, file: str | None = None) -> None:
    """Refuse a leaf name that would not come back as itself from a zip member name (or would name the manifest) in
    the npz ``file``."""
    parts = name.split("/")
    problems = {
        "it holds a NUL character": "\0" in name,
        "it holds a backslash": "\\" in name,
        "it is absolute": name.startswith("/"),
        "it has a '.' or '..' component": "." in parts or ".." in parts,
        f"{MANIFEST_MEMBER!r} is the manifest's member": name == MANIFEST_MEMBER,
        "it is not valid Unicode (a lone surrogate)": has_lone_surrogate(name),
        "it is longer than a zip member's name may be (65531 bytes)": not has_lone_surrogate(name)
        and len(name.encode()) > 65531,
    }
    for problem, found in problems.items():
        if found:
            raise FormatError(
                f"an npz archive cannot hold this leaf name: {problem}; rename the key or save to the native format",
                file=file,
                path=name,
            )


def _write_member(archive: zipfile.ZipFile, name: str, array: np.ndarray) -> None:
    stored = _numpy_native(array)
    with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
        np.lib.format.write_array_header_2_0(member, np.lib.format.header_data_from_array_1_0(stored))
        if stored.nbytes:
            member.write(as_bytes(stored))


def _declared_members(source: ReadSource) -> int | None:
    """The member count that the end-of-central-directory record declares.

    ``zipfile`` stops reading the directory where its declared size ends, so a damaged length field could otherwise hide
    the members after it.
    """
    tail_size = min(source.size, _EOCD_SEARCH)
    tail = source.read(source.size - tail_size, tail_size)
    at = tail.rfind(_EOCD_SIGNATURE)
    if at < 0 or at + _EOCD.size > len(tail):
        return None
    count = _EOCD.unpack_from(tail, at)[4]
    locator = at - _ZIP64_LOCATOR.size
    if count == 0xFFFF and locator >= 0 and tail[locator : locator + 4] == _ZIP64_LOCATOR_SIGNATURE:
        record = _ZIP64_LOCATOR.unpack_from(tail, locator)[2]
        if record + _ZIP64_EOCD.size <= source.size:
            fields = _ZIP64_EOCD.unpack(source.read(record, _ZIP64_EOCD.size))
            count = fields[7] if fields[0] == _ZIP64_EOCD_SIGNATURE else count
    return int(count)


def _check_no_overlap(source: ReadSource, infos: list[zipfile.ZipInfo], directory: int) -> None:
    """Refuse a member whose data, as long as the central directory says, runs into the next member or the
    directory (at ``directory``), as ``zipfile`` does from Python 3.12 on ("overlapped entries")."""
    ordered = sorted(infos, key=lambda info: info.header_offset)
    ends = [info.header_offset for info in ordered[1:]] + [directory]
    for info, end in zip(ordered, ends[: len(ordered)], strict=True):  # an npz of no arrays has no member
        header = source.read(info.header_offset, _LOCAL_HEADER.size)
        if len(header) < _LOCAL_HEADER.size or header[:4] != b"PK\x03\x04":
            raise CorruptFileError(f"the member {excerpt(info.filename)} has no local header", file=source.name)
        name_length, extra_length = _LOCAL_HEADER.unpack(header)[-2:]
        if info.header_offset + _LOCAL_HEADER.size + name_length + extra_length + info.compress_size > end:
            raise CorruptFileError(
                f"the member {excerpt(info.filename)} runs into the next one ({info.compress_size} bytes by the "
                "central directory): overlapped entries",
                file=source.name,
            )


class NpzReader:
    """Reads an npz archive written by jaxstow or by ``numpy.savez``; never unpickles (``text_members`` may hold
    fixed-width text, which no other member may).

    Members are found only through the central directory (``zipfile`` checks each local header's name against it),
    every member is read to its end so that its CRC-32 is checked, and any anomaly of the archive is a
    :class:`CorruptFileError` or :class:`FormatError` naming the file.
    """

    def __init__(self, source: ReadSource, *, text_members: frozenset[str] = frozenset()) -> None:
        self.source = source
        self.file = source.name
        self._text_members = text_members  # members that may hold fixed-width text (Objax's `names`)
        try:
            self._archive = zipfile.ZipFile(io.BufferedReader(SourceFile(source), 1 << 20))
            infos = self._archive.infolist()
        except JaxstowError:
            raise
        except Exception as error:  # zipfile raises many kinds on damaged archives
            raise CorruptFileError(
                f"not a readable zip archive, as an npz or a PyTorch file is ({type(error).__name__}: {error}): the "
                "file is damaged or cut short",
                file=self.file,
            ) from None
        if infos and min(info.header_offset for info in infos) != 0:  # zipfile finds the last archive of several
            raise FormatError(
                "holds other data before the npz archive at its end (a file object at the first of several archives "
                "written one after the other?): read each archive from its own file or buffer",
                file=self.file,
            )
        if sys.version_info < (3, 12):  # zipfile checks it itself from 3.12 on
            _check_no_overlap(source, infos, self._archive.start_dir)
        self._members = self._index(infos)
        declared = _declared_members(source)
        if declared != len(infos):
            raise CorruptFileError(
                f"the central directory declares {declared} members but {len(infos)} could be read from it",
                file=self.file,
            )
        self.metadata: dict[str, str] = {}
        self.manifest: dict[str, Any] | None = None
        self.columns: LeafColumns | None = None
        if MANIFEST_MEMBER in self._members:
            self._slot(MANIFEST_MEMBER)  # its size is checked before it is read
            text = self._load(MANIFEST_MEMBER).tobytes()
            self.manifest = parse_json(text, what="the jaxstow manifest", file=self.file, error=CorruptFileError)
        self.slots = {name: self._slot(name) for name in self._members if name != MANIFEST_MEMBER}
        if self.manifest is None and (renamed := next(filter(self._holds_a_manifest, self.slots), None)):
            raise CorruptFileError(
                f"holds a jaxstow manifest as the member {renamed!r}, not {MANIFEST_MEMBER!r}: the archive was edited "
                "or damaged, and read as a plain npz its leaves would lose their dtypes and structure",
                file=self.file,
            )

    def _holds_a_manifest(self, name: str) -> bool:
        """Whether the member ``name``, a 1-d ``uint8`` array as the manifest is, starts as a jaxstow manifest does."""
        slot = self.slots[name]
        if slot.dtype != np.uint8 or len(slot.shape) != 1:
            return False
        with self._archive.open(f"{name}.npy") as member:
            _HEADER_READERS[np.lib.format.read_magic(member)](member)  # read, and checked, by _slot
            return member.read(len(_MANIFEST_START)) == _MANIFEST_START

    def _index(self, infos: list[zipfile.ZipInfo]) -> dict[str, zipfile.ZipInfo]:
        members: dict[str, zipfile.ZipInfo] = {}
        for info in infos:
            if not info.filename.endswith(".npy"):
                raise FormatError(f"the member {excerpt(info.filename)} is not an .npy array", file=self.file)
            name = info.filename[: -len(".npy")]
            if name in members:
                raise CorruptFileError("the archive holds this member twice", file=self.file, path=name)
            members[name] = info
        return members

    def _slot(self, name: str) -> TensorSlot:
        try:
            with self._archive.open(f"{name}.npy") as member:
                version = np.lib.format.read_magic(member)
                read_header = _HEADER_READERS.get(version)
                if read_header is None:
                    raise FormatError(
                        f"an npy member of format version {version}, which jaxstow does not read (it reads 1.0 to 3.0)",
                        file=self.file,
                        path=name,
                    )
                shape, _, dtype = read_header(member)
                header_bytes = member.tell()
        except JaxstowError:
            raise
        except Exception as error:  # zipfile's and numpy's header parsing raise many kinds on damaged members
            raise CorruptFileError(
                f"unreadable npy member ({type(error).__name__}: {error})", file=self.file, path=name
            ) from None
        if dtype.newbyteorder("=") not in _NUMPY_DTYPES and not (name in self._text_members and dtype.kind == "U"):
            raise FormatError(_refused_dtype(dtype, set(self._members), self.file), file=self.file, path=name)
        slot = TensorSlot.at(name, dtype.newbyteorder("="), tuple(shape), 0)
        self._check_size(slot, header_bytes)
        return slot

    def _check_size(self, slot: TensorSlot, header_bytes: int) -> None:
        """Refuse a member whose header promises other than the bytes it holds, before anything is allocated."""
        info = self._members[slot.name]
        if info.file_size != header_bytes + slot.nbytes:
            raise CorruptFileError(
                f"the npy header promises {slot.dtype}{list(slot.shape)} ({slot.nbytes} bytes) but the member holds "
                f"{info.file_size - header_bytes}",
                file=self.file,
                path=slot.name,
            )
        if info.compress_type != zipfile.ZIP_STORED and info.file_size > _MAX_INFLATION * max(info.compress_size, 1):
            raise CorruptFileError(
                f"the member claims to inflate {info.compress_size} bytes to {info.file_size}, more than deflate can",
                file=self.file,
                path=slot.name,
            )

    def _load(self, name: str) -> np.ndarray:
        try:
            with self._archive.open(f"{name}.npy") as member:
                array = np.lib.format.read_array(member, allow_pickle=False)
                if member.read(1):  # reaching the end is also what makes zipfile check the CRC-32
                    raise ValueError("the member holds more bytes than its array")
        except JaxstowError:
            raise
        except Exception as error:  # a bad CRC, a damaged deflate stream, a header that changed since _slot
            raise CorruptFileError(
                f"unreadable npy member ({type(error).__name__}: {error})", file=self.file, path=name
            ) from None
        native = array.astype(array.dtype.newbyteorder("="), copy=False)
        return native if native.flags.c_contiguous else native.copy(order="C")

    def read(self, names: Sequence[str], verify: Verify | None = None) -> dict[str, np.ndarray]:
        """The stored arrays of ``names``, checked by ``verify`` when given."""
        out = {}
        for name in names:
            array = self._load(name)
            if verify is not None:
                verify(name, checksum_bytes(as_bytes(array)))
            out[name] = array
        return out

    def close(self) -> None:
        self._archive.close()
        self.source.close()
