"""Files and folders of other libraries: recognised, pointed to the call or command that reads them, and read where
that is safe.

``jaxstow.load``, ``jaxstow.open`` and ``jaxstow inspect`` say what a foreign file is and what reads it. With
``from_format``, ``jaxstow.load`` reads it: a PyTorch state dict through ``torch.load(weights_only=True)`` (which
unpickles nothing but tensors and plain containers), a flax msgpack file as nested dicts (decoded here with
``msgpack``, no code of the file's choosing), an orbax checkpoint or manager step through orbax with an abstract
target, and an equinox ``tree_serialise_leaves`` stream into ``like`` (its leaves carry no structure).

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
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any, BinaryIO

import numpy as np

from jaxstow._format.dtypes import dtype_from_name
from jaxstow._format.kinds import KINDS, Kind, file_kind, folder_kind
from jaxstow._format.source import ReadSource
from jaxstow._format.torch_leaves import is_tensor, tensor_to_numpy
from jaxstow._read import orbax_steps
from jaxstow._storage.opening import open_source
from jaxstow._storage.paths import display_name, local_path
from jaxstow._storage.sources import LocalFile
from jaxstow._util.optional import require
from jaxstow.errors import ArgumentError, FormatError, IsAFolderError, PathNotFoundError, excerpt

__all__ = ["DESCRIBED", "FROM_FORMATS", "advice", "folder_problem", "pointed", "read_foreign", "recognise"]

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
    """The exact call or command that reads a file or folder of ``kind`` at the path ``target`` (``None``: a file
    object, which the call names ``file``)."""
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
        convert = "" if target is None else f", and `jaxstow convert {target} {_stem(target)}.jxs` converts it"
        return f"jaxstow.load({shown}, from_format={kind.reader!r}) {_READS[kind.reader]}{convert}"
    if kind.name == "pickle":
        return (
            "jaxstow never unpickles (unpickling runs code the file chooses): load it with pickle only in a program "
            "you trust, and save the tree with jaxstow.save"
        )
    if kind.name == "npy":
        return f"numpy.load({shown}, allow_pickle=False) reads it; save the array with jaxstow.save"
    return "jaxstow reads jaxstow, safetensors and npz files"


def _stem(target: str) -> str:
    return os.path.splitext(target.rstrip("/"))[0]


def recognise(target: str | os.PathLike[str] | BinaryIO | ReadSource) -> Kind:
    """The kind of a file or folder (a path, a URL, a file object or a source); ``unknown`` if it cannot be read."""
    try:
        if isinstance(target, str | os.PathLike):
            path = local_path(target)
            if path is not None and os.path.isdir(path):
                return folder_kind(lambda name: _listing(path, name))
            source = open_source(target)
        elif isinstance(target, LocalFile):  # closed by a failed open: read it again from its name
            source = LocalFile(target.name)
        elif isinstance(target, ReadSource):
            return file_kind(target)
        else:
            source = open_source(target)
        try:
            return file_kind(source)
        finally:
            source.close()
    except Exception:  # recognising never raises: a file that cannot be read is of no known kind
        return KINDS["unknown"]


def _listing(folder: str, name: str) -> list[str] | None:
    path = os.path.join(folder, name)
    return os.listdir(path) if os.path.isdir(path) else None


def pointed(error: FormatError, target: str | os.PathLike[str] | BinaryIO | ReadSource) -> FormatError:
    """For a file of another library, an error that says what it is and what reads it; otherwise ``error``."""
    kind = recognise(target)
    if not kind.foreign or kind.name == "unknown":
        return error
    name = target.name if isinstance(target, ReadSource) else display_name(target)
    path = name if isinstance(target, str | os.PathLike | LocalFile) else None
    return FormatError(
        f"is {DESCRIBED[kind.name]}, not a jaxstow, safetensors or npz file: {advice(kind, path)}", file=name
    )


def folder_problem(path: str) -> str:
    """Why a folder cannot be loaded as a file, and what reads it if it is a checkpoint folder or one of its steps,
    or orbax's."""
    kind = folder_kind(lambda name: _listing(path, name))
    if kind.name == "jaxstow-step":
        return (
            f"is a folder, step {os.path.basename(os.path.abspath(path))} of a checkpoint folder: {advice(kind, path)}"
        )
    if kind.name == "jaxstow-folder":
        return f"is a checkpoint folder, not a file: {advice(kind, path)}"
    if kind.name == "unknown":
        return "is a folder, not a file"
    return f"is {DESCRIBED[kind.name]}, not a file: {advice(kind, path)}"


def read_foreign(
    target: str | os.PathLike[str] | BinaryIO,
    from_format: str,
    *,
    like: Any,
    storage_options: Mapping[str, Any] | None = None,
) -> Any:
    """The tree a file (or folder) of another library holds: numpy arrays and Python values, or for
    ``"equinox"`` the tree of ``like`` with the stream's arrays (``storage_options`` go to fsspec for a URL)."""
    if from_format not in FROM_FORMATS:
        raise ArgumentError(f"from_format must be one of {FROM_FORMATS}, not {excerpt(from_format)}")
    name = display_name(target)
    if from_format == "orbax":
        if not isinstance(target, str | os.PathLike):
            raise ArgumentError("an orbax checkpoint is a folder: give its path, not a file object")
        _check_kind(target, from_format, name)
        return _read_orbax(target, name)
    _check_kind(target, from_format, name)
    if from_format == "equinox":
        if like is None:
            raise ArgumentError(
                f"an equinox stream stores leaves without their structure: pass like=, the model {name} was saved "
                "from (or an abstract copy of it)"
            )
        with _binary(target, storage_options) as file:
            return _read_equinox(file, name, like)
    with _binary(target, storage_options) as file:
        return _read_torch(file, name) if from_format == "torch" else _read_flax(file.read(), name)


def _check_kind(target: str | os.PathLike[str] | BinaryIO, from_format: str, name: str) -> None:
    """Refuse a file or folder that ``from_format`` does not read, saying what it is and the call that reads it."""
    path = local_path(target) if isinstance(target, str | os.PathLike) else None
    if path is not None and not os.path.exists(path):
        raise PathNotFoundError("no such file or folder", file=path)
    if path is not None and os.path.isdir(path) and from_format != "orbax":
        raise IsAFolderError(folder_problem(path), file=path)
    kind = recognise(target)
    expected, takes = _TAKES[from_format]
    a_file = from_format == "orbax" and path is not None and not os.path.isdir(path)
    if kind.name in takes and not a_file:
        return
    what = DESCRIBED.get(kind.name, "a file of no kind jaxstow knows")
    shown = name if isinstance(target, str | os.PathLike) else None
    raise FormatError(
        f"is {what}, not {expected} as from_format={from_format!r} reads: {advice(kind, shown)}", file=name
    )


@contextlib.contextmanager
def _binary(target: str | os.PathLike[str] | BinaryIO, storage_options: Mapping[str, Any] | None) -> Iterator[BinaryIO]:
    """A seekable binary file for a path, a URL or a file object."""
    if not isinstance(target, str | os.PathLike):
        yield target
        return
    path = local_path(target)
    if path is not None:
        with open(path, "rb") as file:
            yield file
        return
    from jaxstow._storage.remote import url_filesystem

    fs, root = url_filesystem(os.fspath(target), storage_options)
    with fs.open(root, "rb") as file:
        yield file


def _read_torch(file: BinaryIO, name: str) -> Any:
    torch = require("torch", extra="torch", purpose=f"reading the PyTorch file {name}")
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises its unpickler's errors for anything but plain tensors
        raise FormatError(
            f"not a PyTorch file of tensors that loads without unpickling objects ({_torch_problem(error)})", file=name
        ) from None
    import jax

    return jax.tree.map(lambda leaf: tensor_to_numpy(leaf) if is_tensor(leaf) else leaf, _plain(state))


def _torch_problem(error: Exception) -> str:
    """What torch.load found wrong, without its advice to unpickle anyway (``weights_only=False`` runs the file's
    code)."""
    text = str(error)
    unsupported = re.search(r"Unsupported global: GLOBAL (\S+)", text)
    if unsupported:
        return f"it holds an object of {unsupported.group(1)}, which torch.load(weights_only=True) never unpickles"
    line = text.strip().splitlines()[0] if text.strip() else ""
    return f"{type(error).__name__}: {line if len(line) <= 200 else line[:197] + '...'}"


def _plain(tree: Any) -> Any:
    """OrderedDicts as dicts, all the way down (torch's state dicts are OrderedDicts)."""
    if isinstance(tree, dict):
        return {key: _plain(value) for key, value in tree.items()}
    if type(tree) in (list, tuple):
        return type(tree)(_plain(value) for value in tree)
    return tree


def _read_flax(data: bytes, name: str) -> Any:
    msgpack = require("msgpack", extra="flax", purpose=f"reading the flax msgpack file {name}")

    def extension(code: int, payload: bytes) -> Any:
        if code in (1, 3):  # an array, a numpy scalar: (shape, dtype name, bytes)
            shape, dtype_name, buffer = msgpack.unpackb(payload, raw=True)
            dtype = dtype_from_name(dtype_name.decode("ascii")) if isinstance(dtype_name, bytes) else None
            if dtype is None or not all(isinstance(size, int) and size >= 0 for size in shape):
                raise FormatError(
                    f"an array of unknown dtype {excerpt(dtype_name)} or shape {excerpt(shape)}", file=name
                )
            array = np.frombuffer(buffer, dtype=dtype).reshape(shape)
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
    return _unchunked(tree)


def _unchunked(tree: Any) -> Any:
    """flax's chunked large arrays (``{"__msgpack_chunked_array__": True, ...}``) joined back."""
    if not isinstance(tree, dict):
        return tree
    if tree.get("__msgpack_chunked_array__") is True:
        shape = tuple(tree["shape"][str(i)] for i in range(len(tree["shape"])))
        return np.concatenate([tree["chunks"][str(i)] for i in range(len(tree["chunks"]))]).reshape(shape)
    return {key: _unchunked(value) for key, value in tree.items()}


def _read_equinox(file: BinaryIO, name: str, like: Any) -> Any:
    eqx = require("equinox", extra="equinox", purpose=f"reading the equinox stream {name}")
    data = io.BytesIO(file.read())
    try:
        tree = eqx.tree_deserialise_leaves(data, like)
    except Exception as error:  # equinox and numpy raise several kinds on a stream that does not fit
        raise FormatError(f"the equinox stream does not fit like ({error})", file=name) from None
    if data.tell() != len(data.getbuffer()):
        raise FormatError(
            f"the equinox stream holds more than like's leaves ({len(data.getbuffer()) - data.tell()} bytes left)",
            file=name,
        )
    return tree


def _read_orbax(target: str | os.PathLike[str], name: str) -> Any:
    path = local_path(target)
    where = os.path.abspath(path) if path is not None else os.fspath(target)
    kind = folder_kind(lambda entry: _listing(where, entry)) if path is not None else KINDS["orbax"]
    if kind.name == "orbax-manager":
        raise FormatError(f"is an orbax manager folder, of several steps: {advice(kind, name)}", file=name)
    if kind.name == "orbax-step":
        return orbax_steps.read_step(where)[0]
    return orbax_steps.read_checkpoint(where)
