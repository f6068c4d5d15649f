"""The manifest as a file is written with it: every part checked against the limits a file holds before a byte is
written, and its leaves turned into the columns a file of version 3 or later holds.

A manifest being built keeps its leaves as entries (``leaves``); :func:`columnar` writes them as columns
(docs/format.md, "Leaf columns"), which :mod:`jaxstow._format.manifest` checks when the file is read.

>>> columnar({"format": "jaxstow", "version": 4, "leaves": [{"path": "w", "kind": "array", "xxh3": "0" * 16}]})
{'format': 'jaxstow', 'version': 4, 'paths': ['w'], 'kinds': 'a', 'xxh3': ['0000000000000000'], 'details': {}}
"""

from __future__ import annotations

from typing import Any

from jaxstow._format.json_codec import limits_problem
from jaxstow._format.json_values import json_problem
from jaxstow._format.manifest import CHECKSUMMED, COLUMNAR_VERSION, KIND_LETTERS, RESERVED_PREFIX
from jaxstow.errors import FormatError, excerpt

__all__ = ["check_nesting", "columnar", "metadata_problem"]

#: The members of a leaf's entry that its columns hold, not its details.
_COLUMNS = ("path", "kind", "xxh3", "blocks")


def metadata_problem(metadata: Any) -> str | None:
    """What keeps ``metadata`` from being saved with a file, or ``None``.

    It must be a dict of strict JSON (see :func:`~jaxstow._format.json_values.json_problem`) within the limits of
    :func:`check_nesting`, whose keys do not start with :data:`RESERVED_PREFIX`.

    >>> from jaxstow._format.manifest_written import metadata_problem
    >>> metadata_problem({"jaxstow_header_xxh3": "0"})
    "key 'jaxstow_header_xxh3' starts with 'jaxstow', which the file's own keys use: rename it"
    """
    if not isinstance(metadata, dict):
        return f"a dict, not {type(metadata).__name__}"
    reserved = next((key for key in metadata if isinstance(key, str) and key.startswith(RESERVED_PREFIX)), None)
    if reserved is not None:
        return f"key {excerpt(reserved)} starts with {RESERVED_PREFIX!r}, which the file's own keys use: rename it"
    limits = limits_problem(metadata)
    return json_problem(metadata) if limits is None else f"it {limits}"


def check_nesting(manifest: dict[str, Any], *, file: str | None = None) -> None:
    """Refuse, before anything is written, a manifest that a load would refuse for its size.

    That is a structure, value or metadata breaking :func:`~jaxstow._format.json_codec.limits_problem`'s limits:
    nesting too deep, or holding too long an integer.

    >>> from jaxstow._format.manifest_written import check_nesting
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
        problem = limits_problem(part)
        if problem is not None:
            raise FormatError(f"{what} {problem}", file=file, path=path)


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
        str(i): {key: value for key, value in entry.items() if key not in _COLUMNS}
        for i, (entry, kind) in enumerate(zip(leaves, kinds, strict=True))
        if len(entry) > 2 + (kind in CHECKSUMMED) + ("blocks" in entry)
    }
    blocks = {str(i): entry["blocks"] for i, entry in enumerate(leaves) if "blocks" in entry}
    if blocks:
        out["blocks"] = blocks
    return out
