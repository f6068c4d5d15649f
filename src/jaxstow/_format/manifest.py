"""The jaxstow manifest's schema, checked field by field (type, range, depth) before anything uses it.

A file that passes is safe to hand to the loaders: every leaf entry has a unique string path and a known kind,
stored leaves a known dtype, a valid shape and a well-formed checksum, PRNG keys an implementation this jax has.
Checking fills in a stored leaf's dtype and shape from its tensor where the entry leaves them out (docs/format.md).

>>> import numpy as np
>>> from jaxstow._format.manifest import check_manifest
>>> from jaxstow._format.tensor_reads import TensorSlot
>>> slots = {"w": TensorSlot.at("w", np.dtype(np.float32), (2, 3), 0)}
>>> manifest = {"format": "jaxstow", "version": 2, "structure": {"dict": [["w", "*"]]}, "metadata": None,
...             "leaves": [{"path": "w", "kind": "array", "xxh3": "d0a66a65c7528968"}]}
>>> check_manifest(manifest, slots, file="f.jxs")["leaves"]
[{'path': 'w', 'kind': 'array', 'xxh3': 'd0a66a65c7528968', 'dtype': 'float32', 'shape': [2, 3]}]
>>> check_manifest({**manifest, "version": "1.1"}, slots, file="f.jxs")
Traceback (most recent call last):
...
jaxstow.errors.FormatError: f.jxs: malformed format version '1.1' (expected a positive integer)
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from jaxstow._format.dtypes import checked_shape, dtype_from_name, name_of_dtype
from jaxstow._format.json_values import json_problem
from jaxstow._format.per_process import check_per_process_entry
from jaxstow._format.tensor_reads import TensorSlot
from jaxstow.errors import FormatError, NewerFormatError, excerpt

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MAX_INTEGER_DIGITS",
    "MAX_NESTING",
    "PLAIN_METADATA_VERSION",
    "RESERVED_PREFIX",
    "check_manifest",
    "check_nesting",
    "metadata_problem",
    "plain_metadata",
    "tensor_names",
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
#: The most JSON levels around any part of a manifest's structure or of a value: a save refuses deeper trees, a load
#: refuses deeper files before its decoders recurse that far.
MAX_NESTING = 400
#: The most decimal digits of an integer anywhere in a manifest (a value, the metadata): Python's default bound on
#: converting integers to and from text, fixed here so that a save refuses what a load of any jaxstow would refuse.
MAX_INTEGER_DIGITS = 4300
_INTEGER_BOUND = 10**MAX_INTEGER_DIGITS

_STORED_KINDS = frozenset({"array", "npscalar", "key", "torch"})
_ARRAY_KINDS = _STORED_KINDS | {"sharded"}
_CHECKSUM = re.compile(r"[0-9a-f]{16}")
_IMPL_NAME = re.compile(r"[A-Za-z0-9_]{1,64}")
#: The tags by which jax before 0.4.36 printed its PRNG implementations, as files saved with it name them.
_IMPL_TAGS = {"fry": "threefry2x32", "urbg": "unsafe_rbg"}


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
    problem = _limits_problem(manifest.get("metadata"))
    if problem is not None:
        raise FormatError(f"the manifest's metadata {problem}", file=file)
    if version >= 3:  # the leaves are columns, checked by jaxstow._format.columns
        return manifest
    leaves = manifest.get("leaves")
    if not isinstance(leaves, list):
        raise FormatError("the manifest has no list of leaves", file=file)
    seen: set[str] = set()
    for index, entry in enumerate(leaves):
        _check_entry(entry, index, slots, file=file)
        if entry["path"] in seen:
            raise FormatError("the manifest lists this leaf twice", file=file, path=entry["path"])
        seen.add(entry["path"])
    return manifest


def version_at_least(version: Any, least: int) -> bool:
    """Whether a manifest's ``version`` (anything, in a file not checked yet) is an integer of at least ``least``."""
    return type(version) is int and version >= least


def metadata_problem(metadata: Any) -> str | None:
    """What keeps ``metadata`` from being saved with a file, or ``None``.

    It must be a dict of strict JSON (see :func:`~jaxstow._format.json_values.json_problem`) within the limits of
    :func:`check_nesting`, whose keys do not start with :data:`RESERVED_PREFIX`.

    >>> from jaxstow._format.manifest import metadata_problem
    >>> metadata_problem({"epoch": 3, "run": "a"}) is None
    True
    >>> metadata_problem({"jaxstow_header_xxh3": "0"})
    "key 'jaxstow_header_xxh3' starts with 'jaxstow', which the file's own keys use: rename it"
    """
    if not isinstance(metadata, dict):
        return f"a dict, not {type(metadata).__name__}"
    reserved = next((key for key in metadata if isinstance(key, str) and key.startswith(RESERVED_PREFIX)), None)
    if reserved is not None:
        return f"key {excerpt(reserved)} starts with {RESERVED_PREFIX!r}, which the file's own keys use: rename it"
    limits = _limits_problem(metadata)
    return json_problem(metadata) if limits is None else f"it {limits}"


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
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_nesting(manifest: dict[str, Any], *, file: str | None = None) -> None:
    """Refuse, before anything is written, a manifest that a load would refuse for its size.

    That is a structure, value or metadata nesting deeper than :data:`MAX_NESTING` JSON levels, or holding an integer
    of more than :data:`MAX_INTEGER_DIGITS` digits.

    >>> from jaxstow._format.manifest import check_nesting
    >>> check_nesting({"structure": "*", "metadata": {"n": 10**5000}}, file="f.jxs")
    Traceback (most recent call last):
    ...
    jaxstow.errors.FormatError: f.jxs: the metadata holds an integer of more than 4300 digits; a jaxstow file holds at most 4300
    """
    parts: list[tuple[str | None, str, Any]] = [("", "the structure", manifest.get("structure"))]
    values = [entry for entry in manifest.get("leaves", ()) if entry.get("kind") == "value"]
    parts += [(entry["path"], "the value", entry.get("value")) for entry in values]
    details, paths = manifest.get("details", {}), manifest.get("paths", [])  # a version 3 manifest read from a file
    parts += [
        (paths[int(index)], "the value", detail["value"]) for index, detail in details.items() if "value" in detail
    ]
    parts.append((None, "the metadata", manifest.get("metadata")))
    for path, what, part in parts:
        problem = _limits_problem(part)
        if problem is not None:
            raise FormatError(f"{what} {problem}", file=file, path=path)


def _limits_problem(value: Any) -> str | None:
    """How a JSON value breaks the limits of :func:`check_nesting`, or ``None``."""
    depth, huge = _nesting(value)
    if depth > MAX_NESTING:
        return f"nests {depth} JSON levels deep; a jaxstow file holds at most {MAX_NESTING}"
    if huge:
        return f"holds an integer of more than {MAX_INTEGER_DIGITS} digits; a jaxstow file holds at most {MAX_INTEGER_DIGITS}"
    return None


def _nesting(value: Any) -> tuple[int, bool]:
    """The most JSON containers around any part of ``value``, and whether it holds too long an integer.

    An empty container holds no part. Counted level by level; an integer is too long beyond :data:`MAX_INTEGER_DIGITS`
    digits.
    """
    deepest, level, huge = 0, [value], False
    while level:
        inner: list[Any] = []
        for node in level:
            if type(node) is str:  # most parts of a structure are its leaves, "*"
                continue
            if isinstance(node, dict):
                inner.extend(node.values())
            elif isinstance(node, list | tuple):  # metadata may hold tuples, saved as lists
                inner.extend(node)
            elif type(node) is int and not -_INTEGER_BOUND < node < _INTEGER_BOUND:
                huge = True
        deepest += bool(inner)
        level = inner
    return deepest, huge


def _check_entry(entry: Any, index: int, slots: Mapping[str, TensorSlot], *, file: str) -> None:
    if not (isinstance(entry, dict) and isinstance(entry.get("path"), str)):
        raise FormatError(f"manifest entry {index} is not an object with a string path", file=file)
    path, kind = entry["path"], entry.get("kind")
    if kind == "value":
        if "value" not in entry:
            raise FormatError("a value entry has no value", file=file, path=path)
        return
    if kind == "per_process":
        check_per_process_entry(entry, slots.get(path), file=file)
        _check_checksum(entry.get("xxh3"), file=file, path=path)
        return
    if not isinstance(kind, str) or kind not in _ARRAY_KINDS:
        raise FormatError(f"unknown leaf kind {excerpt(kind)}", file=file, path=path)
    if "dtype" in entry or "shape" in entry or kind == "sharded":
        dtype = dtype_from_name(entry["dtype"]) if isinstance(entry.get("dtype"), str) else None
        if dtype is None:
            raise FormatError(f"unknown dtype {excerpt(entry.get('dtype'))}", file=file, path=path)
        shape = entry.get("shape")
        shape = checked_shape(shape, dtype, file=file, path=path)
    else:
        dtype, shape = _as_its_tensor(entry, slots.get(path), file=file)
    _check_checksum(entry.get("xxh3"), file=file, path=path)
    if kind == "sharded":
        _check_shards(entry.get("shards"), file=file, path=path)
    if kind == "npscalar" and shape:
        raise FormatError(f"a numpy scalar has shape [], not {shape}", file=file, path=path)
    if kind == "key":
        impl = entry.get("impl")
        if isinstance(impl, str):
            entry["impl"] = impl = _IMPL_TAGS.get(impl, impl)
        _check_key(impl, dtype, shape, file=file, path=path)


def _check_checksum(checksum: Any, *, file: str, path: str) -> None:
    if checksum is not None and not (isinstance(checksum, str) and _CHECKSUM.fullmatch(checksum)):
        raise FormatError(f"malformed checksum {excerpt(checksum)} (expected 16 hex digits)", file=file, path=path)


def _as_its_tensor(entry: dict[str, Any], slot: TensorSlot | None, *, file: str) -> tuple[np.dtype, list[int]]:
    """The dtype and shape of a leaf stored exactly as its tensor, written into its entry."""
    if slot is None:
        raise FormatError(
            "the manifest lists this leaf but the file holds no tensor for it", file=file, path=entry["path"]
        )
    name = name_of_dtype(slot.dtype)
    if name is None:
        raise FormatError(f"the tensor's dtype {slot.dtype} is not one jaxstow stores", file=file, path=entry["path"])
    entry["dtype"], entry["shape"] = name, list(slot.shape)
    return slot.dtype, entry["shape"]


def _check_shards(shards: Any, *, file: str, path: str) -> None:
    """The shards' tensor names and checksums (their boxes are checked against the shape where they are read)."""
    if not isinstance(shards, list):
        raise FormatError("a sharded leaf needs its list of shards", file=file, path=path)
    for shard in shards:
        checksum = shard.get("xxh3") if isinstance(shard, dict) else None
        if not (isinstance(shard, dict) and isinstance(shard.get("tensor"), str)) or not (
            checksum is None or (isinstance(checksum, str) and _CHECKSUM.fullmatch(checksum))
        ):
            raise FormatError(f"malformed shard {excerpt(shard)}", file=file, path=path)


def tensor_names(manifest: dict[str, Any]) -> set[str]:
    """The names of the tensors a checked manifest's leaves are stored in (a sharded leaf's shards each have one)."""
    names: set[str] = set()
    for entry in manifest["leaves"]:
        if entry["kind"] == "sharded":
            names.update(shard["tensor"] for shard in entry["shards"])
        elif entry["kind"] != "value":
            names.add(entry["path"])
    return names


def _check_key(impl: Any, dtype: np.dtype, shape: list[int], *, file: str, path: str) -> None:
    key_shape = _key_data_shape(impl) if isinstance(impl, str) and _IMPL_NAME.fullmatch(impl) else None
    if key_shape is None:
        raise FormatError(f"unknown PRNG key implementation {excerpt(impl)}", file=file, path=path)
    if dtype != np.uint32 or tuple(shape[len(shape) - len(key_shape) :]) != key_shape or len(shape) < len(key_shape):
        raise FormatError(
            f"{impl} keys are stored as uint32[..., {', '.join(map(str, key_shape))}], not {dtype}{shape}",
            file=file,
            path=path,
        )


@functools.lru_cache(maxsize=16)
def _key_data_shape(impl: str) -> tuple[int, ...] | None:
    """The trailing shape of one key's data for a PRNG implementation jax knows, or ``None``."""
    try:
        return tuple(jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0, impl=impl))).shape)
    except (TypeError, ValueError, KeyError):
        return None
