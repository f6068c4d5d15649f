"""The npz container: a zip of ``.npy`` members that ``numpy.load(..., allow_pickle=False)`` reads.

Leaves are members named by their paths; the jaxstow manifest, when there is one, is the member ``__jaxstow__``
(a uint8 array of JSON). Dtypes numpy cannot describe portably (bfloat16, int4, ...) are stored as raw bytes.

>>> import io, numpy as np
>>> from jaxstow.format.npz import NpzReader, write_npz
>>> from jaxstow.storage import open_source
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
import json
import zipfile
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO

import numpy as np

from jaxstow.errors import CorruptFileError, FormatError
from jaxstow.format.checksum import as_bytes
from jaxstow.format.reading import TensorSlot, Verify
from jaxstow.storage import ReadSource

__all__ = ["MANIFEST_MEMBER", "NpzReader", "write_npz"]

MANIFEST_MEMBER = "__jaxstow__"
_NUMPY_DTYPES = frozenset(np.dtype(code) for code in "?bhilqBHILQefdFD")
_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
_MAX_INFLATION = 1032  # deflate's largest ratio of output to input
_ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError, EOFError, KeyError)


def _numpy_native(array: np.ndarray) -> np.ndarray:
    return array if array.dtype in _NUMPY_DTYPES else array.reshape(-1).view(np.uint8)


def write_npz(
    sink: BinaryIO,
    tensors: Sequence[tuple[str, np.ndarray]],
    manifest: dict[str, Any] | None,
    complete: Callable[[], None] | None = None,
) -> None:
    """Write ``tensors`` and then the manifest (finished by ``complete()``) as an uncompressed npz."""
    with zipfile.ZipFile(sink, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, array in tensors:
            _write_member(archive, name, array)
        if complete is not None:
            complete()
        if manifest is not None:
            text = json.dumps(manifest, separators=(",", ":")).encode("utf-8")
            _write_member(archive, MANIFEST_MEMBER, np.frombuffer(text, dtype=np.uint8))


def _write_member(archive: zipfile.ZipFile, name: str, array: np.ndarray) -> None:
    stored = _numpy_native(array)
    with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
        np.lib.format.write_array_header_2_0(member, np.lib.format.header_data_from_array_1_0(stored))
        if stored.nbytes:
            member.write(as_bytes(stored))


class _SourceFile(io.RawIOBase):
    """A read-only, seekable file object over a :class:`ReadSource`, for ``zipfile``."""

    def __init__(self, source: ReadSource) -> None:
        self._source = source
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._source.size}[whence]
        self._position = max(0, base + offset)
        return self._position

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        count = max(0, min(len(view), self._source.size - self._position))
        if count:
            self._source.read_into(self._position, view[:count])
        self._position += count
        return count


class NpzReader:
    """Reads an npz archive written by jaxstow or by ``numpy.savez``; never unpickles."""

    def __init__(self, source: ReadSource) -> None:
        self.source = source
        self.file = source.name
        try:
            self._archive = zipfile.ZipFile(io.BufferedReader(_SourceFile(source), 1 << 20))
            members = {info.filename[: -len(".npy")]: info for info in self._archive.infolist()}
        except _ZIP_ERRORS as error:
            raise CorruptFileError(f"not a readable npz archive ({error})", file=self.file) from None
        self._members = members
        self.metadata: dict[str, str] = {}
        self.manifest: dict[str, Any] | None = None
        if MANIFEST_MEMBER in members:
            self._slot(MANIFEST_MEMBER)  # its size is checked before it is read
            text = self._load(MANIFEST_MEMBER).tobytes()
            try:
                self.manifest = json.loads(text)
            except (UnicodeDecodeError, json.JSONDecodeError) as error:
                raise FormatError(f"the jaxstow manifest is not valid JSON ({error})", file=self.file) from None
        self.slots = {name: self._slot(name) for name in members if name != MANIFEST_MEMBER}

    def _slot(self, name: str) -> TensorSlot:
        try:
            with self._archive.open(f"{name}.npy") as member:
                version = np.lib.format.read_magic(member)
                read_header = _HEADER_READERS.get(version)
                if read_header is None:
                    raise ValueError(f"npy format version {version} is not supported")
                shape, _, dtype = read_header(member)
                header_bytes = member.tell()
        except _ZIP_ERRORS as error:
            raise CorruptFileError(f"unreadable npy member ({error})", file=self.file, path=name) from None
        if dtype.newbyteorder("=") not in _NUMPY_DTYPES:
            raise FormatError(f"unsupported dtype {dtype} (object arrays are never loaded)", file=self.file, path=name)
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
        except _ZIP_ERRORS as error:
            raise CorruptFileError(f"unreadable npy member ({error})", file=self.file, path=name) from None
        native = array.astype(array.dtype.newbyteorder("="), copy=False)
        return native if native.flags.c_contiguous else native.copy(order="C")

    def read(self, names: Sequence[str], verify: Verify | None = None) -> dict[str, np.ndarray]:
        """The stored arrays of ``names``, checked by ``verify`` when given."""
        out = {}
        for name in names:
            array = self._load(name)
            if verify is not None:
                verify(name, as_bytes(array))
            out[name] = array
        return out

    def close(self) -> None:
        self._archive.close()
        self.source.close()
