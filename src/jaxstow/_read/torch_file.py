"""A PyTorch file read through ``torch.load(weights_only=True)``, which unpickles nothing but tensors and plain
containers: its tensors as numpy arrays, and what torch refused said without torch's advice to unpickle anyway."""

from __future__ import annotations

import re
import zipfile
from typing import Any, BinaryIO

from jaxstow._format.keypaths import path_to_str
from jaxstow._format.torch_leaves import is_tensor, tensor_to_numpy
from jaxstow._read.foreign_tree import plain_tree
from jaxstow._util.optional import require
from jaxstow.errors import CorruptFileError, FormatError, UnsaveableObjectError, excerpt

__all__ = ["read_torch"]


def read_torch(file: BinaryIO, name: str, size: int) -> Any:
    """The tree of the PyTorch file ``file`` (``name``, ``size`` bytes), its tensors as numpy arrays, a ``torch.Size``
    as the tuple of ints it is.

    A record that expands to more bytes than the whole file, and a tensor that repeats its storage's values (a stride
    of 0) into more bytes than the whole file, are refused before they are made.
    """
    torch = require("torch", extra="torch", purpose=f"reading the PyTorch file {name}")
    _check_records(file, name, size)
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises its unpickler's errors for anything but plain tensors
        raise FormatError(
            f"not a PyTorch file of tensors that loads without unpickling objects ({_torch_problem(error)})", file=name
        ) from None
    import jax

    def as_array(key_path: Any, leaf: Any) -> Any:
        if isinstance(leaf, torch.Size):  # a tuple of ints, as it is
            return tuple(int(length) for length in leaf)
        if not is_tensor(leaf):
            return leaf
        path = path_to_str(key_path)
        values = leaf.numel() * leaf.element_size()
        stored = leaf.untyped_storage().nbytes() if leaf.layout == torch.strided else values  # sparse: refused below
        if values > max(stored, size):
            raise FormatError(
                f"holds a tensor of shape {list(leaf.shape)} and strides {list(leaf.stride())} that repeats the "
                f"{stored} bytes of its storage into {values}, more than the file's {size}: save "
                "tensor.contiguous() of it where it is meant",
                file=name,
                path=path,
            )
        try:
            return tensor_to_numpy(leaf, file=name, path=path)
        except UnsaveableObjectError as error:  # said of a save: here the file holds it
            problem = str(error).partition(" is ")[2]
            raise FormatError(f"holds {excerpt(leaf)}, {problem}", file=name, path=path) from None

    return jax.tree_util.tree_map_with_path(as_array, plain_tree(state, name))


def _check_records(file: BinaryIO, name: str, size: int) -> None:
    """Refuse a record of a PyTorch zip file that expands to more bytes than the whole file, by its zip directory, and
    a damaged one: its bytes' CRC-32 not the one its directory holds (which torch.load does not check).

    torch.save stores records uncompressed, so none is larger than the file; torch.load inflates a compressed record
    whole before it compares it with its tensors, a thousand times the file's size for a file recompressed to do so.
    A legacy file, no zip, has no checksums. ``file`` is left at its start.
    """
    if file.read(4) in _ZIP_MAGIC:
        try:
            with zipfile.ZipFile(file) as archive:  # reads the central directory; the file stays open
                records = archive.infolist()
                for record in records:
                    _check_size(record, name, size)
                    _check_crc(archive, record, name)
        except FormatError:
            raise
        except Exception as error:  # zipfile raises many kinds on a damaged archive
            raise FormatError(f"not a readable zip archive ({type(error).__name__}: {error})", file=name) from None
    file.seek(0)


def _check_crc(archive: zipfile.ZipFile, record: zipfile.ZipInfo, name: str) -> None:
    try:
        with archive.open(record) as member:  # its CRC-32 compared at its end
            while member.read(_CHECKED_PIECE):
                pass
    except zipfile.BadZipFile as error:
        if not str(error).startswith("Bad CRC-32"):
            raise
        raise CorruptFileError(
            f"the bytes of its record {excerpt(record.filename)} do not match the CRC-32 that the zip's directory "
            "holds for them: the file is damaged",
            file=name,
        ) from None


def _check_size(record: zipfile.ZipInfo, name: str, size: int) -> None:
    if record.file_size > size:
        raise FormatError(
            f"its record {excerpt(record.filename)} expands from {record.compress_size} to {record.file_size} "
            f"bytes, more than the file's {size}: torch.save stores records uncompressed, so the file was "
            "compressed again by another tool; save its tensors again with torch.save",
            file=name,
        )


#: The bytes of a record read at once to check its CRC-32.
_CHECKED_PIECE = 16 << 20


#: How a zip archive starts (torch.save's format since PyTorch 1.6).
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")


def _torch_problem(error: Exception) -> str:
    """What torch.load found wrong, without its advice to unpickle anyway.

    ``weights_only=False`` would run the file's code.
    """
    text = str(error)
    unsupported = re.search(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) (\S+)", text)
    if unsupported:
        return f"it holds an object of {unsupported.group(1)}, which torch.load(weights_only=True) never unpickles"
    lines = (line.strip().removeprefix("Weights only load failed.").strip() for line in text.splitlines())
    line = next((line for line in lines if line and not line.startswith(_TORCH_ADVICE)), "")
    return f"{type(error).__name__}: {line if len(line) <= 200 else line[:197] + '...'}"


#: How the lines of torch's advice around what its unpickler refused start (to load with weights_only=False).
_TORCH_ADVICE = (
    "In PyTorch 2.6, we changed the default",
    "Re-running `torch.load`",
    "This file can still be loaded",
    "(1)",
    "(2)",
    "Please file an issue",
    "Check the",
)
