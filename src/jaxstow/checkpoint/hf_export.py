"""A checkpoint step, or one file, written as a Hugging Face sharded safetensors folder.

A step saved by several processes keeps a sharded array as per-process shards in its part files; the export reads
each array whole from them (:func:`jaxstow._read.reader.open_parts`) and writes plain tensors: shards of at most
``max_shard_size`` bytes named ``model-00001-of-0000N.safetensors``, each with ``{"format": "pt"}`` in its
``__metadata__``, and ``model.safetensors.index.json`` with the ``weight_map`` and ``metadata.total_size``. Only one
shard's tensors are in memory at a time. No ``config.json`` is written: a model's configuration is not in a checkpoint.

>>> import os, tempfile, jax.numpy as jnp, jaxstow
>>> folder = tempfile.mkdtemp()
>>> jaxstow.save(os.path.join(folder, "w.jxs"), {"dense": {"kernel": jnp.ones((2, 3))}, "depth": 2})
>>> jaxstow.export_safetensors(os.path.join(folder, "w.jxs"), os.path.join(folder, "hf"))
Exported(files=['model-00001-of-00001.safetensors'], tensors=1, total_size=24, left_out=['depth'])
>>> jaxstow.load(os.path.join(folder, "hf"), as_numpy=True)["dense.kernel"].shape
(2, 3)
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator, Mapping
from typing import Any, BinaryIO, NamedTuple

import numpy as np

from jaxstow._format.dtypes import plain_code
from jaxstow._format.native import write_native
from jaxstow._format.shards import Stored
from jaxstow._read.reader import Reader, open_parts, open_reader_at, read_again
from jaxstow._read.sharded_folder import child, list_folder, listed_kind
from jaxstow._steps.names import StepNames
from jaxstow._steps.record import RECORD_NAME, StepRecord
from jaxstow._storage.atomic import fsync_directory, remove_dead_leftovers, rename_durably, temporary_sibling
from jaxstow._storage.failures import storage_failures
from jaxstow._storage.opening import local_path, locate
from jaxstow._storage.settings import StorageSettings, storage_settings
from jaxstow._storage.sinks import atomic_sink
from jaxstow._storage.store import open_store
from jaxstow._storage.transfer import Transfer
from jaxstow._util.progress import Bar, bar, counted
from jaxstow.checkpoint.hf_export_layouts import ExportTransposed, turned_leaves
from jaxstow.checkpoint.step_folder import StepFolder
from jaxstow.errors import ArgumentError, CheckpointError, IsAFolderError, PathError, excerpt

__all__ = ["Exported", "export_safetensors", "parse_size"]

INDEX_NAME = "model.safetensors.index.json"
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20}
_UNITS |= {"GIB": 2**30, "TIB": 2**40}


class Exported(NamedTuple):
    """What an export wrote: its shard files, the number of tensors and their bytes, and the leaves left out."""

    files: list[str]
    tensors: int
    total_size: int
    left_out: list[str]


class _Tensor(NamedTuple):
    reader: Reader
    leaf: Stored
    name: str
    turned: bool  # written turned over (transposed=)


def parse_size(size: int | str) -> int:
    """Bytes from a size as Hugging Face writes them: ``"5GB"`` is 5 * 10**9, ``"2GiB"`` 2 * 2**30, an int as it is.

    >>> from jaxstow.checkpoint.hf_export import parse_size
    >>> parse_size("5GB"), parse_size("500MB"), parse_size("1GiB"), parse_size(1000)
    (5000000000, 500000000, 1073741824, 1000)
    """
    if isinstance(size, int) and not isinstance(size, bool):
        found: int | None = size
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*", str(size).upper())
        found = int(float(match[1]) * _UNITS[match[2]]) if match and match[2] in _UNITS else None
    if found is None or found <= 0:
        raise ArgumentError(f"max_shard_size {size!r} is no size: give bytes, or a number with KB, MB, GB, MiB, GiB")
    return found


def export_safetensors(
    source: str | os.PathLike[str],
    out_folder: str | os.PathLike[str],
    *,
    max_shard_size: int | str = "5GB",
    item: str | None = None,
    names: Callable[[str], str | None] | Mapping[str, str] | None = None,
    transposed: ExportTransposed | None = None,
    storage_options: Mapping[str, Any] | None = None,
    transfer: Transfer | None = None,
    progress: bool = False,
) -> Exported:
    """Write a checkpoint step (of any number of processes) or one file as a Hugging Face sharded safetensors folder.

    Arrays are written whole under their dotted path (``params/dense/kernel`` of item ``params``:
    ``params.dense.kernel``, without the item's name for a step of one tree or one ``item``); plain values and PRNG
    keys are left out, saved metadata goes to the index's ``metadata``. See docs/other-formats.md.

    Args:
        source: a step's folder (``run/5``), a jaxstow, safetensors or npz file, or a sharded safetensors folder.
        out_folder: the folder to write (a path or an fsspec URL); it must not exist, or be empty.
        max_shard_size: the most bytes of tensors per file (``"5GB"`` = 5 * 10**9, ``"2GiB"``, or an int).
        item: of a step, export this item only.
        names: a tensor's name from its path (``item/a/b``; ``a/b`` with ``item=``), ``None``: left out; or a dict.
        transposed: the 2-d leaves (paths, or a predicate on a path) written turned over; ``()``: all as saved.
        storage_options, transfer: fsspec's options, and a :class:`~jaxstow.Transfer`, for URLs.
        progress: draw a progress bar of the bytes written on stderr (needs ``tqdm``).

    Returns:
        The files written, the number of tensors, their bytes and the leaves left out.

    Raises:
        ArgumentError: an unknown item, two tensors of one name, a dtype safetensors lacks; ``names=`` across
            layouts (``kernel`` as ``weight``) of square leaves that ``transposed=`` does not decide.
        PathError: ``out_folder`` holds files already.
        CheckpointError: the step's folder is not named by the step its record names, or an item file is missing.
        CorruptFileError: the step's record, or an item file's header, does not check (another file than its own).
    """
    limit = parse_size(max_shard_size)
    settings = storage_settings(storage_options, transfer, None)
    for role, path in (("the step or file to export", source), ("the folder to write", out_folder)):
        if not isinstance(path, str | os.PathLike):
            raise ArgumentError(f"export_safetensors takes {role} as a path or URL, not {excerpt(path)}")
    out, source = os.fspath(out_folder), os.fspath(source)
    with contextlib.ExitStack() as stack:
        items, step_metadata = _open_items(stack, source, item, _for(source, settings))
        tensors, left_out = _tensors(source, items, names, transposed)
        if not tensors:
            shown = (
                f": it holds {', '.join(map(repr, left_out[:5]))}, which a safetensors file cannot" if left_out else ""
            )
            raise ArgumentError(f"{source}: there is no array to export{shown}")
        shards = _plan(tensors, limit)
        files = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
        weight_map = {tensor.name: file for file, shard in zip(files, shards, strict=True) for tensor in shard}
        total = sum(tensor.leaf.nbytes for tensor in tensors)
        kept = {**_kept(items), **({"jaxstow_step_metadata": step_metadata} if step_metadata else {})}
        index = {"metadata": {"total_size": total, **kept}, "weight_map": dict(sorted(weight_map.items()))}
        with bar(total, f"exporting {out}", enabled=progress) as written, _staged(out, _for(out, settings)) as write:
            for file, shard in zip(files, shards, strict=True):
                write(file, functools.partial(_write_shard, shard, written))
            write(INDEX_NAME, lambda sink: sink.write(json.dumps(index, indent=2).encode() + b"\n"))
    return Exported(files, len(tensors), total, left_out)


def _kept(items: list[tuple[str | None, Reader]]) -> dict[str, Any]:
    """The metadata saved with the items, for the index's ``metadata`` (which the transformers library passes over):
    under ``jaxstow_metadata``, by item name where the step has several; nothing where none has any."""
    saved = {name or "": reader.metadata for name, reader in items if reader.metadata}
    if not saved:
        return {}
    return {"jaxstow_metadata": saved if len(items) > 1 else next(iter(saved.values()))}


def _for(target: str, settings: StorageSettings) -> StorageSettings:
    """The storage settings for ``target``: none for a local path (one export may read a file and write a URL)."""
    return settings if local_path(target) is None else StorageSettings()


def _open_items(
    stack: contextlib.ExitStack, source: str, item: str | None, settings: StorageSettings
) -> tuple[list[tuple[str | None, Reader]], dict[str, Any] | None]:
    """The readers of the step's items, or of the one file, each with the name its tensors' names start with (the
    item's, where the step has several or the item is one array); and the metadata saved with the step."""
    location = locate(source)
    listed = list_folder(location, settings)
    if listed is None or RECORD_NAME not in listed[0]:
        if item is not None:
            raise ArgumentError(f"item= chooses an item of a checkpoint step, and {source} is none")
        names = listed[0] if listed is not None else []
        steps = sorted(int(name) for name in names if name.isdigit())
        # a checkpoint folder, here or at a URL: its own error ("restore it with CheckpointManager") would mislead
        if steps and listed_kind(location, names, settings).name == "jaxstow-folder":
            newest = f"{source.rstrip('/')}/{steps[-1]}"
            raise IsAFolderError(f"is a checkpoint folder: export one of its steps, such as {newest}", file=source)
        return [(None, stack.enter_context(open_reader_at(location, settings)))], None
    folder, record = _step(source, settings)
    if item is not None and item not in record.files:
        raise ArgumentError(f"step {record.step} has no item {item!r} (its items: {', '.join(sorted(record.files))})")
    chosen = [item] if item is not None else sorted(record.files)
    prefixed = item is None and len(chosen) > 1  # names stay apart: the items of a step with several
    readers = [(name, stack.enter_context(open_parts(folder.open_item(record, name)))) for name in chosen]
    one_array = not record.single and all(
        reader.leaf_order == ("",) for _, reader in readers
    )  # a named item of one array
    named = [(name if prefixed or one_array else None, reader) for name, reader in readers]
    return named, record.metadata


def _step(source: str, settings: StorageSettings) -> tuple[StepFolder, StepRecord]:
    """The checkpoint folder of the step at ``source`` and the step's record, read as the manager's restore reads
    them: the record checksummed and naming the step its folder's name says (each item file is checked against the
    header the record names as it is opened)."""
    path = local_path(source)
    if path is not None:
        parent, name = os.path.split(os.path.abspath(path))
    else:
        parent, _, name = source.rstrip("/").rpartition("/")
    names = StepNames("%d")
    step = names.step(name)
    if step is None:
        raise CheckpointError(
            f"holds a {RECORD_NAME}, but {name!r} is no step's folder: a checkpoint folder names each step's folder by "
            "its number, which its record must name too",
            file=source,
        )
    folder = StepFolder(open_store(parent, marker=RECORD_NAME, settings=settings), names)
    return folder, folder.read_record(step, check_files=False)


def _tensors(
    source: str,
    items: list[tuple[str | None, Reader]],
    names: Callable[[str], str | None] | Mapping[str, str] | None,
    transposed: ExportTransposed | None,
) -> tuple[list[_Tensor], list[str]]:
    """Every array to export, named and marked if written turned over; and the paths of the leaves left out (plain
    values, PRNG keys)."""
    name_of = _naming(names)
    tensors: list[_Tensor] = []
    left_out: list[str] = []
    seen: dict[str, str] = {}  # path by tensor name
    shapes: dict[str, tuple[int, ...]] = {}  # of every array, exported or not, by path
    for prefix, reader in items:
        for path in reader.paths:
            full = f"{prefix}/{path}" if prefix and path else prefix or path  # an item of one array: its name
            leaf = reader.stored.get(path)
            if leaf is None or leaf.kind == "key":
                left_out.append(full)
                continue
            shapes[full] = leaf.shape
            name = name_of(full)
            if name is not None and not isinstance(name, str):
                raise ArgumentError(
                    f"names= gives {full!r} the name {excerpt(name)}: a string, or None to leave it out"
                )
            if name is None:
                left_out.append(full)
                continue
            if not name and full:
                raise ArgumentError(
                    f"names= gives the leaf {full!r} the empty name, which no tensor may have: give it a name, or None "
                    "to leave it out"
                )
            if not name:
                raise ArgumentError(
                    f"{reader.file} holds one array, which has no name to export it by: pass names={{'': 'weight'}}"
                )
            if name in seen:
                raise ArgumentError(f"{seen[name]!r} and {full!r} would both be the tensor {name!r}: pass names=")
            if plain_code(leaf.dtype) is None:
                packed = leaf.dtype.name.startswith(("float4", "float6"))
                why = "packs several elements of it to a byte" if packed else "has no code for it"
                raise ArgumentError(
                    f"{reader.file}: leaf {full!r} is {leaf.dtype}, which a plain safetensors file cannot hold as it "
                    f"is (safetensors {why}): save it converted (.astype(...)) before exporting, or leave it out "
                    "with names=",
                    file=reader.file,
                    path=full,
                )
            seen[name] = full
            tensors.append(_Tensor(reader, leaf, name, turned=False))
    if isinstance(names, Mapping) and (unknown := sorted(set(names) - {*seen.values(), *left_out})):
        raise ArgumentError(f"names= maps paths the source lacks: {unknown[:5]}")
    turned = turned_leaves(source, {full: name for name, full in seen.items()}, shapes, transposed)
    return [tensor._replace(turned=seen[tensor.name] in turned) for tensor in tensors], left_out


def _naming(names: Callable[[str], str | None] | Mapping[str, str] | None) -> Callable[[str], Any]:
    """``names=`` as a function of a path: dotted paths by default."""
    if names is None:
        return lambda path: path.replace("/", ".")
    if isinstance(names, Mapping):
        return names.get
    if not callable(names):
        raise ArgumentError(f"names= takes a function of a leaf's path or a mapping from paths, not {excerpt(names)}")
    return names


def _plan(tensors: list[_Tensor], limit: int) -> list[list[_Tensor]]:
    """The tensors in files of at most ``limit`` bytes each, in order (a larger tensor alone in its file)."""
    shards: list[list[_Tensor]] = [[]]
    size = 0
    for tensor in tensors:
        if shards[-1] and size + tensor.leaf.nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append(tensor)
        size += tensor.leaf.nbytes
    return shards


def _write_shard(shard: list[_Tensor], written: Bar, sink: BinaryIO) -> None:
    write_native(counted(sink, written), _read(shard), None, plain={"format": "pt"})


def _read(shard: list[_Tensor]) -> list[tuple[str, np.ndarray]]:
    """One file's tensors, read whole (sharded arrays joined), reader by reader."""
    wanted: dict[int, tuple[Reader, list[Stored]]] = {}
    for tensor in shard:
        wanted.setdefault(id(tensor.reader), (tensor.reader, []))[1].append(tensor.leaf)
    arrays = {
        key: read_again(reader, functools.partial(reader.read_arrays, leaves))
        for key, (reader, leaves) in wanted.items()
    }
    read = [(t, arrays[id(t.reader)][t.leaf.path]) for t in shard]
    return [(t.name, np.require(array.T if t.turned else array, requirements="C")) for t, array in read]


@contextlib.contextmanager
def _staged(out: str, settings: StorageSettings) -> Iterator[Callable[[str, Callable[[Any], Any]], None]]:
    """A ``write(name, fill)`` of the folder's files that shows them all at the end, or none after an error.

    A local folder is written under a temporary name and renamed into place; at a URL, each file is uploaded whole and
    the index last, and the files already there are removed after an error.
    """
    path = local_path(out)
    if path is None:
        with _remote_staged(out, settings) as write:
            yield write
        return
    if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
        raise PathError("exists already: the export writes a new folder (or into an empty one)", file=out)
    remove_dead_leftovers(os.path.dirname(os.path.abspath(path)), staged=os.path.basename(os.path.abspath(path)))
    staging = temporary_sibling(path)  # (an export killed before left its own: removed above)
    with storage_failures(path, doing="make the folder"):
        os.makedirs(staging)
    try:

        def write(name: str, fill: Callable[[Any], Any]) -> None:
            with storage_failures(os.path.join(path, name)), open(os.path.join(staging, name), "wb") as sink:
                fill(sink)
                sink.flush()
                os.fsync(sink.fileno())

        yield write
        with storage_failures(path):
            fsync_directory(staging)
            if os.path.isdir(path):
                os.rmdir(path)
            rename_durably(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


@contextlib.contextmanager
def _remote_staged(out: str, settings: StorageSettings) -> Iterator[Callable[[str, Callable[[Any], Any]], None]]:
    from jaxstow._storage.remote import forget_listings, storage_errors, url_filesystem

    fs, root = url_filesystem(out, settings.options)
    with storage_errors(out):
        forget_listings(fs, root)
        if fs.isfile(root):
            raise PathError("is a file (an object of the store), not a folder: export to another name", file=out)
        held = fs.ls(root, detail=False) if fs.exists(root) else []
    if held:
        cut_short = not any(str(name).endswith(".index.json") for name in held)
        raise PathError(
            "exists already: the export writes a new folder (or into an empty one)"
            + ("; it holds files and no index, as an export cut short leaves it: remove them" if cut_short else ""),
            file=out,
        )
    written: list[str] = []

    def write(name: str, fill: Callable[[Any], Any]) -> None:
        with atomic_sink(child(out, name), settings) as sink:
            fill(sink)
        written.append(name)

    try:
        yield write
    except BaseException:
        with contextlib.suppress(Exception):
            fs.rm([f"{root.rstrip('/')}/{name}" for name in written])
        raise
