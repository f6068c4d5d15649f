"""Format version 3's manifest: the leaves as columns, saying only what the safetensors header does not.

The columns ``paths``, ``kinds`` (one letter per leaf), ``xxh3`` and ``details`` (for the few leaves that need more
than their tensor says) are specified in docs/format.md ("Leaf columns"). They are checked as wholes; each detail is
checked as a version 2 entry is. A manifest being written keeps its entries (``leaves``) until the header is written.
A file read keeps its stored leaves by path as :class:`StoredLeaves`, each described only when asked for.

>>> from jaxstow._format.columns import check_columns, columnar
>>> from jaxstow._format.tensor_reads import TensorSlot
>>> import numpy as np
>>> manifest = columnar({"format": "jaxstow", "version": 3, "structure": "*", "metadata": None,
...     "leaves": [{"path": "w", "kind": "array", "xxh3": "d0a66a65c7528968"}]})
>>> manifest
{'format': 'jaxstow', 'version': 3, 'structure': '*', 'metadata': None, 'paths': ['w'], 'kinds': 'a', 'xxh3': ['d0a66a65c7528968'], 'details': {}}
>>> check_columns(manifest, {"w": TensorSlot.at("w", np.dtype(np.float32), (2,), 0)}, file="f.jxs").checksum(0)
'd0a66a65c7528968'
>>> check_columns({**manifest, "kinds": "x"}, {}, file="f.jxs")
Traceback (most recent call last):
...
jaxstow.errors.FormatError: f.jxs: the manifest's kinds must be a string of one letter per leaf from 'anktsvp', not 'x'
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

import numpy as np

from jaxstow._format.leaves import StoredLeaf
from jaxstow._format.manifest import _check_entry
from jaxstow._format.shards import Stored
from jaxstow._format.tensor_reads import TensorSlot
from jaxstow.errors import FormatError, excerpt

__all__ = ["COLUMNAR_VERSION", "KIND_NAMES", "LeafColumns", "StoredLeaves", "check_columns", "columnar"]

#: The first format version whose manifest holds columns.
COLUMNAR_VERSION = 3
KIND_LETTERS = {
    "array": "a",
    "npscalar": "n",
    "key": "k",
    "torch": "t",
    "sharded": "s",
    "value": "v",
    "per_process": "p",
}
KIND_NAMES = {letter: kind for kind, letter in KIND_LETTERS.items()}
#: The kinds of leaf whose bytes are one tensor named by the leaf's path, each with a checksum in ``xxh3``.
CHECKSUMMED = "anktp"
_COLUMN_KEYS = ("paths", "kinds", "xxh3", "details")
_HEX = re.compile(r"[0-9a-f]*")
_INDEX = re.compile(r"0|[1-9][0-9]{0,17}")
_STORED_MARKS = bytes(int(chr(byte) in CHECKSUMMED) for byte in range(256))


def columnar(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest as a file of version 3 or later holds it.

    Its ``leaves`` entries turned into columns (any other manifest as it is).
    """
    leaves = manifest.get("leaves")
    version = manifest.get("version")
    if not (type(version) is int and version >= COLUMNAR_VERSION) or not isinstance(leaves, list):
        return manifest
    out = {key: value for key, value in manifest.items() if key != "leaves"}
    kinds = "".join([KIND_LETTERS[entry["kind"]] for entry in leaves])
    out["paths"] = [entry["path"] for entry in leaves]
    out["kinds"] = kinds
    out["xxh3"] = [entry["xxh3"] for entry, kind in zip(leaves, kinds, strict=True) if kind in CHECKSUMMED]
    out["details"] = {
        str(i): {key: value for key, value in entry.items() if key not in ("path", "kind", "xxh3")}
        for i, (entry, kind) in enumerate(zip(leaves, kinds, strict=True))
        if len(entry) > 2 + (kind in CHECKSUMMED)
    }
    return out


class LeafColumns:
    """A checked version 3 manifest's leaves.

    The columns, and the detail of each leaf that has one as a version 2 entry (with its path and kind), checked.
    """

    def __init__(self, paths: list[str], kinds: str, checksums: list[str], entries: dict[int, dict[str, Any]]) -> None:
        self.paths = paths
        self.kinds = kinds
        self.checksums = checksums
        self.entries = entries
        # The leaves stored as one tensor named by their path: their letters marked 1, the others 0.
        self.stored = np.frombuffer(kinds.encode("ascii").translate(_STORED_MARKS), np.bool_)
        self._rank = np.cumsum(self.stored) - 1  # each such leaf's place in ``checksums``

    def checksum(self, index: int) -> str:
        """The checksum of the stored leaf at ``index``."""
        return self.checksums[int(self._rank[index])]

    def stored_paths(self) -> list[str]:
        return list(itertools.compress(self.paths, self.stored.tolist()))

    def tensor_names(self) -> set[str]:
        """The names of the tensors the leaves are stored in (a sharded leaf's shards each have one)."""
        names = set(self.stored_paths())
        for entry in self.entries.values():
            if entry["kind"] == "sharded":
                names.update(shard["tensor"] for shard in entry["shards"])
        return names


def check_columns(manifest: dict[str, Any], slots: Mapping[str, TensorSlot], *, file: str) -> LeafColumns:
    """The leaves of a version 3 manifest, every column and detail checked against the file's tensors ``slots``.

    The manifest's other fields are checked already, by :func:`~jaxstow._format.manifest.check_manifest`.
    """
    paths, kinds, checksums, details = (manifest.get(key) for key in _COLUMN_KEYS)
    if not (isinstance(paths, list) and set(map(type, paths)) <= {str}):
        raise FormatError("the manifest's paths must be a list of strings", file=file)
    if not (isinstance(kinds, str) and len(kinds) == len(paths) and set(kinds) <= set(KIND_NAMES)):
        raise FormatError(
            f"the manifest's kinds must be a string of one letter per leaf from 'anktsvp', not {excerpt(kinds, 45)}",
            file=file,
        )
    stored = sum(kinds.count(letter) for letter in CHECKSUMMED)
    if not (
        isinstance(checksums, list)
        and len(checksums) == stored
        and set(map(type, checksums)) <= {str}
        and set(map(len, checksums)) <= {16}
        and _HEX.fullmatch("".join(checksums))
    ):
        raise FormatError(
            f"the manifest's xxh3 must be 16 hex digits for each of its {stored} stored leaves", file=file
        )
    if len(set(paths)) != len(paths):
        seen: set[str] = set()
        twice = next(path for path in paths if path in seen or seen.add(path))  # type: ignore[func-returns-value]
        raise FormatError("the manifest lists this leaf twice", file=file, path=twice)
    if not isinstance(details, dict):
        raise FormatError("the manifest's details must be an object keyed by leaf index", file=file)
    columns = LeafColumns(paths, kinds, checksums, {})
    entries = columns.entries
    for key, detail in details.items():
        index = int(key) if _INDEX.fullmatch(key) else len(paths)
        if index >= len(paths) or not isinstance(detail, dict):
            raise FormatError(
                f"malformed detail {excerpt(key)} of the manifest (expected a leaf index and an object)", file=file
            )
        entry = {**detail, "path": paths[index], "kind": KIND_NAMES[kinds[index]]}
        if kinds[index] in CHECKSUMMED:
            entry["xxh3"] = columns.checksum(index)
        _check_entry(entry, index, slots, file=file)
        entries[index] = entry
    for letter, needs in (("v", "value"), ("k", "impl"), ("s", "shards"), ("p", "processes")):
        start = kinds.find(letter)
        while start >= 0:
            if start not in entries or needs not in entries[start]:
                raise FormatError(
                    f"a {KIND_NAMES[letter]} leaf needs its {needs} in the details", file=file, path=paths[start]
                )
            start = kinds.find(letter, start + 1)
    start = kinds.find("n")
    while start >= 0:
        if start not in entries and paths[start] in slots and slots[paths[start]].shape:
            shape = list(slots[paths[start]].shape)
            raise FormatError(f"a numpy scalar has shape [], not {shape}", file=file, path=paths[start])
        start = kinds.find("n", start + 1)
    return columns


#: The kinds of leaf kept apart from the stored ones: values and per-process leaves.
_NOT_STORED = "vp"


class StoredLeaves(MutableMapping[str, Stored]):
    """The stored leaves of a version 3 file by path.

    Those with details are made (and checked) when the file is opened, the others, stored exactly as their tensors, when
    first asked for.

    >>> import io, numpy as np, jaxstow
    >>> saved = io.BytesIO()
    >>> jaxstow.save(saved, {"w": np.arange(3.0), "b": np.ones(2), "n": 2})
    >>> with jaxstow.open(io.BytesIO(saved.getvalue())) as reader:
    ...     leaves = reader.stored
    ...     print(type(leaves).__name__, list(leaves), leaves.described())
    ...     print(leaves["w"].shape, [leaf.path for leaf in leaves.described()])
    StoredLeaves ['b', 'w'] []
    (3,) ['w']
    """

    def __init__(self, columns: LeafColumns, slots: Mapping[str, TensorSlot], made: dict[str, Stored]) -> None:
        self._columns = columns
        self._slots = slots
        self._made = made

    @functools.cached_property
    def _index(self) -> dict[str, int]:  # made when a leaf is first asked for: a whole restore never asks
        return dict(zip(self._columns.paths, range(len(self._columns.paths)), strict=True))

    def __getitem__(self, path: str) -> Stored:
        leaf = self._made.get(path)
        if leaf is None:
            i = self._index[path]
            if not self._columns.stored[i] or self._columns.kinds[i] == "p":
                raise KeyError(path)
            slot = self._slots[path]
            kind = KIND_NAMES[self._columns.kinds[i]]
            leaf = self._made[path] = StoredLeaf(path, kind, slot.dtype, slot.shape, self._columns.checksum(i), None)
        return leaf

    def described(self) -> list[Stored]:
        """The leaves described so far: those with details (sharded leaves among them) and those asked for."""
        return list(self._made.values())

    def __setitem__(self, path: str, leaf: Stored) -> None:
        self._made[path] = leaf

    def __delitem__(self, path: str) -> None:
        raise TypeError("the leaves of a file cannot be removed")

    def __contains__(self, path: object) -> bool:
        i = self._index.get(path) if isinstance(path, str) else None
        return i is not None and self._columns.kinds[i] not in _NOT_STORED

    def __iter__(self) -> Iterator[str]:
        return (
            path for path, kind in zip(self._columns.paths, self._columns.kinds, strict=True) if kind not in _NOT_STORED
        )

    def __len__(self) -> int:
        return len(self._columns.kinds) - sum(map(self._columns.kinds.count, _NOT_STORED))
