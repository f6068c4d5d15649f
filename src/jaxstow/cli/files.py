"""What the commands read: a file's leaves (from its header), their stored arrays, the steps of a folder, and the
shards of a Hugging Face folder of safetensors files.

Every command goes through these few functions, so that they read local paths and fsspec URLs alike, each URL
reached as the command's ``--storage-options`` and ``--transfer`` say (:func:`storage`, set once per command).

>>> import os, tempfile, jax.numpy as jnp, jaxstow
>>> from jaxstow.cli.files import describe, open_file
>>> path = os.path.join(tempfile.mkdtemp(), "model.jxs")
>>> jaxstow.save(path, {"w": jnp.ones((2, 3)), "depth": 2})
>>> with open_file(path) as reader:
...     [(leaf.path, leaf.dtype, leaf.shape, leaf.nbytes) for leaf in describe(reader)]
[('depth', 'int', None, 0), ('w', 'float32', (2, 3), 24)]
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import functools
import json
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from jaxstow._format.dtypes import name_of_dtype
from jaxstow._format.source import ReadSource
from jaxstow._read.foreign import folder_problem, foreign_member, recognise
from jaxstow._read.reader import FolderReader, Reader, open_parts, read_again
from jaxstow._read.sharded_folder import Listing, folder_listing, open_folder
from jaxstow._read.verifying import verify_checksums
from jaxstow._steps.names import StepNames
from jaxstow._steps.record import RECORD_NAME, StepRecord, missing_item_file
from jaxstow._storage.opening import local_path, locate, open_source
from jaxstow._storage.settings import StorageSettings, storage_settings
from jaxstow._storage.store import open_store
from jaxstow._storage.transfer import Transfer
from jaxstow.checkpoint.recovery import is_damage
from jaxstow.checkpoint.step_folder import StepFolder
from jaxstow.errors import (
    ArgumentError,
    CheckpointError,
    IsAFolderError,
    JaxstowError,
    NotAFolderError,
    PathError,
    PathNotFoundError,
    StepNotFoundError,
)

__all__ = [
    "LISTINGS",
    "DamagedStep",
    "Leaf",
    "Step",
    "add_storage_arguments",
    "checkpoint_steps",
    "committed_steps",
    "describe",
    "file_size",
    "file_sizes",
    "hf_listing",
    "is_folder",
    "kind_of_path",
    "open_file",
    "open_hf_folder",
    "open_source_at",
    "read_arrays",
    "read_steps",
    "require_folder",
    "storage",
    "use_storage_arguments",
    "verify_checksums",
]

_STORAGE: contextvars.ContextVar[StorageSettings | None] = contextvars.ContextVar("storage", default=None)


def storage(target: str | None = None) -> StorageSettings:
    """How the running command reaches URLs: its ``--storage-options`` and ``--transfer`` (for ``target``, a local
    path, none: one command may read a URL and write a local file)."""
    if target is not None and local_path(target) is not None:
        return StorageSettings()
    return _STORAGE.get() or StorageSettings()


def add_storage_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of every command about URLs."""
    parser.add_argument(
        "--storage-options",
        metavar="JSON",
        help='fsspec options for URLs, as JSON (e.g. \'{"key": "...", "secret": "...", "client_kwargs": '
        '{"endpoint_url": "http://127.0.0.1:8333"}}\'); fsspec\'s configuration and environment variables '
        "(FSSPEC_S3_*, AWS_*) fill in the rest",
    )
    parser.add_argument(
        "--transfer",
        metavar="JSON",
        help='how files on object stores move, as JSON: {"requests": 16, "part_size": 16777216, '
        '"max_bytes_per_second": null} (jaxstow.Transfer)',
    )


def use_storage_arguments(args: argparse.Namespace) -> None:
    """Set :func:`storage` from a command's ``--storage-options`` and ``--transfer``."""
    options = _json_option(getattr(args, "storage_options", None), "--storage-options")
    transfer_fields = _json_option(getattr(args, "transfer", None), "--transfer")
    try:
        transfer = Transfer(**transfer_fields) if transfer_fields is not None else None
    except TypeError as error:
        raise ArgumentError(f"--transfer: {error} (its fields: requests, part_size, max_bytes_per_second)") from None
    _STORAGE.set(storage_settings(options, transfer, None))


def _json_option(text: str | None, flag: str) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise ArgumentError(f"{flag} must be a JSON object: {error}") from None
    if not isinstance(value, dict):
        raise ArgumentError(f"{flag} must be a JSON object, not {type(value).__name__}")
    return value


def kind_of_path(target: str) -> str | None:
    """What ``target`` (a path or an fsspec URL) is: ``"folder"``, ``"file"``, or ``None`` when nothing is there."""
    path = local_path(target)
    if path is not None:
        return "folder" if os.path.isdir(path) else "file" if os.path.exists(path) else None
    from jaxstow._storage.buckets import bucket_missing, nothing_at
    from jaxstow._storage.remote import storage_errors, url_filesystem

    fs, root = url_filesystem(target, storage().options)
    with storage_errors(target):  # not fs.exists, which takes a store it cannot reach for a missing file
        try:
            info = fs.info(root)
        except FileNotFoundError as error:
            if isinstance(error.__cause__, OSError):  # fsspec's http: a server it cannot reach, as a missing file
                raise error.__cause__ from None
            info = None
        if info is None and bucket_missing(fs, root):
            raise nothing_at(target, bucket_missing=True)
    if info is None:
        return None
    return "folder" if info.get("type") == "directory" else "file"


def is_folder(target: str) -> bool:
    """Whether ``target`` (a path or an fsspec URL) is a folder."""
    return kind_of_path(target) == "folder"


def require_folder(target: str) -> None:
    """Raise a :class:`~jaxstow.errors.PathError` unless ``target`` is a folder."""
    kind = kind_of_path(target)
    if kind is None:
        raise PathNotFoundError("no such folder", file=target)
    if kind != "folder":
        raise NotAFolderError(
            "is a file, not a checkpoint folder (for a file, use `jaxstow inspect` or `jaxstow verify`)", file=target
        )


def open_source_at(target: str) -> ReadSource:
    """A random-access source for a local path or an fsspec URL; a folder or a missing file raises a PathError."""
    kind = kind_of_path(target)
    path = local_path(target)
    if kind == "folder":
        if path is not None and (recognise(path).name.startswith("orbax") or foreign_member(path) is not None):
            raise IsAFolderError(folder_problem(path), file=target)
        raise IsAFolderError(
            "is a folder, not a file (for a checkpoint folder, use `jaxstow ls` or `jaxstow verify`)", file=target
        )
    if kind is None and (path is None or not os.path.lexists(path)):
        raise PathNotFoundError("no such file", file=target)
    if path is not None:
        return open_source(path)  # a link that leads nowhere: its error says why
    from jaxstow._storage.remote import object_source, url_filesystem

    settings = storage()
    fs, root = url_filesystem(target, settings.options)
    return object_source(fs, root, name=target, transfer=settings.transfer)


@contextlib.contextmanager
def open_file(target: str | ReadSource | Sequence[ReadSource]) -> Iterator[Reader]:
    """A lazy reader of a jaxstow, safetensors or npz file (or of the files of one item saved by several processes),
    closed when the block ends."""
    if isinstance(target, Sequence) and not isinstance(target, str):
        reader = open_parts(target)
    else:
        reader = open_parts([open_source_at(target) if isinstance(target, str) else target])
    try:
        yield reader
    finally:
        reader.close()


def hf_listing(target: str) -> Listing | None:
    """The files of the Hugging Face folder of safetensors files at ``target`` (a path or an fsspec URL).

    ``None`` when ``target`` is a file or another folder (a checkpoint folder, one of its steps, a local folder of
    files jaxstow loads whole, ``.jxs`` and ``.npz``, which the command's own message names); a folder that holds such
    files beside ``.safetensors`` files, and no index, raises an error that names them.
    """
    if kind_of_path(target) != "folder":
        return None
    try:
        return folder_listing(locate(target), storage(target))
    except IsAFolderError:
        path = local_path(target)
        if path is None or any(name.endswith(".safetensors") for name in os.listdir(path)):
            raise
        return None  # files loaded whole, no index: a folder of files, not of shards


@contextlib.contextmanager
def open_hf_folder(target: str) -> Iterator[FolderReader]:
    """The Hugging Face folder at ``target`` as one lazy file, every shard's header read and checked, the index against
    the shards; closed when the block ends."""
    listing = folder_listing(locate(target), storage(target))
    if listing is None:
        raise PathNotFoundError("is no folder of safetensors files", file=target)
    reader = open_folder(listing, FolderReader, storage(target))
    try:
        yield reader
    finally:
        reader.close()


def file_size(reader: Reader) -> int:
    """The size of the reader's files in bytes."""
    return sum(file_sizes(reader))


def file_sizes(reader: Reader) -> list[int]:
    """The size of each of the reader's files in bytes."""
    return [int(cast(Any, container).source.size) for container in reader.containers]


@dataclass(frozen=True)
class Leaf:
    """One leaf as a file describes it: its path, what it is and how big.

    ``kind`` is ``"array"``, ``"npscalar"``, ``"key"``, ``"torch"`` or ``"sharded"`` for stored leaves and
    ``"value"`` for the rest; stored leaves have a numpy ``dtype`` name, a ``shape`` and ``nbytes``, values their
    Python type as ``dtype`` and their tagged JSON as ``value``. ``checksum`` is the recorded xxh3, if any (a sharded
    leaf has one per shard).
    """

    path: str
    kind: str
    dtype: str
    shape: tuple[int, ...] | None
    nbytes: int
    value: Any = None
    checksum: str | None = None

    @property
    def stored(self) -> bool:
        return self.kind != "value"


def describe(reader: Reader) -> list[Leaf]:
    """Every leaf of the file, from its header alone, in the file's leaf order (plain files: sorted names)."""
    leaves = []
    for path in reader.paths:
        if path in reader.stored:
            leaf = reader.stored[path]
            dtype = name_of_dtype(leaf.dtype) or str(leaf.dtype)
            leaves.append(Leaf(path, leaf.kind, dtype, leaf.shape, leaf.nbytes, checksum=leaf.checksum))
        elif path in reader.per_process:  # each process's own value: the header says only whose
            entry = reader.value_entries[path]
            whose = f"process {entry['process']} of {entry['processes']}"
            leaves.append(Leaf(path, "value", "per_process", None, 0, value=whose))
        else:
            value = reader.value_entries[path].get("value")
            leaves.append(Leaf(path, "value", value_type(value), None, 0, value=value))
    return leaves


def value_type(value: Any) -> str:
    """The type of a value leaf, from its tagged JSON: ``int``, ``str``, ``float``, ``ref`` (a named object)...

    >>> from jaxstow.cli.files import value_type
    >>> value_type(3), value_type({"float": "0.5"}), value_type({"ref": "jax.nn.relu"}), value_type(None)
    ('int', 'float', 'ref', 'None')
    """
    if value is None:
        return "None"
    if isinstance(value, bool | int | str):
        return type(value).__name__
    if isinstance(value, dict) and value:
        return str(next(iter(value)))
    return type(value).__name__


def read_arrays(reader: Reader, leaves: Sequence[Leaf]) -> dict[str, np.ndarray]:
    """The stored leaves' data as numpy arrays (PRNG keys as their key data, torch tensors as numpy, without torch),
    checked against their checksums (what came from a store damaged read again, once)."""
    return read_again(reader, functools.partial(reader.read_arrays, [reader.stored[leaf.path] for leaf in leaves]))


@dataclass(frozen=True)
class Step:
    """A committed step of a checkpoint folder whose record checks: the record, and the folder it is in."""

    record: StepRecord
    folder: StepFolder

    @property
    def step(self) -> int:
        return self.record.step

    def url(self, file: str) -> str:
        return self.folder.url(self.record.step, file)

    def sources(self, item: str) -> list[ReadSource]:
        """The files of ``item`` (one, or one per process that saved the step), opened and each checked against the
        header checksum the record names, as the manager's restore checks them: a missing file is a
        :class:`~jaxstow.errors.CheckpointError`, a file that is not the one saved a
        :class:`~jaxstow.errors.CorruptFileError`, each naming the file."""
        return self.folder.open_item(self.record, item)

    def deleted(self) -> bool:
        """Whether the step is gone from its folder since it was listed (the keep policy of a run saving there)."""
        try:
            self.folder.store.read_marker(self.folder.names.name(self.record.step))
        except FileNotFoundError:
            return True
        return False

    def size(self) -> int:
        """Bytes of the step's item files; a :class:`~jaxstow.errors.CheckpointError` names one that is missing."""
        total = 0
        name = self.folder.names.name(self.record.step)
        for item in self.record.files:
            for file in self.record.item_files(item):
                try:
                    source = self.folder.store.source(name, file)
                except FileNotFoundError:
                    raise missing_item_file(self.record, item, self.url(file)) from None
                total += source.size
                source.close()
        return total


@dataclass(frozen=True)
class DamagedStep:
    """A committed step of a checkpoint folder whose record does not check: its number, where its record is, and why."""

    step: int
    record_url: str
    problem: JaxstowError


def read_steps(folder: str) -> list[Step | DamagedStep]:
    """The committed steps of a checkpoint folder written by :class:`~jaxstow.CheckpointManager`, oldest first.

    Each record is read and checked as the manager reads it: a step whose record is damaged, or says another step, is
    a :class:`DamagedStep`, and the others are read all the same. A step deleted meanwhile is left out; where each one
    listed was (a run saving there, whose keep policy deletes its steps as fast as it saves them), the folder is
    listed again, and after :data:`LISTINGS` listings a :class:`~jaxstow.errors.CheckpointError` says so. A storage
    that fails raises its :class:`~jaxstow.errors.StorageError`.
    """
    require_folder(folder)
    steps = StepFolder(open_store(folder, marker=RECORD_NAME, settings=storage(folder)), StepNames("%d"))
    for listing in range(LISTINGS):
        listed = steps.committed()
        found = [step for number in listed if (step := _read_step(steps, number)) is not None]
        if found or not listed:
            return found
        time.sleep(0.05 * listing)
    raise CheckpointError(
        f"each step it listed, last {listed[0]} to {listed[-1]}, was deleted before its record was read, "
        f"{LISTINGS} times: a run saving there deletes its steps as fast as it saves them (its keep policy); run the "
        "command again, or have the run keep more steps",
        file=folder,
    )


#: How often a folder is listed again where each step it listed was deleted before it was read.
LISTINGS = 10


def _read_step(steps: StepFolder, number: int) -> Step | DamagedStep | None:
    """Step ``number`` of ``steps`` as its record says, damaged, or ``None``: deleted since it was listed."""
    try:
        return Step(steps.read_record(number, check_files=False), steps)
    except StepNotFoundError:
        return None
    except JaxstowError as error:
        if not is_damage(error):  # as the manager's damaged_steps() counts damage; a storage failure ends it
            raise
        return DamagedStep(number, steps.url(number, RECORD_NAME), error)


def checkpoint_steps(folder: str) -> list[Step]:
    """The committed steps of a checkpoint folder, oldest first; the first damaged record raises its error."""
    steps = []
    for step in read_steps(folder):
        if isinstance(step, DamagedStep):
            raise step.problem
        steps.append(step)
    return steps


def _files_in(path: str | None) -> str:
    """The files a local folder holds, to give one of them instead (none named where there are none)."""
    names = sorted(entry.name for entry in os.scandir(path) if entry.is_file()) if path is not None else []
    if not names:
        return ""
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    files = "the files" if len(names) > 1 else "the file"
    return f"; it holds {files} {shown}: give one file's path to read it, e.g. {os.path.join(path or '', names[0])}"


def _step_at_url(folder: str) -> str:
    """What a folder at a URL that holds no steps is, for a message: a step of a checkpoint folder (its record is in
    it), named with the URL of that folder and of one of its files; or a folder."""
    files = sorted(open_store(folder, marker=RECORD_NAME, settings=storage(folder)).files())
    if RECORD_NAME not in files:
        return "is a folder"
    parent, _, step = folder.rstrip("/").rpartition("/")
    file = next((name for name in files if name != RECORD_NAME), RECORD_NAME)
    return (
        f"is a folder, step {step} of the checkpoint folder {parent}: give that folder, or one of the step's files, "
        f"e.g. {parent}/{step}/{file}"
    )


def committed_steps(folder: str) -> list[Step | DamagedStep]:
    """:func:`read_steps`, of a folder that must hold at least one (or a :class:`~jaxstow.errors.PathError`)."""
    steps = read_steps(folder)
    if not steps:
        path = local_path(folder)
        foreign = folder_problem(path) if path is not None else _step_at_url(folder)
        if foreign in ("is a folder", "is a folder, not a file"):  # not a step, nor another library's folder
            foreign = "holds no committed checkpoint step (is it a CheckpointManager folder?)" + _files_in(path)
        raise PathError(foreign, file=folder)
    return steps
