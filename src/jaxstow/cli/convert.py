"""``jaxstow convert SRC DST``: the files of other libraries to jaxstow (npz, safetensors, PyTorch, flax msgpack,
orbax), an orbax manager folder to a jaxstow checkpoint folder; and jaxstow to plain safetensors or npz.

A PyTorch file is read with ``torch.load(weights_only=True)``, which never unpickles objects; orbax is read through
orbax, an optional dependency. The destination's format follows its name (``.safetensors`` and ``.npz`` get plain
files, any other name a jaxstow file), unless ``--to`` says otherwise. See docs/command-line.md.

>>> import os, tempfile, numpy as np
>>> from jaxstow.cli import main
>>> folder = tempfile.mkdtemp()
>>> np.savez(os.path.join(folder, "weights.npz"), w=np.ones(3, np.float32))
>>> main(["convert", os.path.join(folder, "weights.npz"), os.path.join(folder, "weights.jxs")])
/.../weights.npz (npz from numpy) -> /.../weights.jxs (jaxstow): 1 leaf, 4.11 kB
0
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable
from typing import Any, BinaryIO

import numpy as np

from jaxstow._format.dtypes import name_of_dtype
from jaxstow._format.keypaths import flatten_with_paths
from jaxstow._format.kinds import KINDS, Kind
from jaxstow._format.native import plain_stores_exactly, write_native
from jaxstow._format.native import stores_exactly as native_stores_exactly
from jaxstow._format.native_or_npz import Kind as ContainerKind
from jaxstow._format.native_or_npz import container_kind, write_container
from jaxstow._format.npz import stores_exactly as npz_stores_exactly
from jaxstow._read import orbax_steps
from jaxstow._read.folder_file import FolderFile
from jaxstow._read.foreign import (
    DESCRIBED,
    advice,
    converted_name,
    folder_problem,
    foreign_member,
    read_foreign,
    recognise,
)
from jaxstow._read.per_process import stored_bytes
from jaxstow._read.reader import Reader
from jaxstow._read.sharded_folder import unmapped
from jaxstow._save_load import save
from jaxstow._storage.opening import local_path
from jaxstow._storage.sinks import atomic_sink
from jaxstow._util.progress import bar, counted, format_bytes
from jaxstow._write.taken_apart import check_unique_paths
from jaxstow.cli.convert_orbax_run import convert_manager
from jaxstow.cli.files import (
    checkpoint_steps,
    describe,
    hf_listing,
    is_folder,
    kind_of_path,
    open_file,
    open_hf_folder,
    open_source_at,
    read_arrays,
    storage,
)
from jaxstow.errors import ArgumentError, FormatError, IsAFolderError, PathError, UnsaveableObjectError, excerpt

__all__ = ["HELP", "arguments", "run", "source_kind"]

_FORMATS = ("jaxstow", "safetensors", "npz")


#: The line of ``jaxstow --help`` that names this command.
HELP = "npz, safetensors, PyTorch, flax msgpack and orbax files and folders to jaxstow; jaxstow to safetensors or npz"


def arguments(parser: argparse.ArgumentParser) -> None:
    """Convert SRC to DST. SRC: a jaxstow, safetensors or npz file, a PyTorch file (read with
    torch.load(weights_only=True), never unpickling other objects), a flax msgpack file, an orbax checkpoint folder or a
    step of an orbax CheckpointManager (needs orbax-checkpoint), or a whole orbax CheckpointManager folder, which
    becomes a jaxstow checkpoint folder DST with the same steps and metrics. DST: a plain safetensors or npz file for a
    name ending in .safetensors or .npz, a jaxstow file for any other name."""
    parser.add_argument("src", metavar="SRC", help="the file or folder to read (a path or an fsspec URL)")
    parser.add_argument("dst", metavar="DST", help="the file (or checkpoint folder) to write (a path or an fsspec URL)")
    parser.add_argument("--to", choices=_FORMATS, help="the format of DST, if not the one its name implies")
    parser.add_argument("--progress", action="store_true", help="show a progress bar of the bytes written")
    parser.add_argument("--overwrite", action="store_true", help="replace DST where it exists (refused otherwise)")


def run(args: argparse.Namespace) -> int:
    target = args.to or _format_of(args.dst)
    with orbax_steps.quiet():
        kind = source_kind(args.src)
        if kind.foreign and kind.name != "orbax-manager" and _same_file(args.src, args.dst):  # the source would go
            raise PathError(
                f"is SRC itself, {DESCRIBED[kind.name]}: the {target} file written there would replace it, and jaxstow "
                f"writes no such file back; give another DST, such as {converted_name(args.src)}",
                file=args.dst,
            )
        if kind.name != "orbax-manager":
            _refuse_writing_into(args.src, args.dst, target, kind)
        if kind.name == "orbax-manager":
            if target != "jaxstow":
                raise PathError(
                    f"is {DESCRIBED[kind.name]}: it converts into a jaxstow checkpoint folder", file=args.src
                )
            steps = convert_manager(args.src, args.dst, progress=args.progress)
            print(
                f"{args.src} ({kind.label}) -> {args.dst} (jaxstow checkpoint folder): {steps} step{'s' * (steps != 1)}"
            )
            return 0
        if not args.overwrite and (found := kind_of_path(args.dst)) is not None:  # a step's file, a day's work
            raise PathError(
                f"exists already ({'a folder' if found == 'folder' else 'a file'}): convert writes a new file; give "
                "another DST, or --overwrite to replace it",
                file=args.dst,
            )
        if kind.name == "orbax-step":
            path = os.path.abspath(local_path(args.src) or args.src)
            tree, metrics = orbax_steps.read_step(path)
            metadata = {"orbax_step": orbax_steps.step_number(os.path.basename(path)), "metrics": metrics}
            count = _write_tree(args.src, args.dst, target, tree, metadata, progress=args.progress)
        elif kind.reader in ("torch", "flax", "orbax"):
            tree = read_foreign(args.src, kind.reader, like=None)
            count = _write_tree(args.src, args.dst, target, tree, None, progress=args.progress)
        elif kind.foreign:  # read only with a template (equinox) or never (pickle)
            raise FormatError(
                f"is {DESCRIBED[kind.name]}, which jaxstow convert cannot read: {advice(kind, args.src)}", file=args.src
            )
        elif is_folder(args.src):
            with open_hf_folder(args.src) as container:
                for left_out in unmapped(container.index, container.tensors, container.containers):
                    print(f"note: {left_out}, and so does this conversion", file=sys.stderr)
                count = _convert_container(container, args.dst, target, progress=args.progress)
            kind = Kind(kind.name, "Hugging Face folder", foreign=False)
        else:
            with open_file(args.src) as container:
                count = _convert_container(container, args.dst, target, progress=args.progress)
    size = _size(args.dst)
    print(f"{args.src} ({kind.label}) -> {args.dst} ({target}): {count} lea{'f' if count == 1 else 'ves'}, {size}")
    return 0


def _refuse_writing_into(src: str, dst: str, target: str, kind: Kind) -> None:
    """Refuse a DST that is SRC itself where the conversion may hold less than SRC (a jaxstow file's values and
    structure in a plain file, a step's item file made a plain one), or that lies inside the folder SRC (the file
    written there would join the folder read). A conversion to jaxstow, or to SRC's own format, holds it all."""
    if _same_file(src, dst) and target not in ("jaxstow", kind.name):
        stem = os.path.splitext(dst.rstrip("/"))[0]
        other = f"{stem}.{_SUFFIXES[target]}"
        other = f"{stem}-{target}.{_SUFFIXES[target]}" if other == dst.rstrip("/") else other
        raise PathError(
            f"is SRC itself, {kind.label}: the {target} file written there would replace the only copy of what it "
            "holds with one that holds less; give "
            f"another DST, such as {other}, and move it over SRC once it is checked",
            file=dst,
        )
    source, written = local_path(src), local_path(dst)
    if source is not None and written is not None:
        source, written = os.path.realpath(source), os.path.realpath(os.path.dirname(os.path.abspath(written)))
        inside = os.path.isdir(source) and os.path.commonpath([source, written]) == source
    else:
        inside = dst.startswith(src.rstrip("/") + "/")
    if inside:
        raise PathError(
            f"is inside SRC, the folder converted: the {target} file written there would join the files it reads "
            "(the folder would then hold its tensors twice); give a DST outside it",
            file=dst,
        )


def _same_file(src: str, dst: str) -> bool:
    """Whether ``dst`` names the file or folder ``src`` (a link to it too)."""
    source, target = local_path(src), local_path(dst)
    if source is None or target is None:
        return src.rstrip("/") == dst.rstrip("/")
    try:
        return os.path.exists(target) and os.path.samefile(source, target)
    except OSError:
        return False


def source_kind(src: str) -> Kind:
    """What ``src`` is: a file of a kind jaxstow reads or converts, an orbax folder; a jaxstow checkpoint folder (or
    one of its steps) raises a :class:`PathError` that points to its item files."""
    if not is_folder(src):
        kind = recognise(src if local_path(src) is not None else open_source_at(src))
        return KINDS["safetensors"] if kind.name == "unknown" else kind  # its header's error says what is wrong
    if local_path(src) is None:  # a folder at a URL: orbax reads it, or says why not
        return KINDS["safetensors"] if hf_listing(src) is not None else KINDS["orbax"]
    kind = recognise(src)
    if kind.name == "jaxstow-step":
        raise PathError("is a step of a jaxstow checkpoint folder: convert one of its item files instead", file=src)
    if kind.name == "jaxstow-folder":
        steps = checkpoint_steps(src)
        example = steps[-1].url(sorted(steps[-1].record.files.values())[0])
        raise PathError(
            f"is a jaxstow checkpoint folder: convert one of its item files instead, such as {example}", file=src
        )
    if kind.name.startswith("orbax"):
        return kind
    if hf_listing(src) is not None:
        return KINDS["safetensors"]  # a Hugging Face folder
    if foreign_member(src) is not None:  # pytorch_model.bin, flax_model.msgpack: the file converts, not the folder
        raise IsAFolderError(folder_problem(src), file=src)
    return KINDS["orbax"]


def _write_tree(src: str, dst: str, target: str, tree: Any, metadata: dict[str, Any] | None, *, progress: bool) -> int:
    """Write the tree read from ``src``; two of its leaves at one path, which no file keeps apart, name ``src``."""
    tensors, values = _tree_tensors(tree, src)
    if target == "jaxstow":
        try:
            _save(dst, tree, metadata=metadata, progress=progress)
        except UnsaveableObjectError as error:  # said of DST: SRC holds it
            raise FormatError(
                f"holds {excerpt(error.obj)}, which a jaxstow file cannot hold: convert a file of tensors, numbers "
                "and strings",
                file=src,
                path=error.path,
            ) from None
        return len(tensors) + len(values)
    return _write_plain(dst, target, tensors, values, metadata, progress=progress)


#: The file name suffix of each format convert writes.
_SUFFIXES = {"jaxstow": "jxs", "safetensors": "safetensors", "npz": "npz"}


def _format_of(dst: str) -> str:
    name = dst.lower()
    return "safetensors" if name.endswith(".safetensors") else "npz" if name.endswith(".npz") else "jaxstow"


def _convert_container(container: Reader, dst: str, target: str, *, progress: bool) -> int:
    leaves = describe(container)
    manifest = container.container.manifest
    # The user's metadata goes along: a jaxstow file's (JSON), a plain safetensors file's strings, or the index's.
    metadata = manifest.get("metadata") if manifest is not None else _plain_metadata(container)
    if target == "jaxstow" and any(leaf.kind == "sharded" for leaf in leaves):  # shards become whole arrays
        tree = container.load(as_numpy=True)
        _save(dst, tree, metadata=metadata or None, progress=progress)
        return len(leaves)
    stored = [leaf for leaf in leaves if leaf.stored]
    arrays = read_arrays(container, stored)
    tensors = [(leaf.path, arrays[leaf.path]) for leaf in stored]
    if target != "jaxstow":
        values = [leaf.path for leaf in leaves if not leaf.stored]
        if keys := [repr(leaf.path) for leaf in stored if leaf.kind == "key"]:
            print(
                f"note: {len(keys)} PRNG keys ({', '.join(keys[:5])}) are kept as their raw data, plain integers in a "
                f"{target} file: jax.random.wrap_key_data rebuilds each; convert to .jxs to keep them keys",
                file=sys.stderr,
            )
        return _write_plain(dst, target, tensors, values, metadata or None, progress=progress)
    if manifest is None:
        _save(dst, dict(tensors), metadata=metadata or None, progress=progress)
        return len(tensors)
    tensors += _per_process_tensors(container)
    container_kind: ContainerKind = "npz" if dst.lower().endswith(".npz") else "native"
    # The same bytes: the manifest, checksums included, still holds, told the dtypes the new container keeps raw.
    manifest = _raw_described(manifest, container_kind, tensors)
    _write_raw(dst, lambda sink: write_container(sink, container_kind, tensors, manifest), tensors, progress=progress)
    return len(leaves)


def _plain_metadata(container: Reader) -> dict[str, Any] | None:
    """The metadata of a file without a manifest: a plain safetensors file's; of a Hugging Face folder, its index's,
    never a shard's ``{"format": "pt"}``: what a jaxstow export keeps there as it was saved (``jaxstow_metadata``, and
    the step's as ``step_metadata``), and the index's other entries but ``total_size``, which the file does not keep."""
    if not isinstance(container, FolderFile):
        return getattr(container.container, "plain", None)
    index = container.metadata if container.index is not None and container.metadata else {}
    saved = index.get("jaxstow_metadata")
    kept = dict(saved) if isinstance(saved, dict) else {}
    kept.update({key: value for key, value in index.items() if key != "total_size" and not key.startswith("jaxstow")})
    if "jaxstow_step_metadata" in index:
        kept.setdefault("step_metadata", index["jaxstow_step_metadata"])
    return kept or None


def _per_process_tensors(container: Reader) -> list[tuple[str, np.ndarray]]:
    """The tensors of the file's per-process leaves (each a file of its own, named by the leaf's path), checked."""
    tensors = []
    for path, values in container.per_process.items():
        if any(source != 0 for source, _ in values.values()):
            raise ArgumentError(
                f"{container.file}: leaf {path!r} holds values of processes kept in other files of a checkpoint step; "
                "convert a file that holds its tree alone",
                file=container.file,
            )
        tensors += [(path, stored_bytes(container, path, process)) for process in values]
    return tensors


def _raw_described(
    manifest: dict[str, Any], kind: ContainerKind, tensors: list[tuple[str, np.ndarray]]
) -> dict[str, Any]:
    """``manifest`` with the true dtype and shape of every leaf that ``kind`` stores as raw bytes (its tensor, ``U8``
    or ``uint8``, no longer tells them), as a save to ``kind`` writes them."""
    stores_exactly = npz_stores_exactly if kind == "npz" else native_stores_exactly
    raw = {name: array for name, array in tensors if not stores_exactly(array.dtype)}
    if not raw:
        return manifest
    layouts = {name: {"dtype": name_of_dtype(array.dtype), "shape": list(array.shape)} for name, array in raw.items()}
    if isinstance(manifest.get("paths"), list):  # version 3 on: details by leaf index
        details = {key: dict(detail) for key, detail in manifest.get("details", {}).items()}
        for index, path in enumerate(manifest["paths"]):
            if path in layouts:
                details.setdefault(str(index), {}).update(layouts[path])
        return {**manifest, "details": details}
    leaves = [
        {**entry, **layouts[entry["path"]]}
        if entry.get("path") in layouts and entry.get("kind") != "sharded"
        else entry
        for entry in manifest["leaves"]
    ]
    return {**manifest, "leaves": leaves}


def _tree_tensors(tree: Any, src: str) -> tuple[list[tuple[str, np.ndarray]], list[str]]:
    """The arrays of the tree read from ``src`` under their leaf paths, and the paths of the leaves that are not
    arrays; a :class:`FormatError` naming ``src`` if two leaves have one path."""
    paths, leaves, _ = flatten_with_paths(tree)
    check_unique_paths(paths, file=src)
    tensors, values = [], []
    for path, leaf in zip(paths, leaves, strict=True):
        if isinstance(leaf, np.ndarray | np.generic):
            tensors.append((path, np.asarray(leaf, order="C")))
        else:
            values.append(path)
    return tensors, values


def _write_plain(
    dst: str,
    target: str,
    tensors: list[tuple[str, np.ndarray]],
    values: list[str],
    metadata: dict[str, Any] | None,
    *,
    progress: bool,
) -> int:
    """Write the arrays as a plain safetensors or npz file; leaves that such a file cannot hold are named, and so
    is metadata it cannot hold (safetensors holds string values, npz none)."""
    if values:
        shown = ", ".join(repr(path) for path in values[:5]) + (", ..." if len(values) > 5 else "")
        print(
            f"note: {len(values)} leaves that are not arrays ({shown}) have no place in a {target} file",
            file=sys.stderr,
        )
    kind: ContainerKind = "npz" if target == "npz" else "native"
    stores_exactly = npz_stores_exactly if kind == "npz" else plain_stores_exactly
    plain = metadata if kind == "native" and metadata and all(type(v) is str for v in metadata.values()) else None
    if metadata and plain is None:
        print(
            f"note: the metadata ({', '.join(map(repr, metadata))}) has no place in a plain {target} file",
            file=sys.stderr,
        )
    if all(stores_exactly(array.dtype) for _, array in tensors):
        write = functools.partial(write_native, tensors=tensors, manifest=None, plain=plain)
        if kind == "npz":
            write = functools.partial(write_container, kind=kind, tensors=tensors, manifest=None)
        _write_raw(dst, lambda sink: write(sink), tensors, progress=progress)
    elif container_kind(dst) == kind:  # the rule of save: raw bytes, their true dtypes in a jaxstow manifest
        as_bytes = [f"{path!r} ({array.dtype})" for path, array in tensors if not stores_exactly(array.dtype)]
        shown = ", ".join(as_bytes[:5]) + (", ..." if len(as_bytes) > 5 else "")
        print(
            f"note: {len(as_bytes)} leaves of a dtype the {target} format has no code for here ({shown}) are kept as raw "
            "bytes (uint8), their true dtypes in a jaxstow manifest: other tools read bytes, jaxstow the arrays",
            file=sys.stderr,
        )
        _save(dst, dict(tensors), metadata=metadata, progress=progress)
    else:
        raw = next(path for path, array in tensors if not stores_exactly(array.dtype))
        raise ArgumentError(
            f"{dst}: leaf {raw!r} is kept as raw bytes with its dtype in a jaxstow manifest, which a {target} file gets "
            f"only under a name ending in {'.npz' if kind == 'npz' else 'another suffix than .npz'}",
            file=dst,
        )
    return len(tensors)


def _save(dst: str, tree: Any, *, metadata: dict[str, Any] | None = None, progress: bool) -> None:
    """``jaxstow.save`` to ``dst``, a path or a URL reached as the command's storage options say."""
    settings = storage(dst)
    save(dst, tree, metadata=metadata, progress=progress, storage_options=settings.options, transfer=settings.transfer)


def _write_raw(
    dst: str, write: Callable[[BinaryIO], object], tensors: list[tuple[str, np.ndarray]], *, progress: bool
) -> None:
    """Write ``dst`` (a path or a URL) all or nothing with ``write(sink)``."""
    total = sum(array.nbytes for _, array in tensors)
    with bar(total, f"writing {dst}", enabled=progress) as written, atomic_sink(dst, storage(dst)) as sink:
        write(counted(sink, written))


def _size(dst: str) -> str:
    source = open_source_at(dst)
    try:
        return format_bytes(source.size)
    finally:
        source.close()
