"""``jaxstow convert SRC DST``: npz, safetensors, PyTorch state dicts and orbax checkpoints to jaxstow; and back.

Sources: a jaxstow, safetensors or npz file; a PyTorch file written by ``torch.save`` (read with
``torch.load(weights_only=True)``, which refuses to unpickle anything but tensors and plain containers); an orbax
checkpoint folder (read through orbax, an optional dependency). The destination's format follows its name:
``.safetensors`` and ``.npz`` get plain files that other tools read (the arrays under their leaf paths), any other
name a jaxstow file; ``--to`` chooses otherwise (``--to jaxstow`` for a jaxstow npz).

>>> import os, tempfile, numpy as np
>>> from jaxstow.cli import main
>>> folder = tempfile.mkdtemp()
>>> np.savez(os.path.join(folder, "weights.npz"), w=np.ones(3, np.float32))
>>> main(["convert", os.path.join(folder, "weights.npz"), os.path.join(folder, "weights.jxs")])
/.../weights.npz (npz) -> /.../weights.jxs (jaxstow): 1 leaf, 4.11 kB
0
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO

import numpy as np

from jaxstow._format.container import Kind, write_container
from jaxstow._format.dtypes import safetensors_code
from jaxstow._format.keypaths import flatten_with_paths
from jaxstow._format.torch_leaves import is_tensor, tensor_to_numpy
from jaxstow._read.reader import Reader
from jaxstow._save_load import save
from jaxstow._steps.record import RECORD_NAME
from jaxstow._storage.atomic import atomic_write
from jaxstow._storage.paths import local_path
from jaxstow._util.optional import require
from jaxstow._util.progress import bar, counted, format_bytes
from jaxstow.cli.files import checkpoint_steps, describe, is_folder, open_file, open_source_at, read_arrays
from jaxstow.errors import FormatError, PathError

__all__ = ["add", "run", "source_kind"]

_TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
_FORMATS = ("jaxstow", "safetensors", "npz")
_NUMPY_CODES = "?bhilqBHILQefdFD"


def add(commands: Any) -> None:
    parser = commands.add_parser(
        "convert",
        help="npz, safetensors, PyTorch state dicts and orbax checkpoints to jaxstow; jaxstow to safetensors or npz",
        description="Convert SRC to DST. SRC: a jaxstow, safetensors or npz file, a PyTorch file (read with "
        "torch.load(weights_only=True), never unpickling other objects) or an orbax checkpoint folder (needs "
        "orbax-checkpoint). DST: a plain safetensors or npz file for a name ending in .safetensors or .npz, a "
        "jaxstow file for any other name.",
    )
    parser.add_argument("src", metavar="SRC", help="the file or folder to read (a path or an fsspec URL)")
    parser.add_argument("dst", metavar="DST", help="the file to write (a path or an fsspec URL)")
    parser.add_argument("--to", choices=_FORMATS, help="the format of DST, if not the one its name implies")
    parser.add_argument("--progress", action="store_true", help="show a progress bar of the bytes written")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    target = args.to or _format_of(args.dst)
    kind = source_kind(args.src)
    if kind in ("pytorch", "orbax"):
        tree = _read_torch(args.src) if kind == "pytorch" else _read_orbax(args.src)
        tensors, values = _tree_tensors(tree)
        if target == "jaxstow":
            _write(args.dst, lambda path: save(path, tree, progress=args.progress))
            count = len(tensors) + len(values)
        else:
            count = _write_plain(args.dst, target, tensors, values, progress=args.progress)
    else:
        with open_file(args.src) as container:
            count = _convert_container(container, args.dst, target, progress=args.progress)
            kind = "jaxstow" if container.container.manifest is not None else kind
    size = _size(args.dst)
    print(f"{args.src} ({kind}) -> {args.dst} ({target}): {count} lea{'f' if count == 1 else 'ves'}, {size}")
    return 0


def _format_of(dst: str) -> str:
    name = dst.lower()
    return "safetensors" if name.endswith(".safetensors") else "npz" if name.endswith(".npz") else "jaxstow"


def source_kind(src: str) -> str:
    """What ``src`` holds: ``"orbax"`` (a folder), ``"pytorch"``, ``"npz"`` or ``"safetensors"`` (jaxstow included)."""
    if is_folder(src):
        return "orbax"
    source = open_source_at(src)
    try:
        head = source.read(0, min(source.size, 4))
    finally:
        source.close()
    if src.lower().endswith(_TORCH_SUFFIXES) or head[:1] == b"\x80" or (head == b"PK\x03\x04" and _is_torch_zip(src)):
        return "pytorch"
    return "npz" if head.startswith(b"PK") else "safetensors"


def _is_torch_zip(src: str) -> bool:
    """Whether a zip archive is a ``torch.save`` file (it holds ``<name>/data.pkl``) rather than an npz."""
    with _local_copy(src) as path, zipfile.ZipFile(path) as archive:
        return any(name.endswith("/data.pkl") for name in archive.namelist())


def _read_torch(src: str) -> Any:
    torch = require("torch", extra="torch", purpose=f"reading the PyTorch file {src}")
    with _local_copy(src) as path:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # torch raises its unpickler's errors for anything but plain tensors
            raise FormatError(
                f"not a PyTorch file of tensors that loads without unpickling objects ({error})", file=src
            ) from None
    return _to_numpy(dict(state) if isinstance(state, dict) else state)


def _to_numpy(tree: Any) -> Any:
    import jax

    return jax.tree.map(lambda leaf: tensor_to_numpy(leaf) if is_tensor(leaf) else leaf, tree)


def _read_orbax(src: str) -> Any:
    path = local_path(src)
    if path is not None and os.path.exists(os.path.join(path, RECORD_NAME)):
        raise PathError("is a step of a jaxstow checkpoint folder: convert one of its item files instead", file=src)
    steps = checkpoint_steps(src)
    if steps:
        example = steps[-1].url(sorted(steps[-1].record.files.values())[0])
        raise PathError(
            f"is a jaxstow checkpoint folder: convert one of its item files instead, such as {example}", file=src
        )
    ocp = require("orbax.checkpoint", extra="orbax", purpose=f"reading the orbax checkpoint {src}")
    try:
        tree = ocp.PyTreeCheckpointer().restore(os.path.abspath(path) if path is not None else src)
    except (FileNotFoundError, ValueError) as error:
        raise FormatError(f"not an orbax checkpoint folder that orbax can restore ({error})", file=src) from None
    import jax

    return jax.tree.map(np.asarray, tree)


def _convert_container(container: Reader, dst: str, target: str, *, progress: bool) -> int:
    leaves = describe(container)
    if target == "jaxstow" and any(leaf.kind == "sharded" for leaf in leaves):  # shards become whole arrays
        tree = container.load(as_numpy=True)
        _write(dst, lambda path: save(path, tree, progress=progress))
        return len(leaves)
    stored = [leaf for leaf in leaves if leaf.stored]
    arrays = read_arrays(container, stored)
    tensors = [(leaf.path, arrays[leaf.path]) for leaf in stored]
    if target != "jaxstow":
        values = [leaf.path for leaf in leaves if not leaf.stored]
        return _write_plain(dst, target, tensors, values, progress=progress)
    if container.container.manifest is None:
        _write(dst, lambda path: save(path, dict(tensors), progress=progress))
        return len(tensors)
    manifest = container.container.manifest  # the same bytes: the manifest, checksums included, still holds
    container_kind: Kind = "npz" if dst.lower().endswith(".npz") else "native"
    _write_raw(dst, lambda sink: write_container(sink, container_kind, tensors, manifest), tensors, progress=progress)
    return len(leaves)


def _tree_tensors(tree: Any) -> tuple[list[tuple[str, np.ndarray]], list[str]]:
    """The arrays of a tree under their leaf paths, and the paths of the leaves that are not arrays."""
    paths, leaves, _ = flatten_with_paths(tree)
    tensors, values = [], []
    for path, leaf in zip(paths, leaves, strict=True):
        if isinstance(leaf, np.ndarray | np.generic):
            tensors.append((path, np.ascontiguousarray(leaf)))
        else:
            values.append(path)
    return tensors, values


def _write_plain(
    dst: str, target: str, tensors: list[tuple[str, np.ndarray]], values: list[str], *, progress: bool
) -> int:
    """Write the arrays as a plain safetensors or npz file; leaves that such a file cannot hold are named."""
    for path, array in tensors:
        fits = (
            safetensors_code(array.dtype) is not None if target == "safetensors" else array.dtype.char in _NUMPY_CODES
        )
        if not fits:
            raise FormatError(
                f"{array.dtype} has no {target} dtype; convert to a jaxstow file to keep it", file=dst, path=path
            )
    if values:
        shown = ", ".join(repr(path) for path in values[:5]) + (", ..." if len(values) > 5 else "")
        print(
            f"note: {len(values)} leaves that are not arrays ({shown}) have no place in a {target} file",
            file=sys.stderr,
        )
    kind: Kind = "npz" if target == "npz" else "native"
    _write_raw(dst, lambda sink: write_container(sink, kind, tensors, None), tensors, progress=progress)
    return len(tensors)


def _write_raw(
    dst: str, write: Callable[[BinaryIO], object], tensors: list[tuple[str, np.ndarray]], *, progress: bool
) -> None:
    total = sum(array.nbytes for _, array in tensors)

    def to_path(path: str) -> None:
        with bar(total, f"writing {dst}", enabled=progress) as written, atomic_write(path) as sink:
            write(counted(sink, written))

    _write(dst, to_path)


def _write(dst: str, write: Callable[[str], None]) -> None:
    """Write ``dst`` with ``write(path)``: in place for a local path, uploaded from a temporary file for a URL."""
    path = local_path(dst)
    if path is not None:
        write(path)
        return
    from jaxstow._storage.remote import url_filesystem

    fs, root = url_filesystem(dst)
    with tempfile.TemporaryDirectory() as folder:
        staged = os.path.join(folder, os.path.basename(root))
        write(staged)
        fs.put_file(staged, root)


@contextmanager
def _local_copy(src: str) -> Iterator[str]:
    """A local path holding ``src``: itself, or a downloaded copy of a URL."""
    path = local_path(src)
    if path is not None:
        yield path
        return
    from jaxstow._storage.remote import url_filesystem

    fs, root = url_filesystem(src)
    with tempfile.TemporaryDirectory() as folder:
        copy = os.path.join(folder, os.path.basename(root))
        fs.get_file(root, copy)
        yield copy


def _size(dst: str) -> str:
    source = open_source_at(dst)
    try:
        return format_bytes(source.size)
    finally:
        source.close()
