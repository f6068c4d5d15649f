"""``jaxstow inspect FILE|FOLDER``: the tree of a file as a table (path, dtype, shape, size), its totals and metadata.

Only the header is read, so inspecting a large file is instant. A Hugging Face folder of safetensors files shows its
tensors with the shard that holds each, from the shards' headers.

>>> import os, tempfile, jax.numpy as jnp, jaxstow
>>> from jaxstow.cli import main
>>> path = os.path.join(tempfile.mkdtemp(), "model.jxs")
>>> jaxstow.save(path, {"w": jnp.ones((2, 3)), "b": jnp.zeros(3), "depth": 2}, metadata={"epoch": 3})
>>> main(["inspect", path])
/.../model.jxs: jaxstow (format 4), 4.13 kB
structure: dict
path   dtype    shape   size  value
b      float32  (3,)    12 B
depth  int                    2
w      float32  (2, 3)  24 B
3 leaves: 2 arrays (36 B), 1 value
metadata: {"epoch": 3}
0
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from jaxstow._format.dtypes import name_of_dtype
from jaxstow._format.kinds import KINDS
from jaxstow._format.npz import NpzReader
from jaxstow._read.reader import FolderReader, Reader
from jaxstow._util.progress import format_bytes
from jaxstow.cli.files import Leaf, describe, file_size, hf_listing, open_file, open_hf_folder
from jaxstow.cli.output import Table, print_json, printable

__all__ = ["HELP", "HF_FOLDER", "arguments", "folder_summary", "run", "summary"]

#: What ``inspect`` and ``ls`` call a Hugging Face folder of safetensors files.
HF_FOLDER = "Hugging Face safetensors folder"


#: The line of ``jaxstow --help`` that names this command.
HELP = "the tree of a file: path, dtype, shape and size of every leaf, totals, metadata"


def arguments(parser: argparse.ArgumentParser) -> None:
    """Show the tree of a jaxstow, safetensors or npz file from its header: every leaf's path, dtype, shape and size
    (values such as hyperparameters with their value), the totals and the user's metadata; or the tensors of a Hugging
    Face folder of safetensors files, with the shard that holds each. A file or folder of another library (PyTorch,
    pickle, equinox, flax, orbax) is named, with what reads it."""
    parser.add_argument(
        "file",
        metavar="FILE|FOLDER",
        help="a jaxstow, safetensors or npz file, or a Hugging Face folder of safetensors files (a path or an fsspec "
        "URL)",
    )
    parser.add_argument("--json", action="store_true", help="print the same as JSON, for scripts")


def run(args: argparse.Namespace) -> int:
    if hf_listing(args.file) is not None:
        with open_hf_folder(args.file) as folder:
            report = folder_summary(folder)
        if args.json:
            print_json(report)
        else:
            _show_folder(report)
        return 0
    with open_file(args.file) as container:
        report = summary(container)
    if args.json:
        print_json(report)
        return 0
    version = f" (format {report['version']})" if report["version"] is not None else ""
    print(f"{printable(report['file'])}: {report['format']}{version}, {format_bytes(report['file_bytes'])}")
    if report["structure"] is not None:
        print(f"structure: {printable(str(report['structure']))}")
    leaves = report["leaves"]
    has_values = any(leaf["kind"] == "value" for leaf in leaves)
    columns = ["path", "dtype", "shape", "size", *(["value"] if has_values else [])]
    table = Table(columns, right=["size"])
    for leaf in leaves:
        stored = leaf["kind"] != "value"
        cells = [
            leaf["path"] or "(root)",
            leaf["dtype"] if leaf["kind"] in ("array", "value") else f"{leaf['dtype']} ({leaf['kind']})",
            str(tuple(leaf["shape"])) if stored else "",
            format_bytes(leaf["nbytes"]) if stored else "",
        ]
        table.add(*cells, *([value_text(leaf.get("value")) if not stored else ""] if has_values else []))
    table.show()
    arrays = sum(leaf["kind"] != "value" for leaf in leaves)
    values = len(leaves) - arrays
    counts = f"{_plural(arrays, 'array')} ({format_bytes(report['array_bytes'])})"
    print(f"{_plural(len(leaves), 'leaf', 'leaves')}: {counts}" + (f", {_plural(values, 'value')}" if values else ""))
    if report["metadata"] is not None:
        print(f"metadata: {json.dumps(report['metadata'])}")
    return 0


def summary(container: Reader) -> dict[str, Any]:
    """What ``inspect`` shows, as a JSON-able dict."""
    leaves = describe(container)
    manifest = container.container.manifest
    container_name = "npz" if isinstance(container.container, NpzReader) else "safetensors"
    kind = {"npz": "jaxstow-npz", "safetensors": "jaxstow"}[container_name] if manifest is not None else container_name
    return {
        "file": container.file,
        "format": KINDS[kind].label,
        "container": container_name,
        "version": None if manifest is None else manifest.get("version"),
        "file_bytes": file_size(container),
        "structure": None if manifest is None else structure_root(manifest.get("structure")),
        "leaves": [_leaf_json(leaf) for leaf in leaves],
        "array_bytes": sum(leaf.nbytes for leaf in leaves),
        "metadata": container.metadata,
    }


def folder_summary(folder: FolderReader) -> dict[str, Any]:
    """What ``inspect`` shows of a Hugging Face folder, as a JSON-able dict: its index, shards and tensors."""
    leaves = [
        {
            "path": path,
            "shard": os.path.basename(folder.shard_of(path)),
            "kind": "array",
            "dtype": name_of_dtype(leaf.dtype) or str(leaf.dtype),
            "shape": list(leaf.shape),
            "nbytes": leaf.nbytes,
        }
        for path, leaf in folder.stored.items()
    ]
    return {
        "file": folder.file,
        "format": HF_FOLDER,
        "index": folder.index,
        "shards": [os.path.basename(container.file) for container in folder.containers],
        "file_bytes": file_size(folder),
        "leaves": leaves,
        "array_bytes": sum(leaf["nbytes"] for leaf in leaves),
        "metadata": folder.metadata,
    }


def _show_folder(report: dict[str, Any]) -> None:
    shards = len(report["shards"])
    index = f", index {printable(report['index'])}" if report["index"] else ", no index"
    size = format_bytes(report["file_bytes"])
    print(f"{printable(report['file'])}: {HF_FOLDER}, {_plural(shards, 'shard')}{index}, {size}")
    table = Table(["path", "shard", "dtype", "shape", "size"], right=["size"])
    for leaf in report["leaves"]:
        table.add(leaf["path"], leaf["shard"], leaf["dtype"], str(tuple(leaf["shape"])), format_bytes(leaf["nbytes"]))
    table.show()
    tensors = _plural(len(report["leaves"]), "tensor")
    print(f"{tensors} ({format_bytes(report['array_bytes'])}) in {_plural(shards, 'shard')}")
    if report["metadata"] is not None:
        print(f"metadata: {json.dumps(report['metadata'])}")


def _leaf_json(leaf: Leaf) -> dict[str, Any]:
    out: dict[str, Any] = {"path": leaf.path, "kind": leaf.kind, "dtype": leaf.dtype}
    if leaf.stored:
        out.update(shape=list(leaf.shape or ()), nbytes=leaf.nbytes, xxh3=leaf.checksum)
    else:
        out.update(value=leaf.value, nbytes=0)
    return out


def structure_root(structure: Any) -> str:
    """The type at the root of a manifest's structure: ``dict``, ``list``, or a node type's name.

    >>> from jaxstow.cli.inspect import structure_root
    >>> structure_root({"node": "equinox.nn.MLP", "aux": None, "children": []}), structure_root("*")
    ('equinox.nn.MLP', 'a single leaf')
    """
    if structure == "*":
        return "a single leaf"
    if structure is None:
        return "None"
    if isinstance(structure, dict) and structure:
        node = structure.get("node")
        return node if isinstance(node, str) else str(next(iter(structure)))
    return type(structure).__name__


def value_text(value: Any, width: int = 60) -> str:
    """A value leaf's tagged JSON as short text: ``2``, ``0.5``, ``jax.nn.relu``, ``'tanh'``.

    >>> from jaxstow.cli.inspect import value_text
    >>> value_text({"float": "0.5"}), value_text({"ref": "jax.nn.relu"}), value_text("tanh"), value_text(None)
    ('0.5', 'jax.nn.relu', "'tanh'", 'None')
    """
    if isinstance(value, str):
        text = repr(value)
    elif value is None or isinstance(value, bool | int):
        text = str(value)
    elif isinstance(value, dict) and len(value) == 1 and next(iter(value)) in ("float", "ref", "dtype"):
        text = str(next(iter(value.values())))
    else:
        text = json.dumps(value, separators=(",", ":"))
    return text if len(text) <= width else text[: width - 3] + "..."


def _plural(count: int, word: str, words: str | None = None) -> str:
    return f"{count} {word if count == 1 else words or word + 's'}"
