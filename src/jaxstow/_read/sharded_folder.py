"""A folder of safetensors files (Hugging Face's sharded checkpoints): what makes one, and opening it as one lazy file.

The folder holds ``model.safetensors.index.json``, whose ``weight_map`` names the file of every tensor, and those
files; or, without an index, ``*.safetensors`` files whose tensors together make the flat dict, and no file that
jaxstow loads whole (``.jxs``, ``.npz``, a safetensors file with a jaxstow manifest): such a folder is refused, naming
what it holds and the call that loads it. A checkpoint folder, one of its steps or an orbax folder is none either.
Every file's header is read and checked when the folder is opened, and the index against the files; each tensor then
becomes a leaf stored whole in its file (:class:`~jaxstow._read.folder_file.FolderFile`), so a slice, or the part a
device holds, is read by byte ranges as any sharded leaf is.

>>> import os, tempfile, numpy as np
>>> from safetensors.numpy import save_file
>>> from jaxstow._read.sharded_folder import FolderFile, open_folder
>>> from jaxstow._storage.opening import locate
>>> folder = tempfile.mkdtemp()
>>> save_file({"a.w": np.ones((2, 3), np.float32)}, os.path.join(folder, "model-00001-of-00002.safetensors"))
>>> save_file({"b": np.zeros(4, np.int8)}, os.path.join(folder, "model-00002-of-00002.safetensors"))
>>> with open_folder(locate(folder), FolderFile) as opened:
...     print(opened.paths, opened.read("a.w", np.s_[0, 1:]), opened.mapped(None, {"a.w"}).stored["a/w"].shape)
['a.w', 'b'] [1. 1.] (3, 2)
"""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

from jaxstow._format.kinds import folder_kind
from jaxstow._format.native_or_npz import Container, open_container
from jaxstow._format.shards import ShardedLeaf, StoredShard
from jaxstow._read.folder_file import FolderFile, Names, Transposed
from jaxstow._read.slicing import full_box
from jaxstow._storage.opening import Location, locate
from jaxstow._storage.settings import StorageSettings
from jaxstow.errors import ArgumentError, FormatError, IsAFolderError, PathError, PathNotFoundError, excerpt

__all__ = [
    "INDEX_SUFFIX",
    "WHOLE_FILES",
    "FolderFile",
    "Listing",
    "Names",
    "Transposed",
    "check_plain",
    "child",
    "folder_listing",
    "list_folder",
    "open_folder",
    "open_shard",
    "tensor_files",
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
    jaxstow loads whole (``.jxs``, ``.npz``); a folder holding those raises an :class:`~jaxstow.errors.IsAFolderError`
    naming them and the call that loads one. A checkpoint folder, one of its steps or an orbax folder is none: the
    reader's error names it and what restores it.
    """
    listed = list_folder(location, settings)
    if listed is None:
        return None
    names, read = listed
    indexes = sorted(name for name in names if name.endswith(INDEX_SUFFIX))
    if len(indexes) > 1:
        chosen = [name for name in indexes if name == "model" + INDEX_SUFFIX]
        if not chosen:
            raise ArgumentError(f"holds several indexes {indexes}: open one folder per model", file=location.name)
        indexes = chosen
    if indexes:
        index = indexes[0]
        weight_map, metadata = _parse_index(read(index), file=child(location.name, index))
        return Listing(location.name, sorted(set(weight_map.values())), index, weight_map, metadata)
    if folder_kind(lambda sub: names if sub == "" else _subfolder(location, sub, settings)).name != "unknown":
        return None
    files = sorted(name for name in names if name.endswith(".safetensors"))
    whole = sorted(name for name in names if name.endswith(WHOLE_FILES))
    if whole:
        raise IsAFolderError(_not_shards(location.name, whole, files), file=location.name)
    return Listing(location.name, files, None, None, None) if files else None


#: The files of a folder that jaxstow loads whole, each on its own: jaxstow's own and npz files.
WHOLE_FILES = (".jxs", ".npz")


def _not_shards(folder: str, whole: Sequence[str], shards: Sequence[str]) -> str:
    """Why a folder without an index that holds files loaded whole is no folder of shards, and what loads one."""
    described = [f"{name} ({'an npz file' if name.endswith('.npz') else 'a jaxstow file'})" for name in whole]
    beside = f" beside {_few(shards)}" if shards else ""
    return (
        f"holds {_few(described)}{beside}, and no model{INDEX_SUFFIX}: a folder loads as one model only when its model "
        f"files are all plain safetensors files. Load one file: jaxstow.load({child(folder, whole[0])!r})"
    )


def _few(names: Sequence[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _subfolder(location: Location, name: str, settings: StorageSettings | None) -> list[str] | None:
    """The names in the subfolder ``name`` of the folder at ``location``; ``None`` if it is no folder."""
    listed = list_folder(locate(child(location.path or location.url or location.name, name)), settings)
    return None if listed is None else listed[0]


def list_folder(
    location: Location, settings: StorageSettings | None
) -> tuple[list[str], Callable[[str], bytes]] | None:
    """The names in the folder and how to read one of its files; ``None`` when it is no folder."""
    if location.path is not None:
        folder = location.path
        if not os.path.isdir(folder):
            return None

        def read_local(name: str) -> bytes:
            with open(os.path.join(folder, name), "rb") as file:
                return file.read()

        return os.listdir(folder), read_local
    if location.url is None:
        return None
    from jaxstow._storage.remote import storage_errors, url_filesystem

    fs, root = url_filesystem(location.url, (settings or StorageSettings()).options)
    with storage_errors(location.url):
        if not fs.isdir(root):
            return None
        names = [posixpath.basename(str(entry).rstrip("/")) for entry in fs.ls(root, detail=False)]

    def read_remote(name: str) -> bytes:
        with storage_errors(child(location.name, name)):
            return bytes(fs.cat_file(posixpath.join(root, name)))

    return names, read_remote


def _parse_index(data: bytes, *, file: str) -> tuple[dict[str, str], dict[str, Any] | None]:
    try:
        index = json.loads(data)
    except ValueError as error:
        raise FormatError(f"is no JSON index ({error})", file=file) from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(name, str) and isinstance(shard, str) for name, shard in weight_map.items()
    ):
        raise FormatError(f"needs a weight_map of tensor names to file names, not {excerpt(weight_map)}", file=file)
    for name, shard in weight_map.items():
        if not shard.endswith(".safetensors") or "/" in shard or "\\" in shard or shard.startswith("."):
            raise FormatError(f"maps to {excerpt(shard)}, not a .safetensors file of the folder", file=file, path=name)
    metadata = index.get("metadata")
    return weight_map, metadata if isinstance(metadata, dict) else None


def child(folder: str, name: str) -> str:
    """The file ``name`` of ``folder`` (a path or a URL)."""
    return posixpath.join(folder, name) if "://" in folder else os.path.join(folder, name)


def open_folder(
    location: Location,
    kind: type[F],
    settings: StorageSettings | None = None,
    *,
    names: Names | None = None,
    transposed: Transposed | None = None,
) -> F:
    """The sharded safetensors folder at ``location`` as a ``kind``, its files' headers read; an error if it is none.

    ``names`` and ``transposed`` give the view's paths and the tensors read turned over (see :class:`FolderFile`).
    """
    listing = folder_listing(location, settings)
    if listing is None:
        raise PathNotFoundError("is no folder of safetensors files", file=location.name)
    containers: list[Container] = []
    try:
        for name in listing.files:
            containers.append(open_shard(listing, name, settings))
        check_plain(listing, containers)
        where, problems = tensor_files(listing, containers)
        if problems:
            raise problems[0]
        return kind(
            containers,
            _leaves(containers, where),
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


def open_shard(listing: Listing, name: str, settings: StorageSettings | None) -> Container:
    """The file ``name`` of the folder, its header read and checked; a missing file names what the index maps to it."""
    shown = child(listing.folder, name)
    try:
        source = locate(shown).open(settings)
    except PathError as error:
        if listing.weight_map is None:
            raise
        tensors = sorted(tensor for tensor, shard in listing.weight_map.items() if shard == name)
        raise PathNotFoundError(
            f"is missing: {listing.index_name} maps {len(tensors)} tensor{'s' if len(tensors) != 1 else ''} to it ({', '.join(tensors[:3])}"
            f"{', ...' if len(tensors) > 3 else ''})",
            file=shown,
        ) from error
    try:
        return open_container(source)
    except BaseException:
        source.close()
        raise


def check_plain(listing: Listing, containers: Sequence[Container | None]) -> None:
    """Refuse a folder without an index whose ``.safetensors`` files include a jaxstow file (it loads whole)."""
    if listing.weight_map is not None:
        return
    opened = [(name, container) for name, container in zip(listing.files, containers, strict=True) if container]
    whole = [name for name, container in opened if container.manifest is not None]
    if whole:
        plain = [name for name, container in opened if container.manifest is None]
        raise IsAFolderError(_not_shards(listing.folder, whole, plain), file=listing.folder)


def tensor_files(listing: Listing, containers: Sequence[Container | None]) -> tuple[dict[str, int], list[FormatError]]:
    """Which file holds each tensor (an index in ``listing.files``), and every way the files and the index disagree.

    With an index, the tensors it maps, each in the file it names; without, every tensor of every file, each in one
    file only. A file not opened (``None``) is passed over.
    """
    where: dict[str, int] = {}
    problems: list[FormatError] = []
    if listing.weight_map is not None:
        position = {name: source for source, name in enumerate(listing.files)}
        for tensor, shard in listing.weight_map.items():
            container = containers[position[shard]]
            if container is None:
                continue
            if tensor not in container.slots:
                message = f"holds no tensor of this name, which {listing.index_name} maps to it"
                problems.append(FormatError(message, file=container.file, path=tensor))
            else:
                where[tensor] = position[shard]
        return where, problems
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
    return where, problems


def _leaves(containers: Sequence[Container], where: Mapping[str, int]) -> dict[str, ShardedLeaf]:
    """Every tensor as a leaf stored whole in its file, by name."""
    leaves = {}
    for tensor in sorted(where):
        slot = containers[where[tensor]].slots[tensor]
        whole = StoredShard(tensor, where[tensor], full_box(slot.shape), None)
        leaves[tensor] = ShardedLeaf(tensor, "sharded", slot.dtype, slot.shape, None, None, (whole,), None)
    return leaves
