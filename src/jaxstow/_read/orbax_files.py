"""A local orbax folder checked before orbax, and the C++ of tensorstore below it, read it: its links and metadata.

A link is refused: out of the folder it would read a file elsewhere, within it (orbax writes none) an array as another.

tensorstore parses a zarr array's ``.zarray`` (or ``zarr.json``) recursively, so a file of JSON nested deep enough
crashes the whole process (a segmentation fault) where Python would raise: every JSON file orbax or tensorstore reads
is parsed here first, and one that is not JSON, or nests past what a jaxstow file holds, is a
:class:`~jaxstow.errors.FormatError` naming it: the files of the folder, and the keys of the OCDBT databases in it
(``manifest.ocdbt``: orbax's default, which keeps each array's ``.zarray`` as a key), read through tensorstore's
key-value store, which parses nothing.

What the metadata claims is checked then too (:mod:`~jaxstow._read.orbax_metadata`): orbax reads a leaf without
OCDBT from the folder its name in ``_METADATA`` gives (its keys joined by ``.``), so a name that is absolute or climbs
out with ``..`` is refused, as a link out of the folder is, before orbax reads there.

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
import stat

from jaxstow._format.json_codec import limits_problem, parse_json
from jaxstow._read.orbax_metadata import check_metadata
from jaxstow._storage.failures import storage_error
from jaxstow.errors import FormatError, PathError

__all__ = ["check_folder", "read_json_file"]

#: The files of an orbax folder that hold JSON: orbax's own and zarr's (versions 2 and 3).
_JSON_NAMES = frozenset((
    "_METADATA", "_CHECKPOINT_METADATA", "_sharding", "_strings.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata",
    "zarr.json",
))  # fmt: skip


def check_folder(folder: str) -> None:
    """Refuse a link under the local ``folder`` that leads out of it (a :class:`~jaxstow.errors.PathError`), and a file
    that is no regular file (a FIFO, a socket, a device, a link that leads nowhere), a JSON metadata file that is not
    JSON, nests too deep or claims what orbax would act on wrongly (:func:`~jaxstow._read.orbax_metadata.check_metadata`),
    and a folder where orbax keeps such a file (a :class:`~jaxstow.errors.FormatError`), before orbax reads them."""
    real_folder = os.path.realpath(folder)
    walked = list(os.walk(folder))
    for root, folders, names in walked:  # every file before any is read: the database's files are in d/
        for name in folders + names:
            path = os.path.join(root, name)
            resolved = os.path.realpath(path)
            if os.path.islink(path) and os.path.commonpath([resolved, real_folder]) != real_folder:
                raise PathError(
                    f"is a link to {resolved}, outside the orbax folder {folder}: its files are read only within it; "
                    "copy the file into the folder if you trust it",
                    file=path,
                )
            if os.path.islink(path) and os.path.exists(resolved):  # orbax writes none: one inside would read an
                # array's bytes as another's (one to nothing is named as such below)
                raise PathError(
                    f"is a link to {resolved}, another place in the orbax folder {folder}, where orbax writes no "
                    "links: it would read one array's data as another's; put a copy there if you trust it",
                    file=path,
                )
            if name in _JSON_NAMES and os.path.isdir(path):
                raise FormatError("is a folder, where orbax keeps a JSON file: do not use this checkpoint", file=path)
        for name in names:
            _check_regular(os.path.join(root, name))
    for root, _, names in walked:
        for name in names:
            if name in _JSON_NAMES or os.path.basename(root) == "array_metadatas":
                path = os.path.join(root, name)
                check_metadata(name, _check_json(read_json_file(path), path), path)
        if "manifest.ocdbt" in names:
            _check_database(root)


#: What each kind of file that is neither a regular file nor a folder is called.
_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"))


def _check_regular(path: str) -> None:
    """Refuse a file of the folder that is not a regular file (a FIFO or a device, whose read waits forever or never
    ends) or a link that leads nowhere, before tensorstore opens it: a :class:`~jaxstow.errors.FormatError`."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise FormatError(
            f"is a link to {os.readlink(path)}, which does not exist: orbax keeps its files in the checkpoint's "
            "folder; copy the file it should lead to there",
            file=path,
        ) from None
    except OSError as error:
        raise storage_error(error, path, doing="look at it") from error
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "a block device")
        raise FormatError(
            f"is {kind}, where orbax keeps regular files (a read of it could wait forever): the folder was not "
            "written by orbax, or was changed since; do not use it",
            file=path,
        )


#: The bytes a JSON metadata file of an orbax folder may take (orbax's are a few kB a leaf).
_MAX_METADATA_BYTES = 64 << 20


def read_json_file(path: str) -> bytes:
    """The bytes of the JSON file at ``path`` that orbax wrote (its metadata, a JSON item); a
    :class:`~jaxstow.errors.FormatError` naming it if it is no regular file (reading a FIFO would wait forever) or
    holds more than orbax's metadata may take."""
    if not os.path.isfile(path):
        raise FormatError("is not a regular file, where orbax keeps JSON", file=path)
    try:
        with open(path, "rb") as file:
            data = file.read(_MAX_METADATA_BYTES + 1)
    except OSError as error:
        raise storage_error(error, path, doing="read it") from error
    return _within_limit(data, path)


def _within_limit(data: bytes, path: str) -> bytes:
    """``data``, orbax's JSON at ``path`` (read to one byte past the limit), unless it is over the limit."""
    if len(data) > _MAX_METADATA_BYTES:
        raise FormatError(f"is more than the {_MAX_METADATA_BYTES} bytes orbax's metadata may take", file=path)
    return data


def _check_json(data: bytes, path: str) -> object:
    """orbax's JSON metadata ``data`` at ``path`` (a file's read to one byte past the limit), parsed; a
    :class:`~jaxstow.errors.FormatError` unless it is JSON within the limits of a jaxstow file."""
    metadata = parse_json(_within_limit(data, path), what="orbax's metadata", file=path)
    problem = limits_problem(metadata)
    if problem is not None:
        raise FormatError(problem, file=path)
    return metadata


def _check_database(folder: str) -> None:
    """Check the JSON metadata keys (``w/.zarray``) of the OCDBT database in ``folder``, as :func:`check_folder`
    checks files; a database tensorstore cannot read is a :class:`~jaxstow.errors.FormatError` naming it."""
    import tensorstore

    try:
        store = tensorstore.KvStore.open({"driver": "ocdbt", "base": {"driver": "file", "path": folder + os.sep}})
        database = store.result()
        keys = [
            key for key in database.list().result() if os.path.basename(key.decode("utf-8", "replace")) in _JSON_NAMES
        ]
        values = [(key, database.read(key).result().value) for key in keys]
    except Exception as error:  # tensorstore raises ValueError and others on a damaged database
        raise FormatError(f"holds an OCDBT database that cannot be read ({error})", file=folder) from None
    for key, value in values:
        path = os.path.join(folder, key.decode("utf-8", "backslashreplace"))
        check_metadata(os.path.basename(path), _check_json(value, path), path)
