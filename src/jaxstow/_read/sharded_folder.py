"""A folder of safetensors files (Hugging Face's sharded checkpoints): what makes one, and opening it as one lazy file.

The folder holds ``model.safetensors.index.json``, whose ``weight_map`` names the file of every tensor, and those
files; or, without an index, ``*.safetensors`` files whose tensors together make the flat dict, and no file that
jaxstow loads whole (``.jxs``, ``.npz``, a safetensors file with a jaxstow manifest): such a folder is refused, naming
what it holds and the call that loads it. A checkpoint folder, one of its steps or an orbax folder is none either.
Every file's header is read and checked when the folder is opened, and the index against the files; each tensor then
becomes a leaf stored whole in its file (:class:`~jaxstow._read.folder_file.FolderFile`), so a slice, or the part a
device holds, is read by byte ranges as any sharded leaf is. The folder's files are untrusted input, opened and
bounded as :mod:`jaxstow._read.folder_members` says; each ``.safetensors`` file must be a plain safetensors file.

>>> import os, tempfile, numpy as np
>>> from safetensors.numpy import save_file
>>> from jaxstow._read.sharded_folder import FolderFile, folder_listing, open_folder
>>> from jaxstow._storage.opening import locate
>>> folder = tempfile.mkdtemp()
>>> save_file({"a.w": np.ones((2, 3), np.float32)}, os.path.join(folder, "model-00001-of-00002.safetensors"))
>>> save_file({"b": np.zeros(4, np.int8)}, os.path.join(folder, "model-00002-of-00002.safetensors"))
>>> with open_folder(folder_listing(locate(folder)), FolderFile) as opened:
...     print(opened.paths, opened.read_box("a.w", ((0, 1), (1, 3))), opened.mapped(None, {"a.w"}).stored["a/w"].shape)
['a.w', 'b'] [[1. 1.]] (3, 2)
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Sequence
from typing import Any, NamedTuple, TypeVar

from jaxstow._format.header import NativeReader, claims_manifest, raw_header
from jaxstow._format.json_codec import parse_json, repeated_member
from jaxstow._format.kinds import Kind, folder_kind
from jaxstow._format.manifest_written import check_nesting
from jaxstow._format.native import MAX_HEADER_BYTES
from jaxstow._format.native_or_npz import Container
from jaxstow._format.shards import ShardedLeaf, StoredShard
from jaxstow._format.source import ReadSource
from jaxstow._read.folder_file import FolderFile, Names, Transposed
from jaxstow._read.folder_members import (
    MAX_FOLDER_TENSORS,
    Budget,
    child,
    file_start,
    list_folder,
    open_local_member,
)
from jaxstow._read.numbered_shards import refuse_missing_shards, refuse_unnamed_shards
from jaxstow._read.slicing import full_box
from jaxstow._storage.atomic import TEMPORARY_MARKER
from jaxstow._storage.member_names import is_member_name
from jaxstow._storage.opening import Location, locate
from jaxstow._storage.settings import StorageSettings
from jaxstow._util.gc_pause import with_gc_paused
from jaxstow.errors import ArgumentError, FormatError, IsAFolderError, PathNotFoundError, excerpt

__all__ = [
    "INDEX_SUFFIX",
    "WHOLE_FILES",
    "Budget",
    "FolderFile",
    "Listing",
    "Names",
    "Transposed",
    "child",
    "folder_listing",
    "list_folder",
    "listed_kind",
    "open_folder",
    "open_shard",
    "tensor_files",
    "unmapped",
]

F = TypeVar("F", bound=FolderFile)

#: How the index of a sharded folder is named: ``model.safetensors.index.json`` (any prefix).
INDEX_SUFFIX = ".safetensors.index.json"


class Listing(NamedTuple):
    """A sharded folder's files: its index's name (``None``: none) and ``weight_map``, or the shards alone."""

    folder: str
    files: list[str]
    index_name: str | None
    weight_map: dict[str, str] | None
    metadata: dict[str, Any] | None


def folder_listing(location: Location, settings: StorageSettings | None = None) -> Listing | None:
    """The files of the folder at ``location`` if it is a sharded safetensors folder; ``None`` if it is none.

    A folder with an index is one. A folder without is one when it holds ``.safetensors`` files and no other file that
    jaxstow loads whole (``.jxs``, ``.npz``, or a file of another name that starts as a safetensors file does);
    a folder holding those raises an :class:`~jaxstow.errors.IsAFolderError`
    naming them and the call that loads one. A checkpoint folder, one of its steps or an orbax folder is none: the
    reader's error names it and what restores it.
    """
    listed = list_folder(location, settings)
    if listed is None:
        return None
    names, read = listed
    names = [name for name in names if TEMPORARY_MARKER not in name]  # an interrupted save's leftovers: no model
    indexes = sorted(name for name in names if name.endswith(INDEX_SUFFIX))
    if len(indexes) > 1:
        chosen = [name for name in indexes if name == "model" + INDEX_SUFFIX]
        if not chosen:
            raise ArgumentError(f"holds several indexes {indexes}: open one folder per model", file=location.name)
        indexes = chosen
    if indexes:
        index = indexes[0]
        weight_map, metadata = _parse_index(read(index), file=child(location.name, index))
        named = sorted(set(weight_map.values()))
        refuse_unnamed_shards(location.name, index, named, names)
        return Listing(location.name, named, index, weight_map, metadata)
    if listed_kind(location, names, settings).name != "unknown":
        return None
    files = sorted(name for name in names if name.endswith(".safetensors"))
    whole = sorted(
        name for name in names if name.lower().endswith(WHOLE_FILES) or _named_otherwise(location, name, settings)
    )
    if whole:
        raise IsAFolderError(_not_shards(location.name, whole, files), file=location.name)
    refuse_missing_shards(location.name, files)
    return Listing(location.name, files, None, None, None) if files else None


#: The files of a folder that jaxstow loads whole, each on its own: jaxstow's own and npz files.
WHOLE_FILES = (".jxs", ".npz")


def _named_otherwise(location: Location, name: str, settings: StorageSettings | None) -> bool:
    """Whether the file ``name`` starts as a safetensors or jaxstow file does, though its name does not end in
    ``.safetensors`` (``jaxstow.save`` takes any name): one model file of the folder that no shard's name shows, read
    on its own. Its first 9 bytes are read (locally, only from a regular file)."""
    if name.endswith(".safetensors") or name.endswith((".json", ".md", ".txt")):
        return False
    start, size = file_start(location, name, 9, settings)
    return len(start) == 9 and start[8:9] == b"{" and 2 <= struct.unpack("<Q", start[:8])[0] <= size - 8


def _not_shards(folder: str, whole: Sequence[str], shards: Sequence[str]) -> str:
    """Why a folder without an index that holds files loaded whole is no folder of shards, and what loads one."""
    described = [f"{name} ({_kind(name)})" for name in whole]
    beside = f" beside {_few(shards)}" if shards else ""
    return (
        f"holds {_few(described)}{beside}, and no model{INDEX_SUFFIX}: a folder loads as one model only when its model "
        f"files are all plain safetensors files. Load one file: jaxstow.load({child(folder, whole[0])!r})"
    )


def _kind(name: str) -> str:
    """What a file that a folder's shards cannot hold is (one named ``.safetensors`` is there for its manifest)."""
    lowered = name.lower()
    if lowered.endswith(".npz"):
        return "an npz file"
    # A shard's name ends in ".safetensors" exactly: "model.SAFETENSORS" is named otherwise, of either kind.
    return (
        "a jaxstow file"
        if lowered.endswith(".jxs") or name.endswith(".safetensors")
        else "a jaxstow or safetensors file"
    )


def _few(names: Sequence[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def listed_kind(location: Location, names: Sequence[str], settings: StorageSettings | None) -> Kind:
    """The kind of the folder at ``location`` that holds ``names`` (a checkpoint folder, one of its steps, an orbax
    folder...), its subfolders listed where it is: on a local disk or at a URL."""
    return folder_kind(lambda sub: names if sub == "" else _subfolder(location, sub, settings))


def _subfolder(location: Location, name: str, settings: StorageSettings | None) -> list[str] | None:
    """The names in the subfolder ``name`` of the folder at ``location``; ``None`` if it is no folder, or one that
    cannot be looked into (a loop of links, no permission): what it is tells nothing of the folder's kind."""
    try:
        listed = list_folder(locate(child(location.path or location.url or location.name, name)), settings)
    except OSError:
        return None
    return None if listed is None else listed[0]


#: Entries an index may hold beside its tensors' (its metadata's), when they are counted from its text.
_INDEX_SLACK = 256
#: A name of a file that a folder can hold: at most 255 bytes of UTF-8, the longest name most file systems take.
_MAX_NAME_BYTES = 255


def _parse_index(data: bytes, *, file: str) -> tuple[dict[str, str], dict[str, Any] | None]:
    """The weight_map and metadata of an index's text, every part checked; a :class:`FormatError` naming it else.

    Its entries are counted from the text before it is parsed (every value but the first follows a comma).
    """
    if data.count(b",") > MAX_FOLDER_TENSORS + _INDEX_SLACK:
        raise FormatError(f"holds more entries than the {MAX_FOLDER_TENSORS} tensors a folder may hold", file=file)
    index = parse_json(data, what="the index", file=file, fast=False)
    if not isinstance(index, dict):
        raise FormatError(f"is no index: a JSON object with a weight_map, not {excerpt(index)}", file=file)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict):
        raise FormatError(f"needs a weight_map of tensor names to file names, not {excerpt(weight_map)}", file=file)
    if not weight_map:
        raise FormatError("has an empty weight_map: it maps no tensor to a file", file=file)
    if len(weight_map) > MAX_FOLDER_TENSORS:
        raise FormatError(
            f"maps {len(weight_map)} tensors, more than the {MAX_FOLDER_TENSORS} a folder may hold", file=file
        )
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not _shard_name(shard):
            raise FormatError(f"maps to {excerpt(shard)}, not a .safetensors file of the folder", file=file, path=name)
    if (twice := repeated_member(data)) is not None:
        raise FormatError(f"gives {excerpt(twice)} twice: which is meant cannot be told", file=file, path=twice)
    metadata = index.get("metadata")
    if not isinstance(metadata, dict):
        return weight_map, None
    check_nesting({"metadata": metadata}, file=file)
    return weight_map, metadata


def _shard_name(name: str) -> bool:
    """Whether ``name`` can name a ``.safetensors`` file of the folder itself (no path, no NUL, UTF-8, not hidden)."""
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return (
        name.endswith(".safetensors")
        and not name.startswith(".")
        and len(encoded) <= _MAX_NAME_BYTES
        and is_member_name(name)
    )


def open_folder(
    listing: Listing,
    kind: type[F],
    settings: StorageSettings | None = None,
    *,
    names: Names | None = None,
    transposed: Transposed | None = None,
) -> F:
    """The sharded safetensors folder of ``listing`` (:func:`folder_listing`) as a ``kind``, its files' headers read.

    ``names`` and ``transposed`` give the view's paths and the tensors read turned over (see :class:`FolderFile`).
    """
    containers: list[Container] = []
    budget = Budget()
    try:
        for name in listing.files:
            containers.append(open_shard(listing, name, settings, budget))
        return kind(
            containers,
            _leaves(listing, containers),
            folder=listing.folder,
            metadata=listing.metadata,
            index=listing.index_name,
            names=names,
            transposed=transposed,
        )
    except BaseException:
        for container in containers:
            container.close()
        raise


def open_shard(listing: Listing, name: str, settings: StorageSettings | None, budget: Budget) -> Container:
    """The file ``name`` of the folder, its header read and checked as a plain safetensors file's, within ``budget``.

    A missing file names what the index maps to it; a jaxstow file, an npz or any other file is refused, naming it.
    """
    shown = child(listing.folder, name)
    folder = locate(listing.folder)
    source: ReadSource
    try:
        if folder.path is not None:
            source = open_local_member(folder.path, name, shown, settings)
        else:
            source = locate(shown).open(settings)
    except PathNotFoundError as error:
        if listing.weight_map is None:
            raise
        tensors = sorted(tensor for tensor, shard in listing.weight_map.items() if shard == name)
        raise PathNotFoundError(
            f"is missing: {listing.index_name} maps {len(tensors)} tensor{'s' if len(tensors) != 1 else ''} to it ({', '.join(tensors[:3])}"
            f"{', ...' if len(tensors) > 3 else ''})",
            file=shown,
        ) from error
    try:
        return _plain_file(listing, name, source, budget)
    except BaseException:
        source.close()
        raise


#: How a zip archive (an npz, a PyTorch file) starts.
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")


def _plain_file(listing: Listing, name: str, source: ReadSource, budget: Budget) -> NativeReader:
    """``source`` as a plain safetensors file, refused before its header is parsed if it is anything else."""
    start = source.read(0, min(source.size, 9))
    if start[:4] in _ZIP_MAGIC and start[8:9] != b"{":
        raise FormatError(
            "is a zip archive (an npz or a PyTorch file), not a safetensors file: a folder's .safetensors files are "
            "read as safetensors files only",
            file=source.name,
        )
    if len(start) == 9 and (length := struct.unpack("<Q", start[:8])[0]) <= MAX_HEADER_BYTES:
        budget.check_length(length, file=source.name)
    raw = raw_header(source)
    if claims_manifest(raw):
        if listing.weight_map is None:
            others = [file for file in listing.files if file != name]
            raise IsAFolderError(_not_shards(listing.folder, [name], others), file=listing.folder)
        raise FormatError(
            f"is a jaxstow file, not a plain safetensors file, and {listing.index_name} maps tensors to it: a folder's "
            f"files are plain safetensors files. Load this one on its own: jaxstow.load({source.name!r})",
            file=source.name,
        )
    budget.spend(raw, file=source.name)
    return NativeReader(source, raw, fast=False)


def tensor_files(listing: Listing, containers: Sequence[Container | None]) -> tuple[dict[str, int], list[FormatError]]:
    """Which file holds each tensor (an index in ``listing.files``), and every way the files and the index disagree.

    No tensor may be in two files. With an index, the tensors it maps, each in the file it names; without, every
    tensor of every file. A file not opened (``None``) is passed over.
    """
    where: dict[str, int] = {}
    problems: list[FormatError] = []
    for source, container in enumerate(containers):
        if container is None:
            continue
        for tensor in container.slots:
            if tensor in where:
                first = child(listing.folder, listing.files[where[tensor]])
                message = f"is also in {first}: the folder's files hold it twice"
                problems.append(FormatError(message, file=container.file, path=tensor))
            else:
                where[tensor] = source
    if listing.weight_map is None:
        return where, problems
    position = {name: source for source, name in enumerate(listing.files)}
    mapped: dict[str, int] = {}
    for tensor, shard in listing.weight_map.items():
        container = containers[position[shard]]
        if container is None:
            continue
        if tensor not in container.slots:
            message = f"maps it to {shard}, which holds no tensor of this name"
            problems.append(FormatError(message, file=child(listing.folder, str(listing.index_name)), path=tensor))
        else:
            mapped[tensor] = position[shard]
    return mapped, problems


def unmapped(index: str | None, mapped: Collection[str], containers: Sequence[Container | None]) -> list[FormatError]:
    """The tensors that a file holds and the folder's index (``None``: none) does not map, by file: every load leaves
    them out. A file not opened (``None``) is passed over."""
    if index is None:
        return []
    problems = []
    for container in containers:
        left_out = sorted(set(container.slots) - set(mapped)) if container is not None else []
        if container is not None and left_out:
            shown = ", ".join(map(repr, left_out[:5])) + (f" and {len(left_out) - 5} more" if len(left_out) > 5 else "")
            problems.append(
                FormatError(
                    f"holds {shown}, which {index} does not map: every load leaves "
                    f"{'it' if len(left_out) == 1 else 'them'} out",
                    file=container.file,
                )
            )
    return problems


@with_gc_paused
def _leaves(listing: Listing, containers: Sequence[Container]) -> dict[str, ShardedLeaf]:
    """Every tensor as a leaf stored whole in its file, by name; the first way the files and the index disagree."""
    where, problems = tensor_files(listing, containers)
    if problems:
        raise problems[0]
    leaves = {}
    for tensor in sorted(where):
        slot = containers[where[tensor]].slots[tensor]
        whole = StoredShard(tensor, where[tensor], full_box(slot.shape), None)
        leaves[tensor] = ShardedLeaf(tensor, "sharded", slot.dtype, slot.shape, None, None, (whole,), None)
    return leaves
