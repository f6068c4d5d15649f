"""What an orbax checkpoint's metadata claims, checked before orbax and tensorstore act on it: its tree's leaves
(``_METADATA``), its strings (``_strings.json``) and each zarr array's chunks (``.zarray``, ``zarr.json``).

orbax rebuilds the tree from the keys of each leaf in ``_METADATA`` and reads the leaf from the name they join to (by
``.``): two leaves of one name would read the same data, a leaf that is also a node, or a list with an index missing
or repeated, would lose leaves. tensorstore allocates a whole chunk before reading into it, so a chunk claimed far
larger than its array aborts the process (``std::bad_alloc``). Each is a :class:`~jaxstow.errors.FormatError` naming
the file and the leaf.

>>> from jaxstow._read.orbax_metadata import check_metadata
>>> check_metadata(".zarray", {"shape": [3, 4], "chunks": [3, 4], "dtype": "<f4"}, "w/.zarray")
>>> check_metadata(".zarray", {"shape": [3, 4], "chunks": [10**9, 10**9], "dtype": "<f4"}, "w/.zarray")
Traceback (most recent call last):
...
jaxstow.errors.FormatError: w/.zarray: claims chunks of shape [1000000000, 1000000000], larger than its array ...
"""

from __future__ import annotations

import math
import posixpath
from typing import Any, NoReturn

from jaxstow._format.json_codec import has_lone_surrogate
from jaxstow._storage.member_names import is_member_path
from jaxstow.errors import FormatError, excerpt

__all__ = ["check_metadata"]

#: orbax's ``key_type`` of a key that indexes a list or a tuple.
_SEQUENCE_KEY = 1


def check_metadata(name: str, metadata: Any, path: str) -> None:
    """Check ``metadata``, the parsed JSON of the metadata file ``name`` (its base name) at ``path``, where it is one
    whose claims orbax or tensorstore act on."""
    if name == "_METADATA":
        _check_tree(metadata, path)
    elif name == "_strings.json":
        _check_strings(metadata, path)
    elif name in (".zarray", "zarr.json") and isinstance(metadata, dict):
        _check_chunks(metadata, path)


def _check_tree(metadata: Any, path: str) -> None:
    """Each leaf of ``_METADATA`` named by keys of its own, within the folder, none a node of another, and every list
    indexed from 0 without a gap."""
    tree = metadata.get("tree_metadata") if isinstance(metadata, dict) else None
    named: dict[str, str] = {}  # the leaves' paths by the name orbax reads them from
    leaves: set[tuple[str, ...]] = set()
    indices: dict[tuple[str, ...], list[int]] = {}
    for entry in tree.values() if isinstance(tree, dict) else ():
        keys = entry.get("key_metadata") if isinstance(entry, dict) else None
        keys = [key for key in keys if isinstance(key, dict)] if isinstance(keys, list) else []
        parts = tuple(str(key.get("key")) for key in keys)
        leaf = "/".join(parts)
        name = posixpath.normpath(".".join(parts)) if parts else ""  # where it is read: "a/" and "a//" are "a"
        if not is_member_path(name) or name == ".":
            _refuse(
                f"names the leaf {excerpt(name)}, which orbax reads from a folder of that name, outside the checkpoint or its "
                "folder itself: orbax names a leaf by its keys, within the folder",
                path,
                leaf,
            )
        if has_lone_surrogate(name):
            _refuse(
                f"names the leaf {excerpt(name)}, which holds a lone surrogate, no text a file name holds", path, leaf
            )
        if name in named:
            first = named[name]
            _refuse(
                f"names the leaf {excerpt(leaf)} twice: orbax would keep one of them"
                if first == leaf
                else f"names two leaves, {excerpt(first)} and {excerpt(leaf)}, that orbax reads from one place, "
                f"{excerpt(name)}: one would be read as the other",
                path,
                leaf,
            )
        named[name] = leaf
        leaves.add(parts)
        for depth, key in enumerate(keys):
            if key.get("key_type") == _SEQUENCE_KEY:
                index = parts[depth]
                if not (index.isascii() and index.isdigit()):
                    _refuse(f"indexes a list by {excerpt(index)}, where orbax writes 0, 1, ...", path, leaf)
                indices.setdefault(parts[:depth], []).append(int(index))
    for parts in leaves:
        node = next((parts[:depth] for depth in range(1, len(parts)) if parts[:depth] in leaves), None)
        if node is not None:
            _refuse(
                f"holds a leaf {excerpt('/'.join(node))} and leaves inside it: orbax would keep only one of them",
                path,
                "/".join(parts),
            )
    for parent, found in indices.items():
        if sorted(set(found)) != list(range(len(set(found)))):
            _refuse(
                f"indexes the list {excerpt('/'.join(parent))} by {sorted(set(found))[:8]}, not 0, 1, ... without "
                "a gap: orbax cannot rebuild it",
                path,
                "/".join(parent),
            )


def _check_strings(metadata: Any, path: str) -> None:
    """orbax's strings: a JSON object of strings by leaf name."""
    if not isinstance(metadata, dict):
        _refuse("holds no JSON object: orbax keeps a checkpoint's strings by leaf name", path, None)
    for leaf, value in metadata.items():
        if not isinstance(value, str):
            _refuse(f"holds {excerpt(value)} for a string leaf: orbax keeps strings there", path, leaf)


def _check_chunks(metadata: dict[str, Any], path: str) -> None:
    """A zarr array's chunks (version 2's ``chunks``, version 3's chunk grid and the chunks of its shards): as many
    whole numbers as its shape has, each at least 1, none holding more elements than the array."""
    shape = metadata.get("shape")
    if shape is None:  # a group's metadata, or damage tensorstore names
        return
    if not _whole_numbers(shape, least=0):
        _refuse(f"claims the shape {excerpt(shape)}, not a list of whole numbers", path, None)
    grid = metadata.get("chunk_grid")
    chunked = [metadata.get("chunks")] if "chunks" in metadata else []
    chunked += [_chunk_shape(grid)] if isinstance(grid, dict) else []
    codecs = metadata.get("codecs")
    chunked += [_chunk_shape(codec) for codec in codecs if isinstance(codec, dict)] if isinstance(codecs, list) else []
    elements = math.prod(max(size, 1) for size in shape)
    for chunks in (chunks for chunks in chunked if chunks is not None):
        if not _whole_numbers(chunks, least=1) or len(chunks) != len(shape):
            _refuse(f"claims chunks of shape {excerpt(chunks)}, not {len(shape)} whole numbers from 1 on", path, None)
        if math.prod(chunks) > elements:
            _refuse(
                f"claims chunks of shape {excerpt(chunks)}, larger than its array of shape {shape}: tensorstore "
                "would allocate a chunk that large",
                path,
                None,
            )


def _chunk_shape(part: dict[str, Any]) -> Any:
    """The ``chunk_shape`` of a zarr version 3 chunk grid or sharding codec's configuration, if it has one."""
    configuration = part.get("configuration")
    return configuration.get("chunk_shape") if isinstance(configuration, dict) else None


def _whole_numbers(value: Any, *, least: int) -> bool:
    return isinstance(value, list) and all(type(size) is int and size >= least for size in value)


def _refuse(problem: str, path: str, leaf: str | None) -> NoReturn:
    raise FormatError(
        f"{problem}; the file is damaged or was made by hand: do not use this checkpoint", file=path, path=leaf
    )
