"""A folder of safetensors files (Hugging Face's sharded checkpoints) read as one lazy file.

The folder holds ``model.safetensors.index.json``, whose ``weight_map`` names the file of every tensor, and those
files; or only ``*.safetensors`` files, whose tensors together make the flat dict. Every file's header is read when the
folder is opened; each tensor becomes a leaf stored whole in its file, so a slice, or the part a device holds, is read
by byte ranges as any sharded leaf is. Paths are the tensor names; :meth:`FolderFile.mapped` fits them to a tree's
paths (``a.b.0.c`` -> ``a/b/0/c`` unless ``names`` says otherwise), each 2-d tensor that ``transposed`` marks turned
over (torch's ``weight`` is (out, in), flax's ``kernel`` (in, out)).

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
import math
import os
import posixpath
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

import numpy as np

from jaxstow._format.kinds import folder_kind
from jaxstow._format.native_or_npz import Container, open_container
from jaxstow._format.shards import Box, ShardedLeaf, Stored, StoredShard
from jaxstow._read.opened import LeafInfo, OpenedFile
from jaxstow._read.shard_reads import ShardReads
from jaxstow._read.slicing import full_box
from jaxstow._storage.opening import Location, locate
from jaxstow._storage.settings import StorageSettings
from jaxstow.errors import ArgumentError, FormatError, PathError, PathNotFoundError, excerpt

__all__ = ["INDEX_SUFFIX", "FolderFile", "Names", "Transposed", "child", "folder_listing", "list_folder", "open_folder"]

F = TypeVar("F", bound="FolderFile")

#: How the index of a sharded folder is named: ``model.safetensors.index.json`` (any prefix).
INDEX_SUFFIX = ".safetensors.index.json"
#: A tensor name's path in a tree: a function (``None``: leave the tensor out) or a mapping (absent: left out).
Names = Callable[[str], str | None] | Mapping[str, str]
#: The 2-d tensors stored transposed: a set of tensor names or a predicate on them.
Transposed = Callable[[str], bool] | Collection[str]


class Listing(NamedTuple):
    """A sharded folder's files: its index's name (``None``: none) and ``weight_map``, or the shards alone."""

    folder: str
    files: list[str]
    index_name: str | None
    weight_map: dict[str, str] | None
    metadata: dict[str, Any] | None


def folder_listing(location: Location, settings: StorageSettings | None = None) -> Listing | None:
    """The files of the folder at ``location`` if it is a sharded safetensors folder; ``None`` if it is none.

    A folder without an index is one when it holds ``.safetensors`` files and is no checkpoint step.
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
    files = sorted(name for name in names if name.endswith(".safetensors"))
    if not files or folder_kind(lambda sub: names if sub == "" else None).name != "unknown":
        return None
    return Listing(location.name, files, None, None, None)


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


def open_folder(location: Location, kind: type[F], settings: StorageSettings | None = None) -> F:
    """The sharded safetensors folder at ``location`` as a ``kind``, its files' headers read; an error if it is none."""
    listing = folder_listing(location, settings)
    if listing is None:
        raise PathNotFoundError("is no folder of safetensors files", file=location.name)
    containers: list[Container] = []
    try:
        for name in listing.files:
            containers.append(_open_shard(listing, name, settings))
        return kind(containers, _leaves(listing, containers), folder=listing.folder, metadata=listing.metadata)
    except BaseException:
        for container in containers:
            container.close()
        raise


def _open_shard(listing: Listing, name: str, settings: StorageSettings | None) -> Container:
    shown = child(listing.folder, name)
    try:
        source = locate(shown).open(settings)
    except PathError as error:
        if listing.weight_map is None:
            raise
        tensors = sorted(tensor for tensor, shard in listing.weight_map.items() if shard == name)
        raise PathNotFoundError(
            f"is missing: {listing.index_name} maps {len(tensors)} tensors to it ({', '.join(tensors[:3])}"
            f"{', ...' if len(tensors) > 3 else ''})",
            file=shown,
        ) from error
    try:
        return open_container(source)
    except BaseException:
        source.close()
        raise


def _leaves(listing: Listing, containers: Sequence[Container]) -> dict[str, ShardedLeaf]:
    """Every tensor as a leaf stored whole in its file (those the index maps, or all of every file)."""
    where: dict[str, int] = {}
    if listing.weight_map is not None:
        position = {name: source for source, name in enumerate(listing.files)}
        for tensor, shard in listing.weight_map.items():
            if tensor not in containers[position[shard]].slots:
                raise FormatError(
                    f"holds no tensor of this name, which {listing.index_name} maps to it",
                    file=containers[position[shard]].file,
                    path=tensor,
                )
            where[tensor] = position[shard]
    else:
        for source, container in enumerate(containers):
            for tensor in container.slots:
                if tensor in where:
                    raise FormatError(
                        f"is also in {containers[where[tensor]].file}: the folder's files hold it twice",
                        file=container.file,
                        path=tensor,
                    )
                where[tensor] = source
    leaves = {}
    for tensor in sorted(where):
        slot = containers[where[tensor]].slots[tensor]
        whole = StoredShard(tensor, where[tensor], full_box(slot.shape), None)
        leaves[tensor] = ShardedLeaf(tensor, "sharded", slot.dtype, slot.shape, None, None, (whole,), None)
    return leaves


class FolderFile(OpenedFile):
    """A sharded safetensors folder's tensors as one file's leaves, by tensor name or mapped onto a tree's paths.

    ``layout`` holds each leaf as stored; a leaf in ``stored`` whose shape is turned over is read turned over.
    """

    def __init__(
        self,
        containers: Sequence[Container],
        layout: Mapping[str, ShardedLeaf],
        *,
        folder: str,
        metadata: dict[str, Any] | None,
        presented: Mapping[str, Stored] | None = None,
    ) -> None:
        super().__init__(containers, leaves=presented if presented is not None else layout)
        self.file = folder
        self.metadata = metadata if metadata is not None else self.metadata
        self.layout = dict(layout)

    def mapped(self, names: Names | None = None, transposed: Transposed | None = None) -> FolderFile:
        """The same tensors by the paths ``names`` gives them (dots become slashes by default).

        Each 2-d tensor that ``transposed`` marks is turned over. The view shares this folder's open files.
        """
        mapping = _path_mapping(names, list(self.layout))
        marked = _marked(transposed, list(self.layout))
        layout: dict[str, ShardedLeaf] = {}
        presented: dict[str, Stored] = {}
        for tensor, path in mapping.items():
            leaf = self.layout[tensor]
            if path in layout:
                raise ArgumentError(f"names= gives {layout[path].shards[0].tensor!r} and {tensor!r} the path {path!r}")
            layout[path] = leaf._replace(path=path)
            shape = leaf.shape
            if tensor in marked:
                if len(shape) != 2:
                    raise ArgumentError(f"transposed= marks {tensor!r}, of shape {list(shape)}: only 2-d tensors turn")
                shape = shape[::-1]
            presented[path] = leaf._replace(path=path, shape=shape)
        return FolderFile(self.containers, layout, folder=self.file, metadata=self.metadata, presented=presented)

    def info(self, path: str) -> LeafInfo:
        """Describe the tensor at ``path`` (an array stored in one of the folder's files)."""
        return super().info(path)._replace(kind="array")

    def read_box(self, path: str, box: Box) -> np.ndarray:
        """The elements of ``box`` of the tensor at ``path``, read by byte ranges (turned over where marked)."""
        self.check_open(f"reading leaf {excerpt(path)}")
        stored = self.layout[path]
        turned = stored.shape != self.stored[path].shape
        reads = ShardReads(self.containers)
        assembled = reads.box(stored, box[::-1] if turned else box)
        self.on_read(math.prod(stop - start for start, stop in box) * stored.dtype.itemsize)
        reads.run()
        return np.ascontiguousarray(assembled().T) if turned else assembled()

    def read_arrays(self, leaves: Sequence[Stored]) -> dict[str, np.ndarray]:
        """Whole tensors by path, read together (the tensors turned over each on its own)."""
        self.check_open("reading leaves")
        turned = {leaf.path: leaf for leaf in leaves if leaf.shape != self.layout[leaf.path].shape}
        arrays = super().read_arrays([self.layout[leaf.path] for leaf in leaves if leaf.path not in turned])
        arrays.update({path: self.read_box(path, full_box(leaf.shape)) for path, leaf in turned.items()})
        return arrays

    def __repr__(self) -> str:
        return f"<jaxstow folder {self.file}: {len(self.paths)} tensors in {len(self.containers)} files>"


def _path_mapping(names: Names | None, tensors: list[str]) -> dict[str, str]:
    if names is None:
        return {tensor: tensor.replace(".", "/") for tensor in tensors}
    if isinstance(names, Mapping):
        unknown = sorted(set(names) - set(tensors))
        if unknown:
            raise ArgumentError(f"names= maps tensors the folder lacks: {unknown[:5]}")
        return {tensor: names[tensor] for tensor in tensors if tensor in names}
    mapping = {}
    for tensor in tensors:
        path = names(tensor)
        if path is not None and not isinstance(path, str):
            raise ArgumentError(f"names= gives {tensor!r} the path {path!r}: a string, or None to leave it out")
        if path is not None:
            mapping[tensor] = path
    return mapping


def _marked(transposed: Transposed | None, tensors: list[str]) -> set[str]:
    if transposed is None:
        return set()
    if callable(transposed):
        return {tensor for tensor in tensors if transposed(tensor)}
    if isinstance(transposed, str):
        raise ArgumentError("transposed= takes a set of tensor names or a predicate, not one string")
    unknown = sorted(set(transposed) - set(tensors))
    if unknown:
        raise ArgumentError(f"transposed= names tensors the folder lacks: {unknown[:5]}")
    return set(transposed)
