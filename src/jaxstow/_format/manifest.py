"""The jaxstow manifest: its schema checked field by field (type, range, depth) before anything uses it, and its leaves.

A file that passes is safe to hand to the loaders: every leaf has a unique string path and a known kind, stored leaves
a known dtype, a valid shape and a well-formed checksum, PRNG keys an implementation this jax has. From version 3 on,
the leaves are columns (``paths``, ``kinds``, ``xxh3`` and ``details`` for the few leaves that need more than their
tensor says: docs/format.md, "Leaf columns"), checked as wholes, each detail as a version 2 entry is
(:func:`~jaxstow._format.leaves.check_entry`); a file read keeps its stored leaves by path as :class:`StoredLeaves`.

>>> import numpy as np
>>> from jaxstow._format.manifest import check_columns, check_manifest
>>> from jaxstow._format.manifest_written import columnar
>>> from jaxstow._format.tensor_reads import TensorSlot
>>> slots = {"w": TensorSlot.at("w", np.dtype(np.float32), (2, 3), 0)}
>>> manifest = {"format": "jaxstow", "version": 3, "structure": {"dict": [["w", "*"]]}, "metadata": None,
...             "leaves": [{"path": "w", "kind": "array", "xxh3": "d0a66a65c7528968"}]}
>>> stored = columnar(manifest)
>>> stored["paths"], stored["kinds"], check_columns(stored, slots, file="f.jxs").checksum(0)
(['w'], 'a', 'd0a66a65c7528968')
>>> check_manifest({**manifest, "version": "1.1"}, slots, file="f.jxs")
Traceback (most recent call last):
...
jaxstow.errors.FormatError: f.jxs: malformed format version '1.1' (expected a positive integer)
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Iterator, Mapping, MutableMapping
from types import MappingProxyType
from typing import Any

import numpy as np

from jaxstow._format.json_codec import limits_problem
from jaxstow._format.leaf_entries import check_entries
from jaxstow._format.leaves import StoredLeaf, check_entry, tensor_names
from jaxstow._format.shards import Stored
from jaxstow._format.tensor_reads import TensorSlot
from jaxstow.errors import CorruptFileError, FormatError, NewerFormatError, excerpt

__all__ = [
    "COLUMNAR_VERSION",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "KIND_NAMES",
    "PLAIN_METADATA_VERSION",
    "RESERVED_PREFIX",
    "ColumnMarks",
    "LeafColumns",
    "StoredLeaves",
    "check_columns",
    "check_leaves",
    "check_manifest",
    "plain_metadata",
    "container_paths",
    "columns_again",
    "version_at_least",
]

FORMAT_NAME = "jaxstow"
#: 2: a stored leaf's entry omits the dtype and shape its tensor holds exactly (version 1 always gave them).
#: 3: the leaves are columns (paths, kinds, checksums) with details only where a leaf needs them.
#: 4: a native file's ``__metadata__`` also holds the user's metadata whose values are strings, under their own keys.
FORMAT_VERSION = 4
#: The first version whose native header holds the user's string metadata beside the manifest.
PLAIN_METADATA_VERSION = 4
#: The user's metadata keys may not start with it: ``__metadata__`` holds jaxstow's own keys beside the user's.
RESERVED_PREFIX = "jaxstow"
_SURROGATE = re.compile("[\ud800-\udfff]")


def check_manifest(manifest: Any, slots: Mapping[str, TensorSlot], *, file: str) -> dict[str, Any]:
    """Check that ``manifest`` is a well-formed jaxstow manifest of a file holding the tensors ``slots``.

    ``slots`` are checked already. Returns the manifest with the dtype and shape of leaves stored as their tensors
    filled in; raises a :class:`FormatError` naming the field otherwise.
    """
    if not isinstance(manifest, dict):
        raise FormatError("the jaxstow manifest is not a JSON object", file=file)
    if manifest.get("format") != FORMAT_NAME:
        raise FormatError(f"the manifest's format is {excerpt(manifest.get('format'))}, not {FORMAT_NAME!r}", file=file)
    version = manifest.get("version")
    if type(version) is not int or version < 1:
        raise FormatError(f"malformed format version {excerpt(version)} (expected a positive integer)", file=file)
    if version > FORMAT_VERSION:
        raise NewerFormatError(
            f"cannot read: format {version} is newer than this jaxstow ({FORMAT_VERSION}); upgrade jaxstow", file=file
        )
    part = manifest.get("part")
    if part is not None and not (type(part) is int and part >= 1):
        raise FormatError(f"malformed part number {excerpt(part)} (expected a positive integer)", file=file)
    if "structure" not in manifest and part is None:  # a part of a sharded tree holds only shards
        raise FormatError("the manifest has no structure", file=file)
    if not isinstance(manifest.get("metadata"), dict | None):
        raise FormatError(
            f"the manifest's metadata must be a JSON object, not {excerpt(manifest['metadata'])}", file=file
        )
    problem = limits_problem(manifest.get("metadata"))
    if problem is not None:
        raise FormatError(f"the manifest's metadata {problem}", file=file)
    if version >= COLUMNAR_VERSION:  # the leaves are columns, checked by check_columns
        return manifest
    check_entries(manifest.get("leaves"), slots, file=file)
    return manifest


def check_leaves(
    manifest: Any, slots: Mapping[str, TensorSlot], *, plain: Mapping[str, str] | None, file: str
) -> tuple[LeafColumns | None, set[str]]:
    """A file's manifest checked whole against the file's tensors ``slots``: its columns (version 3 on, ``None``
    before) and the names of the tensors its leaves are stored in, which the caller compares with ``slots``.

    ``plain`` is a native header's own ``__metadata__`` beside the manifest (``None`` for an npz): exactly the user's
    string metadata, from version 4 on, or the header is corrupt.
    """
    if plain is not None:
        _check_plain_keys(manifest, plain, file=file)
    checked = check_manifest(manifest, slots, file=file)
    columns = None if checked["version"] < COLUMNAR_VERSION else check_columns(checked, slots, file=file)
    names = tensor_names(checked) if columns is None else columns.tensor_names()
    if len(distinct := set(names)) < len(names):  # one tensor's bytes given to two leaves or shards
        twice = next(name for name, count in Counter(names).items() if count > 1)
        raise CorruptFileError(f"two leaves or shards are stored in the tensor {excerpt(twice)}", file=file)
    return columns, distinct


def _check_plain_keys(manifest: Any, plain: Mapping[str, str], *, file: str) -> None:
    """Check that the keys beside jaxstow's own in a native header (``plain``) are exactly the user's string metadata.

    Only version 4 on writes them; a newer version is left to :func:`check_manifest`, which says it is newer.
    """
    version = manifest.get("version") if isinstance(manifest, dict) else None
    if version_at_least(version, FORMAT_VERSION + 1):
        return
    if plain and not version_at_least(version, PLAIN_METADATA_VERSION):
        raise CorruptFileError(
            f"the header's metadata keys {excerpt(sorted(plain))} are not jaxstow's: the header is corrupt", file=file
        )
    if version_at_least(version, PLAIN_METADATA_VERSION) and plain != plain_metadata(manifest.get("metadata")):
        raise CorruptFileError(
            "the header's plain metadata keys differ from the manifest's string metadata: the header is corrupt",
            file=file,
        )


def version_at_least(version: Any, least: int) -> bool:
    """Whether a manifest's ``version`` (anything, in a file not checked yet) is an integer of at least ``least``."""
    return type(version) is int and version >= least


def plain_metadata(metadata: Any) -> dict[str, str]:
    """The entries of the user's ``metadata`` that a native header holds as plain ``__metadata__`` keys.

    Those whose value is a string (both valid Unicode, as safetensors' parser requires).

    >>> from jaxstow._format.manifest import plain_metadata
    >>> plain_metadata({"model": "mlp", "epoch": 3, "odd": chr(0xD800)})
    {'model': 'mlp'}
    """
    if not isinstance(metadata, dict):
        return {}
    return {
        key: value
        for key, value in metadata.items()
        if isinstance(key, str) and isinstance(value, str) and _unicode(key) and _unicode(value)
    }


def _unicode(text: str) -> bool:
    return _SURROGATE.search(text) is None  # UTF-8 encodes every code point but these


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
_HEX_DIGITS = b"0123456789abcdef"
_INDEX = re.compile(r"0|[1-9][0-9]{0,17}")
_STORED_MARKS = bytes(int(chr(byte) in CHECKSUMMED) for byte in range(256))


class ColumnMarks:
    """What the paths and kinds of a manifest's columns give, which cannot change: shared by every reader of the
    same header.

    :attr:`stored` and :attr:`rank` are read-only arrays; :meth:`index` is made when a leaf is first asked for (a
    whole restore never asks).

    >>> marks = ColumnMarks(["a", "b", "c"], "ava")
    >>> marks.stored.tolist(), marks.rank.tolist(), marks.index()["c"]
    ([True, False, True], [0, 0, 1], 2)
    """

    def __init__(self, paths: list[str], kinds: str) -> None:
        self._paths = tuple(paths)
        #: Which leaves are stored as one tensor named by their path: their letters marked 1, the others 0.
        self.stored: np.ndarray = np.frombuffer(kinds.encode("ascii").translate(_STORED_MARKS), np.bool_)
        #: Each such leaf's place in the checksums.
        self.rank: np.ndarray = np.cumsum(self.stored) - 1
        self.rank.flags.writeable = False
        self._index: Mapping[str, int] | None = None

    def index(self) -> Mapping[str, int]:
        """Each path's place in the columns."""
        if self._index is None:  # two threads at once make equal ones
            self._index = MappingProxyType(dict(zip(self._paths, range(len(self._paths)), strict=True)))
        return self._index


class LeafColumns:
    """A checked version 3 manifest's leaves.

    The columns, and the detail of each leaf that has one as a version 2 entry (with its path and kind), checked.
    ``marks``: the :attr:`marks` of columns of the same paths and kinds, made before.
    """

    def __init__(
        self,
        paths: list[str],
        kinds: str,
        checksums: list[str],
        entries: dict[int, dict[str, Any]],
        marks: ColumnMarks | None = None,
        blocks: Mapping[str, object] = MappingProxyType({}),
    ) -> None:
        self.paths = paths
        self.kinds = kinds
        self.checksums = checksums
        self.entries = entries
        #: The block checksums of the stored leaves that have them, by leaf index (decimal), as the manifest gives
        #: them: :func:`~jaxstow._format.block_checksums.checked_blocks` checks one where it is used.
        self.blocks = blocks
        self.marks = ColumnMarks(paths, kinds) if marks is None else marks
        self.stored: np.ndarray = self.marks.stored
        self._rank: np.ndarray = self.marks.rank

    def checksum(self, index: int) -> str:
        """The checksum of the stored leaf at ``index``."""
        return self.checksums[int(self._rank[index])]

    def stored_paths(self) -> list[str]:
        return list(itertools.compress(self.paths, self.stored.tolist()))

    def tensor_names(self) -> list[str]:
        """The names of the tensors the leaves are stored in, once for each (a sharded leaf's shards each have one)."""
        sharded = [entry["shards"] for entry in self.entries.values() if entry["kind"] == "sharded"]
        return self.stored_paths() + [shard["tensor"] for shards in sharded for shard in shards]


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
        and not "".join(checksums).encode("utf-8", "surrogatepass").translate(None, _HEX_DIGITS)
    ):
        raise FormatError(
            f"the manifest's xxh3 must be 16 hex digits for each of its {stored} stored leaves", file=file
        )
    if len(set(paths)) != len(paths):
        seen: set[str] = set()
        twice = next(path for path in paths if path in seen or seen.add(path))  # type: ignore[func-returns-value]
        raise FormatError("the manifest lists this leaf twice", file=file, path=twice)
    structure = manifest.get("structure")  # None in the files of a step's other processes, which hold no tree
    named = None if structure is None else container_paths(structure)  # None: nodes whose children jax names
    if named is not None and named != paths and len(set(named)) == len(named):  # a key named twice: said later
        at = next((i for i, pair in enumerate(itertools.zip_longest(named, paths)) if pair[0] != pair[1]))
        shown = [excerpt(names[at]) if at < len(names) else "none" for names in (named, paths)]
        problem = (
            f"the structure names leaf {at} {shown[0]}, but the manifest's paths {shown[1]}: the header is damaged"
        )
        raise CorruptFileError(problem, file=file)
    if not isinstance(details, dict):
        raise FormatError("the manifest's details must be an object keyed by leaf index", file=file)
    if not isinstance(blocks := manifest.get("blocks", {}), dict):
        raise FormatError("the manifest's blocks must be an object keyed by leaf index", file=file)
    for where, key, detail in [*(("", *pair) for pair in details.items()), *(("blocks ", k, {}) for k in blocks)]:
        if not (_INDEX.fullmatch(key) and int(key) < len(paths) and isinstance(detail, dict)):
            raise FormatError(
                f"malformed detail {excerpt(where + key)} of the manifest (expected a leaf index)", file=file
            )
    if None in blocks.values():  # null would read as "no block checksums"
        raise FormatError("malformed block checksums null in the manifest's blocks", file=file)
    entries = (columns := columns_again(manifest, slots, file=file)).entries
    for letter, needs in (("v", "value"), ("k", "impl"), ("s", "shards"), ("p", "processes")):
        start = kinds.find(letter)
        while start >= 0:
            if start not in entries or needs not in entries[start]:
                raise FormatError(
                    f"a {KIND_NAMES[letter]} leaf needs its {needs} in the details", file=file, path=paths[start]
                )
            start = kinds.find(letter, start + 1)
    start = kinds.find("s")
    while start >= 0:  # versions 1 and 2 had shards without checksums: from 3 on, every shard is verified
        if any(not isinstance(shard, dict) or "xxh3" not in shard for shard in entries[start]["shards"]):
            raise CorruptFileError("a shard of this leaf has no checksum (xxh3)", file=file, path=paths[start])
        start = kinds.find("s", start + 1)
    start = kinds.find("n")
    while start >= 0:
        if start not in entries and paths[start] in slots and slots[paths[start]].shape:
            shape = list(slots[paths[start]].shape)
            raise FormatError(f"a numpy scalar has shape [], not {shape}", file=file, path=paths[start])
        start = kinds.find("n", start + 1)
    return columns


def columns_again(
    manifest: dict[str, Any], slots: Mapping[str, TensorSlot], *, file: str, marks: ColumnMarks | None = None
) -> LeafColumns:
    """The columns of a version 3 manifest whose columns are checked (by :func:`check_columns`, now or on the same
    text parsed before, which gave ``marks``), each detail's entry made, completed and checked by
    :func:`~jaxstow._format.leaves.check_entry`."""
    paths, kinds, blocks = manifest["paths"], manifest["kinds"], manifest.get("blocks", {})
    columns = LeafColumns(paths, kinds, manifest["xxh3"], {}, marks, blocks)
    for key, detail in manifest["details"].items():
        index = int(key)
        entry = {**detail, "path": paths[index], "kind": KIND_NAMES[kinds[index]]}
        if kinds[index] in CHECKSUMMED:
            entry["xxh3"] = columns.checksum(index)
            entry["blocks"] = blocks.get(key)
        if kinds[index] != "v":  # a value's one rule, that its detail holds it, is check_columns'
            check_entry(entry, index, slots, file=file)
        columns.entries[index] = entry
    return columns


#: The kinds of leaf kept apart from the stored ones: values and per-process leaves.
_NOT_STORED = "vp"


class StoredLeaves(MutableMapping[str, Stored]):
    """The stored leaves of a version 3 file by path.

    Those with details are made (and checked) when the file is opened, the others, stored exactly as their tensors, when
    first asked for.

    >>> import io, numpy as np, jaxstow
    >>> saved = io.BytesIO(); jaxstow.save(saved, {"w": np.arange(3.0), "b": np.ones(2), "n": 2}); _ = saved.seek(0)
    >>> leaves = jaxstow.open(saved).stored
    >>> list(leaves), leaves.described(), leaves["w"].shape, [leaf.path for leaf in leaves.described()]
    (['b', 'w'], [], (3,), ['w'])
    """

    def __init__(self, columns: LeafColumns, slots: Mapping[str, TensorSlot], made: dict[str, Stored]) -> None:
        self._columns = columns
        self._slots = slots
        self._made = made

    def __getitem__(self, path: str) -> Stored:
        leaf = self._made.get(path)
        if leaf is None:
            i = self._columns.marks.index()[path]
            if not self._columns.stored[i] or self._columns.kinds[i] == "p":
                raise KeyError(path)
            slot = self._slots[path]
            kind = KIND_NAMES[self._columns.kinds[i]]
            checksum, blocks = self._columns.checksum(i), self._columns.blocks.get(str(i))
            leaf = self._made[path] = StoredLeaf(path, kind, slot.dtype, slot.shape, checksum, None, blocks=blocks)
        return leaf

    def described(self) -> list[Stored]:
        """The leaves described so far: those with details (sharded leaves among them) and those asked for."""
        return list(self._made.values())

    def __setitem__(self, path: str, leaf: Stored) -> None:
        self._made[path] = leaf

    def __delitem__(self, path: str) -> None:
        raise TypeError("the leaves of a file cannot be removed")

    def __contains__(self, path: object) -> bool:
        i = self._columns.marks.index().get(path) if isinstance(path, str) else None
        return i is not None and self._columns.kinds[i] not in _NOT_STORED

    def __iter__(self) -> Iterator[str]:
        return (
            path for path, kind in zip(self._columns.paths, self._columns.kinds, strict=True) if kind not in _NOT_STORED
        )

    def __len__(self) -> int:
        return len(self._columns.kinds) - sum(map(self._columns.kinds.count, _NOT_STORED))


def container_paths(structure: Any) -> list[str] | None:
    """The leaf paths of an encoded structure of dicts with plain keys, lists, tuples and ``None`` (as
    :func:`~jaxstow._format.keypaths.path_to_str` writes them); ``None`` for one with other nodes, which jax names.

    >>> container_paths({"dict": [["a", {"list": ["*", None, {"dict": [["b", "*"]]}]}], ["c", "*"]]})
    ['a/0', 'a/2/b', 'c']
    """
    paths: list[str] = []
    return paths if _collect_paths(structure, None, paths) else None


def _collect_paths(node: Any, path: str | None, paths: list[str]) -> bool:
    """Append the leaf paths under ``node`` (at ``path``; ``None``: the root, apart from an empty key's ``/c``) to
    ``paths``; ``False`` for a node that is not a container :func:`container_paths` can name."""
    if node == "*":
        paths.append(path or "")
        return True
    if node is None:
        return True
    if not isinstance(node, dict) or len(node) != 1:
        return False
    [(tag, children)] = node.items()
    if not isinstance(children, list):  # malformed: the structure's decoder names it
        return False
    if tag == "dict" and any(
        type(pair) is not list or len(pair) != 2 or isinstance(pair[0], dict) for pair in children
    ):
        return False  # keys tagged as floats, tuples, ...
    if tag not in ("dict", "list", "tuple"):
        return False
    named = children if tag == "dict" else enumerate(children)
    prefix = "" if path is None else f"{path}/"
    for name, child in named:
        if child == "*":  # most children are leaves: answered here, without a call
            paths.append(f"{prefix}{name}")
        elif not _collect_paths(child, f"{prefix}{name}", paths):
            return False
    return True
