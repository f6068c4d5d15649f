"""Files and folders of other libraries: recognised, pointed to what reads them, and read where that is safe.

``jaxstow.load``, ``jaxstow.open`` and ``jaxstow inspect`` say what a foreign file is and what reads it. With
``from_format``, ``jaxstow.load`` reads PyTorch state dicts (``torch.load(weights_only=True)``), flax msgpack files
(decoded here, as nested dicts), orbax checkpoints (through orbax) and equinox streams (into ``like``), none running
code of the file's choosing. See docs/other-formats.md.

>>> import os, tempfile, jax.numpy as jnp, flax.serialization, jaxstow
>>> from jaxstow._read.foreign import read_foreign
>>> path = os.path.join(tempfile.mkdtemp(), "params.msgpack")
>>> with open(path, "wb") as file:
...     _ = file.write(flax.serialization.to_bytes({"dense": {"kernel": jnp.ones((2, 3))}, "step": 3}))
>>> read_foreign(path, "flax", like=None)
{'dense': {'kernel': array([[1., 1., 1.],
       [1., 1., 1.]], dtype=float32)}, 'step': 3}
>>> try:
...     jaxstow.load(path)
... except jaxstow.errors.FormatError as error:
...     print(error)
/.../params.msgpack: is a flax msgpack file (flax.serialization.to_bytes), not a jaxstow, safetensors or npz file: jaxstow.load('/.../params.msgpack', from_format='flax') reads it as nested dicts, and `jaxstow convert /.../params.msgpack /.../params.jxs` converts it
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import re
from typing import Any

import numpy as np

from jaxstow._format.dtypes import dtype_from_name, is_shape
from jaxstow._format.kinds import KINDS, Kind, file_kind, folder_kind
from jaxstow._format.source import ReadSource, SourceFile
from jaxstow._read import orbax_steps
from jaxstow._read.equinox_stream import read_equinox
from jaxstow._read.flax_state import into_like
from jaxstow._read.foreign_tree import plain_tree, within_nesting
from jaxstow._read.torch_file import read_torch
from jaxstow._storage.opening import Location, Readable, locate
from jaxstow._storage.settings import StorageSettings
from jaxstow._util.optional import require
from jaxstow.errors import ArgumentError, FormatError, IsAFolderError, PathNotFoundError, excerpt

__all__ = [
    "DESCRIBED",
    "FROM_FORMATS",
    "advice",
    "converted_name",
    "explained",
    "folder_problem",
    "foreign_member",
    "pointed",
    "read_foreign",
    "recognise",
]

#: What ``from_format=`` takes.
FROM_FORMATS = ("torch", "flax", "orbax", "equinox")
#: Each kind in a few words, its label among them.
DESCRIBED = {
    "jaxstow": "a jaxstow file",
    "jaxstow-npz": "a jaxstow npz file",
    "safetensors": "a plain safetensors file",
    "npz": "an npz file from numpy",
    "jaxstow-step": "a step of a jaxstow checkpoint folder",
    "jaxstow-folder": "a jaxstow checkpoint folder",
    "torch-zip": "a PyTorch zip file (torch.save)",
    "torch-legacy": "a PyTorch legacy file (torch.save before PyTorch 1.6)",
    "pickle": "a pickle file",
    "npy": "a numpy.save file (npy from numpy)",
    "equinox": "an equinox tree_serialise_leaves stream",
    "flax": "a flax msgpack file (flax.serialization.to_bytes)",
    "orbax": "an orbax checkpoint folder",
    "orbax-step": "an orbax manager step (a step of orbax's CheckpointManager)",
    "orbax-manager": "an orbax manager folder (orbax's CheckpointManager)",
}
#: What each ``from_format`` reads, and the kinds it takes (``unknown``: a damaged file, which the reader names).
_TAKES = {
    "torch": ("a PyTorch file (torch.save)", {"torch-zip", "torch-legacy", "unknown"}),
    "flax": ("a flax msgpack file", {"flax", "unknown"}),
    "orbax": ("an orbax checkpoint folder", {"orbax", "orbax-step", "orbax-manager", "unknown"}),
    "equinox": ("an equinox tree_serialise_leaves stream", {"equinox", "npy", "unknown"}),
}
_READS = {
    "torch": "reads its tensors with torch.load(weights_only=True), never unpickling other objects",
    "flax": "reads it as nested dicts",
    "orbax": "reads it through orbax",
}


def advice(kind: Kind, target: str | None) -> str:
    """The exact call or command that reads a file or folder of ``kind`` at the path ``target``.

    ``target`` is ``None`` for a file object, which the call names ``file``.
    """
    shown = "file" if target is None else repr(target)
    if not kind.foreign:
        return f"jaxstow.load({shown}) reads it, without from_format"
    if kind.name == "jaxstow-step":
        parent, step = os.path.split(os.path.abspath(str(target)))
        return f"load one of its files, or restore the step with jaxstow.CheckpointManager({parent!r}).restore({step})"
    if kind.name == "jaxstow-folder":
        return f"restore it with jaxstow.CheckpointManager({shown}).restore()"
    if kind.name == "orbax-manager":
        return (
            f"`jaxstow convert {target} {target}-jaxstow` converts every step into a jaxstow checkpoint folder, with "
            f"its metrics; jaxstow.load({os.path.join(str(target), 'STEP')!r}, from_format='orbax') reads one step"
        )
    if kind.name == "equinox":
        return (
            f"its leaves are stored without their structure: jaxstow.load({shown}, like=model, "
            "from_format='equinox') reads it into the model it was saved from (or an abstract copy), and "
            "jaxstow.save writes that as a jaxstow file"
        )
    if kind.reader is not None:
        convert = "" if target is None else f", and `jaxstow convert {target} {converted_name(target)}` converts it"
        return f"jaxstow.load({shown}, from_format={kind.reader!r}) {_READS[kind.reader]}{convert}"
    if kind.name == "pickle":
        return (
            "jaxstow never unpickles (unpickling runs code the file chooses): load it with pickle only in a program "
            "you trust, and save the tree with jaxstow.save"
        )
    if kind.name == "npy":
        return f"numpy.load({shown}, allow_pickle=False) reads it; save the array with jaxstow.save"
    return "jaxstow reads jaxstow, safetensors and npz files"


def converted_name(target: str) -> str:
    """Where ``jaxstow convert`` of the foreign file ``target`` writes, as advice names it: ``STEM.jxs``, or
    ``STEM-jaxstow.jxs`` if that is ``target`` itself (a conversion in place would replace the file).

    >>> converted_name("model.pt"), converted_name("params.jxs")
    ('model.jxs', 'params-jaxstow.jxs')
    """
    stem = os.path.splitext(target.rstrip("/"))[0]
    return f"{stem}-jaxstow.jxs" if f"{stem}.jxs" == target.rstrip("/") else f"{stem}.jxs"


def recognise(target: Readable | Location) -> Kind:
    """The kind of a file or folder (a path, a URL, a file object, a source or a location).

    ``unknown`` if it cannot be read.
    """
    return _kind(locate(target))


def _kind(location: Location, source: ReadSource | None = None) -> Kind:
    """The kind of the file or folder at ``location`` (``source``: the file, open already: read, and left open)."""
    try:
        if location.path is not None and os.path.isdir(location.path):
            return _folder_kind(location.path)
        if source is None and location.source is not None and location.path is None:
            source = location.source
        if source is not None:
            return file_kind(source)
        if location.source is not None:  # a local file, perhaps closed by a failed open: read it again by its path
            location = Location(location.name, path=location.path)
        with contextlib.closing(location.open()) as opened:
            return file_kind(opened)
    except Exception:  # recognising never raises: a file that cannot be read is of no known kind
        return KINDS["unknown"]


def _folder_kind(folder: str) -> Kind:
    return folder_kind(lambda name: _listing(folder, name))


def _listing(folder: str, name: str) -> list[str] | None:
    path = os.path.join(folder, name)
    return os.listdir(path) if os.path.isdir(path) else None


def pointed(error: FormatError, target: Readable | Location) -> FormatError:
    """For a file of another library, an error that says what it is and what reads it; otherwise ``error``."""
    return _pointed(error, locate(target))


def _pointed(error: FormatError, location: Location, source: ReadSource | None = None) -> FormatError:
    shown = _shown(location)
    if shown is not None and shown.endswith(".safetensors.index.json"):
        return FormatError(
            "is the index of a Hugging Face folder of safetensors files, not a file of tensors: "
            f"jaxstow.huggingface.load({shown!r}) reads the folder",
            file=location.name,
        )
    kind = _kind(location, source)
    if not kind.foreign or kind.name == "unknown":
        return error
    return FormatError(
        f"is {DESCRIBED[kind.name]}, not a jaxstow, safetensors or npz file: {advice(kind, _shown(location))}",
        file=location.name,
    )


def explained(
    error: FormatError | IsAFolderError, location: Location, source: ReadSource | None = None
) -> FormatError | IsAFolderError:
    """What a failed open becomes.

    A folder that says what it is (a checkpoint folder, one of its steps, orbax's) and a file of another library that
    says what reads it; any other error as it is. ``source``: the file, open already.
    """
    if isinstance(error, IsAFolderError):
        return IsAFolderError(folder_problem(location.path), file=location.path) if location.path else error
    return _pointed(error, location, source)


def _shown(location: Location) -> str | None:
    """How the call that reads it names the file: its path or URL (``None``: a file object, or a source)."""
    return location.path if location.path is not None else location.url


def folder_problem(path: str) -> str:
    """Why a folder cannot be loaded as a file.

    And what reads it if it is a checkpoint folder or one of its steps, or orbax's.
    """
    kind = _folder_kind(path)
    if kind.name == "jaxstow-step":
        return (
            f"is a folder, step {os.path.basename(os.path.abspath(path))} of a checkpoint folder: {advice(kind, path)}"
        )
    if kind.name == "jaxstow-folder":
        return f"is a checkpoint folder, not a file: {advice(kind, path)}"
    if kind.name == "unknown":
        held = foreign_member(path)
        if held is None:
            return "is a folder, not a file"
        member = os.path.join(path, held[0])
        numbered = re.search(r"-\d+-of-(\d+)\.", held[0])  # pytorch_model-00001-of-00003.bin
        shards = f" (one of {int(numbered[1])} shards of a model, each read the same way)" if numbered else ""
        return (
            f"is a folder of no model jaxstow reads whole: it holds {held[0]}{shards}, {DESCRIBED[held[1].name]}: "
            f"{advice(held[1], member)}"
        )
    return f"is {DESCRIBED[kind.name]}, not a file: {advice(kind, path)}"


#: How the hub names a model's weights, looked into before the other files (``optimizer.pt``, ``training_args.bin``).
_MODEL_NAMES = ("pytorch_model", "flax_model", "model")
#: The most files of a folder of no kind looked into for one of another library (their first bytes read).
_FILES_LOOKED_INTO = 32


def foreign_member(folder: str) -> tuple[str, Kind] | None:
    """The first file of another library (``pytorch_model.bin``, ``flax_model.msgpack``) that a folder of no kind
    holds, by name (a model's weights first), and its kind; ``None`` if it holds none. Only regular files are read,
    and only their start."""
    try:
        names = sorted(os.listdir(folder), key=lambda name: (not name.startswith(_MODEL_NAMES), name))
    except OSError:
        return None
    looked_into = 0
    for name in names:
        path = os.path.join(folder, name)
        if name.endswith((".json", ".md", ".txt")) or not os.path.isfile(path):
            continue
        kind = _kind(Location(name, path=path))
        if kind.foreign and kind.name != "unknown":
            return name, kind
        looked_into += 1
        if looked_into == _FILES_LOOKED_INTO:
            return None
    return None


def read_foreign(
    target: Readable | Location, from_format: str, *, like: Any, settings: StorageSettings | None = None
) -> Any:
    """The tree a file (or folder) of another library holds.

    Numpy arrays and Python values, or for ``"equinox"`` the tree of ``like`` with the stream's arrays (``settings`` say
    how a URL is reached).
    """
    location = locate(target)
    if location.source is not None:
        raise ArgumentError("from_format reads a path, a URL or a file object")
    if from_format not in FROM_FORMATS:
        raise ArgumentError(f"from_format must be one of {FROM_FORMATS}, not {excerpt(from_format)}")
    if from_format == "orbax" and location.file is not None:
        raise ArgumentError("an orbax checkpoint is a folder: give its path, not a file object")
    path = location.path
    if path is not None and not os.path.exists(path):
        raise PathNotFoundError("no such file or folder", file=path)
    if from_format == "orbax":
        _check_kind(location, from_format, _kind(location))
        return _read_orbax(location)
    if path is not None and os.path.isdir(path):
        raise IsAFolderError(folder_problem(path), file=path)
    with contextlib.closing(location.open(settings)) as source:
        _check_kind(location, from_format, _kind(location, source))
        if from_format == "equinox":
            return read_equinox(source.read(0, source.size), location.name, like)
        if from_format == "torch":
            return read_torch(io.BufferedReader(SourceFile(source), 1 << 20), location.name, source.size)
        tree = _read_flax(source.read(0, source.size), location.name)
        return tree if like is None else into_like(tree, like)


def _check_kind(location: Location, from_format: str, kind: Kind) -> None:
    """Refuse a file or folder of a ``kind`` that ``from_format`` does not read.

    The error says what it is and the call that reads it.
    """
    expected, takes = _TAKES[from_format]
    a_file = from_format == "orbax" and location.path is not None and not os.path.isdir(location.path)
    if kind.name in takes and not a_file:
        return
    what = DESCRIBED.get(kind.name, "a file of no kind jaxstow knows")
    raise FormatError(
        f"is {what}, not {expected} as from_format={from_format!r} reads: {advice(kind, _shown(location))}",
        file=location.name,
    )


def _read_flax(data: bytes, name: str) -> Any:
    msgpack = require("msgpack", extra="flax", purpose=f"reading the flax msgpack file {name}")

    def extension(code: int, payload: bytes) -> Any:
        if code in (1, 3):  # an array, a numpy scalar: (shape, dtype name, bytes)
            shape, dtype_name, buffer = msgpack.unpackb(payload, raw=True)
            dtype = dtype_from_name(dtype_name.decode("ascii")) if isinstance(dtype_name, bytes) else None
            if dtype is None or not is_shape(shape):
                raise FormatError(
                    f"an array of unknown dtype {excerpt(dtype_name)} or shape {excerpt(shape)}", file=name
                )
            if not isinstance(buffer, bytes) or len(buffer) != math.prod(shape) * dtype.itemsize:
                raise FormatError(
                    f"an array of {dtype}{shape} holds {math.prod(shape) * dtype.itemsize} bytes, but its data is "
                    f"{f'{len(buffer)} bytes' if isinstance(buffer, bytes) else excerpt(buffer)}: flax writes the "
                    "array's bytes",
                    file=name,
                )
            array = np.frombuffer(bytearray(buffer), dtype=dtype).reshape(shape)  # its own memory, writable
            return array[()] if code == 3 else array
        if code == 2:  # a complex number
            real, imag = msgpack.unpackb(payload)
            return complex(real, imag)
        raise FormatError(f"a msgpack extension of type {code}, which flax does not write", file=name)

    try:
        tree = msgpack.unpackb(data, ext_hook=extension, raw=False, strict_map_key=False)
    except FormatError:
        raise
    except Exception as error:  # msgpack raises its own errors and ValueError on damage
        raise FormatError(f"not a flax msgpack file ({type(error).__name__}: {error})", file=name) from None
    return plain_tree(_unchunked(tree, name, ""), name)


def _unchunked(tree: Any, name: str, path: str, depth: int = 0) -> Any:
    """flax's chunked large arrays (``{"__msgpack_chunked_array__": True, ...}``) joined back, each checked to be
    what flax writes: chunks of one dtype, as many elements as its shape. A tree nested past what a jaxstow file
    holds is a :class:`FormatError` (:func:`~jaxstow._read.foreign_tree.within_nesting`)."""
    if not isinstance(tree, dict):
        return tree
    within_nesting(depth, name, path)
    if "__msgpack_chunked_array__" in tree:  # whatever its value, as flax reads it
        try:
            shape = tuple(tree["shape"][str(i)] for i in range(len(tree["shape"])))
            chunks = [tree["chunks"][str(i)] for i in range(len(tree["chunks"]))]
            if not chunks or not all(
                isinstance(chunk, np.ndarray) and chunk.dtype == chunks[0].dtype for chunk in chunks
            ):
                raise ValueError("chunks of no array or of several dtypes")
            return np.concatenate(chunks).reshape(shape)
        except (KeyError, TypeError, ValueError) as error:
            raise FormatError(
                f"a chunked array that is not flax's ({type(error).__name__}: {excerpt(str(error))})",
                file=name,
                path=path or None,
            ) from None
    return {key: _unchunked(value, name, f"{path}/{key}".lstrip("/"), depth + 1) for key, value in tree.items()}


def _read_orbax(location: Location) -> Any:
    if location.path is None:
        assert location.url is not None
        return orbax_steps.read_checkpoint(location.url)
    where = os.path.abspath(location.path)
    kind = _folder_kind(where)
    if kind.name == "orbax-manager":
        raise FormatError(
            f"is an orbax manager folder, of several steps: {advice(kind, location.name)}", file=location.name
        )
    if kind.name == "orbax-step":
        return orbax_steps.read_step(where)[0]
    return orbax_steps.read_checkpoint(where)
