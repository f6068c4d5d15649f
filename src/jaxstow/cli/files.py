"""What the commands read: a file's leaves (from its header), their stored arrays, and the steps of a folder.

Every command goes through these few functions, so that they read local paths and fsspec URLs alike.

>>> import os, tempfile, jax.numpy as jnp, jaxstow
>>> from jaxstow.cli.files import describe, open_file
>>> path = os.path.join(tempfile.mkdtemp(), "model.jxs")
>>> jaxstow.save(path, {"w": jnp.ones((2, 3)), "depth": 2})
>>> with open_file(path) as container:
...     [(leaf.path, leaf.dtype, leaf.shape, leaf.nbytes) for leaf in describe(container)]
[('depth', 'int', None, 0), ('w', 'float32', (2, 3), 24)]
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import jax
import numpy as np

from jaxstow.checkpoint.naming import StepNames
from jaxstow.checkpoint.record import RECORD_NAME, StepRecord
from jaxstow.checkpoint.store import Store, open_store
from jaxstow.errors import CorruptFileError, FormatError, PathError
from jaxstow.format.checksum import checksum_bytes
from jaxstow.format.container import Container, open_container
from jaxstow.format.dtypes import name_of_dtype
from jaxstow.format.torch_leaves import tensor_to_numpy
from jaxstow.remote import RemoteSource, local_path
from jaxstow.restore import read_stored, stored_leaves
from jaxstow.storage import ReadSource, open_source

__all__ = [
    "Leaf",
    "Step",
    "checkpoint_steps",
    "describe",
    "file_size",
    "is_folder",
    "open_file",
    "open_source_at",
    "read_arrays",
    "verify_checksums",
]


def is_folder(target: str) -> bool:
    """Whether ``target`` (a path or an fsspec URL) is a folder."""
    path = local_path(target)
    if path is not None:
        return os.path.isdir(path)
    import fsspec

    fs, root = fsspec.core.url_to_fs(target)
    return bool(fs.isdir(root))


def open_source_at(target: str) -> ReadSource:
    """A random-access source for a local path or an fsspec URL; a folder or a missing file raises a PathError."""
    if is_folder(target):
        raise PathError(
            "is a folder, not a file (for a checkpoint folder, use `jaxstow ls` or `jaxstow verify`)", file=target
        )
    path = local_path(target)
    if path is not None:
        if not os.path.exists(path):
            raise PathError("no such file", file=target)
        return open_source(path)
    import fsspec

    fs, root = fsspec.core.url_to_fs(target)
    if not fs.exists(root):
        raise PathError("no such file", file=target)
    return RemoteSource(fs, root, name=target)


@contextlib.contextmanager
def open_file(target: str | ReadSource) -> Iterator[Container]:
    """The container of a jaxstow, safetensors or npz file, closed when the block ends."""
    container = open_container(open_source_at(target) if isinstance(target, str) else target)
    try:
        yield container
    finally:
        container.close()


def file_size(container: Container) -> int:
    """The size of the container's file in bytes."""
    return int(cast(Any, container).source.size)


@dataclass(frozen=True)
class Leaf:
    """One leaf as a file describes it: its path, what it is and how big.

    ``kind`` is ``"array"``, ``"npscalar"``, ``"key"`` or ``"torch"`` for stored leaves and ``"value"`` for the rest;
    stored leaves have a numpy ``dtype`` name, a ``shape`` and ``nbytes``, values their Python type as ``dtype`` and
    their tagged JSON as ``value``. ``checksum`` is the recorded xxh3, if any.
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


def describe(container: Container) -> list[Leaf]:
    """Every leaf of the file, from its header alone, in the file's leaf order (plain files: sorted names)."""
    if container.manifest is None:
        return [
            Leaf(slot.name, "array", name_of_dtype(slot.dtype) or str(slot.dtype), slot.shape, slot.nbytes)
            for slot in sorted(container.slots.values(), key=lambda slot: slot.name)
        ]
    stored = stored_leaves(container)
    leaves = []
    for entry in container.manifest["leaves"]:
        path = entry["path"]
        if path in stored:
            leaf = stored[path]
            dtype = name_of_dtype(leaf.dtype) or str(leaf.dtype)
            leaves.append(Leaf(path, leaf.kind, dtype, leaf.shape, leaf.nbytes, checksum=leaf.checksum))
        else:
            value = entry.get("value")
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


def read_arrays(container: Container, leaves: Sequence[Leaf]) -> dict[str, np.ndarray]:
    """The stored leaves' data as numpy arrays (PRNG keys as their key data), checked against their checksums."""
    if container.manifest is None:
        return container.read([leaf.path for leaf in leaves])
    stored = stored_leaves(container)
    values = read_stored(container, [stored[leaf.path] for leaf in leaves])
    return {path: _as_numpy(value) for path, value in values.items()}


def _as_numpy(value: Any) -> np.ndarray:
    if isinstance(value, jax.Array):
        return np.asarray(jax.random.key_data(value))
    if isinstance(value, np.ndarray | np.generic):
        return np.asarray(value)
    return tensor_to_numpy(value)


def verify_checksums(container: Container, on_read: Callable[[int], None]) -> tuple[int, list[CorruptFileError]]:
    """Read every stored leaf and compare it with its recorded checksum; returns the count checked and the damage.

    ``on_read(nbytes)`` is called as each leaf is read. A file without a jaxstow manifest has no checksums.
    """
    leaves = [leaf for leaf in describe(container) if leaf.stored]
    expected = {leaf.path: leaf.checksum for leaf in leaves if leaf.checksum is not None}
    damage: list[CorruptFileError] = []

    def check(name: str, data: memoryview) -> None:
        wanted = expected.get(name)
        if wanted is not None and (found := checksum_bytes(data)) != wanted:
            problem = f"checksum mismatch (expected xxh3 {wanted}, found {found})"
            damage.append(CorruptFileError(problem, file=container.file, path=name))
        on_read(data.nbytes)

    try:
        container.read([leaf.path for leaf in leaves], check)
    except CorruptFileError as error:
        damage.append(error)
    return len(expected), damage


@dataclass(frozen=True)
class Step:
    """A committed step of a checkpoint folder: its record, and where its files are."""

    record: StepRecord
    store: Store
    name: str

    def url(self, file: str) -> str:
        return self.store.url(self.name, file)

    def source(self, item: str) -> ReadSource:
        return self.store.source(self.name, self.record.files[item])

    def size(self) -> int:
        """Bytes of the step's item files."""
        total = 0
        for item in self.record.files:
            source = self.source(item)
            total += source.size
            source.close()
        return total


def checkpoint_steps(folder: str) -> list[Step]:
    """The committed steps of a checkpoint folder written by :class:`~jaxstow.CheckpointManager`, oldest first."""
    store = open_store(folder, marker=RECORD_NAME)
    names = StepNames("%d")
    steps = []
    for step in names.steps(store.committed()):
        name = names.name(step)
        where = store.url(name, RECORD_NAME)
        record = StepRecord.from_json(store.read_marker(name), where=where)
        if record.step != step:
            raise FormatError(f"the record says step {record.step}, but its folder is step {step}", file=where)
        steps.append(Step(record, store, name))
    return steps
