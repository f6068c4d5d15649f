"""A folder's files read as untrusted input: listed, opened and read within what a folder may hold.

A folder of safetensors files is often downloaded, unpacked or shared, so its files are read as the single-file
reader reads a file. Only regular files are opened (never a FIFO, a device, a socket or a folder), without waiting.
A link is followed only when it leads inside the folder, or, for a snapshot of a Hugging Face cache
(``.../models--org--name/snapshots/<revision>/``), into that repository's ``blobs/``, where the hub keeps the files
its snapshots link to. What is read is bounded before it is read: an index by :data:`MAX_INDEX_BYTES`, the headers
of a folder's files by a :class:`Budget` (their bytes together, and the tensors they describe).

>>> import os, tempfile
>>> from jaxstow._read.folder_members import list_folder
>>> from jaxstow._storage.opening import locate
>>> folder, outside = tempfile.mkdtemp(), tempfile.mkdtemp()
>>> for path in (os.path.join(folder, "notes.json"), os.path.join(outside, "secret.json")):
...     with open(path, "w") as file:
...         _ = file.write("{}")
>>> os.symlink(os.path.join(outside, "secret.json"), os.path.join(folder, "elsewhere.json"))
>>> names, read = list_folder(locate(folder), None)
>>> sorted(names), read("notes.json")
(['elsewhere.json', 'notes.json'], b'{}')
>>> read("elsewhere.json")
Traceback (most recent call last):
...
jaxstow.errors.PathError: .../elsewhere.json: is a link to .../secret.json, outside the folder: ...
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
from collections.abc import Callable

from jaxstow._storage.failures import storage_error
from jaxstow._storage.member_names import is_inside
from jaxstow._storage.opening import Location, refuse_options
from jaxstow._storage.settings import StorageSettings
from jaxstow._storage.sources import LocalFile
from jaxstow.errors import FormatError, PathError

__all__ = [
    "MAX_FOLDER_HEADER_BYTES",
    "MAX_FOLDER_TENSORS",
    "MAX_INDEX_BYTES",
    "Budget",
    "child",
    "file_start",
    "list_folder",
    "open_local_member",
]

#: The bytes an index (``model.safetensors.index.json``) may take, checked before it is read.
MAX_INDEX_BYTES = 64 * 2**20
#: The tensors a folder may hold: its index's entries, and those of its files' headers together.
MAX_FOLDER_TENSORS = 2**19
#: The bytes the headers of a folder's files may take together (each also within one file's limit).
MAX_FOLDER_HEADER_BYTES = 64 * 2**20
#: The values (lists, and the items after each comma) one tensor's entry may hold on average before a folder's
#: header is charged more tensors than its entries: a 4-axis tensor's entry and its comma hold 9.
VALUES_PER_TENSOR = 12
#: A repository's folder in a Hugging Face cache, named by its kind and id (``models--org--name``).
_HUB_REPOSITORY = re.compile(r"(?:models|datasets|spaces)--.+")


def child(folder: str, name: str) -> str:
    """The file ``name`` of ``folder`` (a path or a URL)."""
    return posixpath.join(folder, name) if "://" in folder else os.path.join(folder, name)


def list_folder(
    location: Location, settings: StorageSettings | None
) -> tuple[list[str], Callable[[str], bytes]] | None:
    """The names in the folder and how to read one of its files whole; ``None`` when it is no folder.

    A file is read only as :func:`open_local_member` opens it, and only up to :data:`MAX_INDEX_BYTES` (it is an
    index or a record; a larger one is refused before it is read).
    """
    if location.path is not None:
        folder = location.path
        try:
            names = os.listdir(folder)
        except (FileNotFoundError, NotADirectoryError):  # none, or deleted since (a step, by a run's keep policy)
            return None
        except OSError as error:  # a loop of links, no permission: the system's words, naming it
            raise storage_error(error, location.name, doing="look into it") from error

        def read_local(name: str) -> bytes:
            source = open_local_member(folder, name, child(location.name, name))
            try:
                if source.size > MAX_INDEX_BYTES:
                    raise _too_large(source.name, source.size)
                return source.read(0, source.size)
            finally:
                source.close()

        return names, read_local
    if location.url is None:
        return None
    from jaxstow._storage.remote import forget_listings, storage_errors, url_filesystem

    fs, root = url_filesystem(location.url, (settings or StorageSettings()).options)
    with storage_errors(location.url):
        forget_listings(fs, root)  # listed as it is now: fsspec keeps what it listed before, in this process
        if not fs.isdir(root):
            return None
        names = [posixpath.basename(str(entry).rstrip("/")) for entry in fs.ls(root, detail=False)]

    def read_remote(name: str) -> bytes:
        shown = child(location.name, name)
        with storage_errors(shown):
            data = bytes(fs.cat_file(posixpath.join(root, name), start=0, end=MAX_INDEX_BYTES + 1))
        if len(data) > MAX_INDEX_BYTES:
            raise _too_large(shown)
        return data

    return names, read_remote


def file_start(location: Location, name: str, count: int, settings: StorageSettings | None) -> tuple[bytes, int]:
    """The first ``count`` bytes of the file ``name`` of the folder at ``location``, and the file's size.

    A local file is read only if it is a regular file (``b""`` and 0 for anything else, or for one that cannot be
    read); a file at a URL with one ranged read, after its size is looked up (a store's error names the file).
    """
    if location.path is not None:
        path = os.path.join(location.path, name)
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):
                return b"", 0
            with open(path, "rb") as file:
                return file.read(count), os.fstat(file.fileno()).st_size
        except OSError:
            return b"", 0
    assert location.url is not None
    from jaxstow._storage.remote import storage_errors, url_filesystem

    fs, root = url_filesystem(location.url, (settings or StorageSettings()).options)
    with storage_errors(child(location.name, name)):
        info = fs.info(posixpath.join(root, name))
        if info.get("type") != "file":
            return b"", 0
        return bytes(fs.cat_file(posixpath.join(root, name), start=0, end=count)), int(info.get("size") or 0)


def _too_large(file: str, size: int | None = None) -> FormatError:
    bytes_ = f"{size} bytes, " if size is not None else ""
    return FormatError(f"is {bytes_}more than the {MAX_INDEX_BYTES} bytes an index of a folder may take", file=file)


def open_local_member(folder: str, name: str, shown: str, settings: StorageSettings | None = None) -> LocalFile:
    """The regular file ``name`` of the local ``folder``, named ``shown`` in errors.

    A link is followed only where it leads inside the folder, or into the ``blobs/`` of the Hugging Face cache whose
    snapshot the folder is (or is in); anything else is a :class:`~jaxstow.errors.PathError` naming the file.
    """
    refuse_options(shown, settings)
    real_folder = os.path.realpath(folder)
    resolved = os.path.realpath(os.path.join(folder, name))
    blobs = hub_blobs(real_folder)
    if not any(is_inside(resolved, root) for root in (real_folder, blobs) if root is not None):
        within = "the folder and the cache's blobs" if blobs else "the folder"
        raise PathError(
            f"is a link to {resolved}, outside the folder: a folder's files are read only within {within}; copy the "
            "file into the folder if you trust it",
            file=shown,
        )
    return LocalFile(resolved, name=shown, follow=False)


def hub_blobs(real_folder: str) -> str | None:
    """The ``blobs`` folder of the Hugging Face cache repository whose snapshot holds ``real_folder`` (a real path).

    ``None`` when it is in no snapshot: ``.../models--org--name/snapshots/<revision>/`` or a folder in one. The hub
    makes ``blobs`` a folder of the repository's own: one that is a link, or leads out of the repository's folder, is
    a :class:`~jaxstow.errors.PathError` naming it, so that a folder made to look like a snapshot never reads a file
    elsewhere through it.

    >>> hub_blobs("/cache/hub/models--org--name/snapshots/0123abcd/transformer")
    '/cache/hub/models--org--name/blobs'
    >>> hub_blobs("/data/models/llama") is None
    True
    """
    parts = real_folder.split(os.sep)
    for at in range(len(parts) - 2, 0, -1):
        if parts[at] == "snapshots" and _HUB_REPOSITORY.fullmatch(parts[at - 1]) and parts[at + 1]:
            repository = os.path.realpath(os.sep.join(parts[:at]))
            blobs = os.path.join(repository, "blobs")
            resolved = os.path.realpath(blobs)
            if os.path.islink(blobs) or not is_inside(resolved, repository):
                raise PathError(
                    f"is a link to {resolved}: the blobs of a Hugging Face cache's repository are a folder of the "
                    "repository's own, so no file of its snapshots is read through this one",
                    file=blobs,
                )
            return resolved
    return None


class Budget:
    """What the headers of one folder's files may take together, spent as each is read.

    Their bytes: :data:`MAX_FOLDER_HEADER_BYTES`; their tensors: :data:`MAX_FOLDER_TENSORS`, counted from the text
    before it is parsed (every ``{`` but the first opens at most one tensor's entry, and every :data:`VALUES_PER_TENSOR`
    values, each a ``[`` or after a ``,``, count as one entry more where they outnumber those), so that parsing them
    never takes more memory than these allow, whatever values the text is made of.
    """

    def __init__(self) -> None:
        self.header_bytes = MAX_FOLDER_HEADER_BYTES
        self.tensors = MAX_FOLDER_TENSORS

    def check_length(self, length: int, *, file: str) -> None:
        """Refuse a header of ``length`` bytes, before it is read, if the folder's headers would pass their bytes."""
        if length > self.header_bytes:
            limit = f"{MAX_FOLDER_HEADER_BYTES} bytes the headers of a folder's files may take together"
            raise _over_budget(
                f"{length} bytes", MAX_FOLDER_HEADER_BYTES - self.header_bytes, "bytes", limit, file=file
            )

    def spend(self, raw: bytes, *, file: str) -> None:
        """Spend a header's text (read, not parsed), refusing it if the folder's tensors would pass their limit."""
        self.check_length(len(raw), file=file)
        values = raw.count(b"[") + raw.count(b",")
        entries = max(raw.count(b"{") - 1, -(-values // VALUES_PER_TENSOR))
        if entries > self.tensors:
            limit = f"{MAX_FOLDER_TENSORS} a folder may hold"
            raise _over_budget(
                f"up to {entries} tensors", MAX_FOLDER_TENSORS - self.tensors, "tensors", limit, file=file
            )
        self.header_bytes -= len(raw)
        self.tensors -= entries


def _over_budget(header: str, spent: int, unit: str, limit: str, *, file: str) -> FormatError:
    """The error for a header of ``header`` that, after the ``spent`` ``unit`` of the folder's files read before it,
    passes ``limit``."""
    before = f", with the {spent} {unit} of the folder's files before it," if spent else ""
    return FormatError(
        f"its header of {header}{before} is more than the {limit} (a file this large loads on its own: "
        f"jaxstow.load({file!r}))",
        file=file,
    )
