"""A local orbax folder checked before orbax, and the C++ of tensorstore below it, read it: its links and metadata.

A link is followed only where it leads inside the folder, as in a folder of safetensors files: a folder made by a
stranger never reads a file elsewhere through one.

tensorstore parses a zarr array's ``.zarray`` (or ``zarr.json``) recursively, so a file of JSON nested deep enough
crashes the whole process (a segmentation fault) where Python would raise: every JSON file orbax or tensorstore reads
is parsed here first, and one that is not JSON, or nests past what a jaxstow file holds, is a
:class:`~jaxstow.errors.FormatError` naming it.

>>> import os, tempfile
>>> from jaxstow._read.orbax_files import check_folder
>>> folder = tempfile.mkdtemp()
>>> os.mkdir(os.path.join(folder, "w"))
>>> with open(os.path.join(folder, "w", ".zarray"), "w") as file:
...     _ = file.write("[" * 600 + "]" * 600)
>>> check_folder(folder)
Traceback (most recent call last):
...
jaxstow.errors.FormatError: /.../w/.zarray: nests 599 JSON levels deep; a jaxstow file holds at most 400
"""

from __future__ import annotations

import os

from jaxstow._format.json_codec import limits_problem, parse_json
from jaxstow.errors import FormatError, PathError

__all__ = ["check_folder"]

#: The files of an orbax folder that hold JSON: orbax's own and zarr's (versions 2 and 3).
_JSON_NAMES = frozenset((
    "_METADATA", "_CHECKPOINT_METADATA", "_sharding", ".zarray", ".zattrs", ".zgroup", ".zmetadata", "zarr.json",
))  # fmt: skip


def check_folder(folder: str) -> None:
    """Refuse a link under the local ``folder`` that leads out of it (a :class:`~jaxstow.errors.PathError`), and a JSON
    metadata file that is not JSON or nests too deep, before orbax reads them."""
    real_folder = os.path.realpath(folder)
    for root, folders, names in os.walk(folder):
        for name in folders + names:
            path = os.path.join(root, name)
            resolved = os.path.realpath(path)
            if os.path.islink(path) and os.path.commonpath([resolved, real_folder]) != real_folder:
                raise PathError(
                    f"is a link to {resolved}, outside the orbax folder {folder}: its files are read only within it; "
                    "copy the file into the folder if you trust it",
                    file=path,
                )
        for name in names:
            if name in _JSON_NAMES or os.path.basename(root) == "array_metadatas":
                path = os.path.join(root, name)
                if not os.path.isfile(path):  # a FIFO would block the read
                    raise FormatError("is not a regular file, where orbax keeps JSON metadata", file=path)
                with open(path, "rb") as file:
                    value = parse_json(file.read(), what="orbax's metadata", file=path)
                problem = limits_problem(value)
                if problem is not None:
                    raise FormatError(problem, file=path)
