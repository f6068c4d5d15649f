"""A tree encoded for writing: its manifest and its leaves' host arrays, ready to be written now or later.

Encoding is the only part of a save that must happen on the caller's thread: it flattens the tree, encodes its
structure and brings the arrays to the host (zero-copy for CPU arrays, which are immutable). Writing, checksums
included, can then run on a background thread.

>>> import jax.numpy as jnp
>>> from jaxstow._write.encoded import encode_tree
>>> encoded = encode_tree({"w": jnp.ones(2)}, metadata={"step": 1})
>>> encoded.nbytes, encoded.manifest["metadata"]
(8, {'step': 1})
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import jax
import numpy as np

from jaxstow._format.block_checksums import block_count
from jaxstow._format.checksum import ZERO_CHECKSUM, checksum, checksums
from jaxstow._format.leaves import EncodedLeaf, encode_leaf, is_sharded
from jaxstow._format.manifest_written import metadata_problem
from jaxstow._format.native_or_npz import (
    FORMAT_NAME,
    FORMAT_VERSION,
    Kind,
    container_kind,
    describe_raw_leaves,
    write_container,
)
from jaxstow._format.per_process import PerProcess, is_per_process, state_of
from jaxstow._format.pieces import Deferred, HostArray
from jaxstow._format.replicas import replica_print
from jaxstow._storage.opening import PathOrFile, local_path
from jaxstow._storage.settings import StorageSettings
from jaxstow._storage.sinks import atomic_sink, file_object_sink
from jaxstow._util.gc_pause import gc_paused
from jaxstow._util.progress import Bar, counted
from jaxstow._util.signal_free import start_thread
from jaxstow._write.array_details import DETAILED_KINDS, array_details
from jaxstow._write.flattening import cycle_error, naming_deleted_arrays
from jaxstow._write.grouped_prints import GROUPS, differing_group, grouped
from jaxstow._write.host_budget import HostBudget
from jaxstow._write.replica_sets import replica_summary
from jaxstow._write.shard_names import rename_taken_shards
from jaxstow._write.taken_apart import TakenApart, take_apart
from jaxstow.errors import MetadataError, ShardingError

__all__ = ["EncodedTree", "differing_leaves", "encode_tree"]

_PARALLEL_HASH_BYTES = 32 << 20


@dataclass
class EncodedTree:
    """A tree's manifest and host arrays; :meth:`write` turns them into a file."""

    leaves: list[EncodedLeaf]
    manifest: dict[str, Any]
    #: For a part of a tree saved by several processes: its structure, leaf paths, dtypes and shapes, and the values
    #: every process saves once for all (small ones), hashed, which is the same in every process saving the same
    #: tree (:func:`_digest`).
    digest: str = ""
    #: For a part of a tree saved by several processes: the prints of the replicas this process holds of its sharded
    #: arrays, per set of processes holding them (:func:`~jaxstow._write.replica_sets.replica_summary`).
    replicas: dict[str, str] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Bytes of array data the file will hold."""
        return sum(array.nbytes for _, array, _ in self._tensors)

    @functools.cached_property
    def _tensors(self) -> list[tuple[str, HostArray, dict[str, Any]]]:
        return [tensor for leaf in self.leaves for tensor in leaf.tensors()]

    def write(
        self, path_or_file: PathOrFile, *, bar: Bar | None = None, settings: StorageSettings | None = None
    ) -> str | None:
        """Write the file, checksums included.

        A path or a URL (reached as ``settings`` say) is written atomically, a file object as it is: every write
        whole, even to a raw stream that writes part of what it is given (a socket, a pipe), an earlier, longer
        content cut where the file ends, and an ``OSError`` a :class:`~jaxstow.errors.StorageError` naming it
        (:func:`~jaxstow._storage.sinks.file_object_sink`).

        Large trees are checksummed on other threads while their bytes are being written. Written bytes are counted
        on ``bar``, a :class:`~jaxstow._util.progress.Bar`, when one is given. Returns the header's checksum of a native
        file (``None`` for npz), which a checkpoint's record keeps.

        A local file's header and bytes are written with the collector paused (:mod:`jaxstow._util.gc_pause`), its
        commit (fsync, rename) is not; nor is any part of a write to a URL or to a file object.
        """
        kind = container_kind(path_or_file)
        if not isinstance(path_or_file, str | os.PathLike):
            with file_object_sink(path_or_file) as sink:  # written whole, cut where the writes end, OSErrors named
                return self._write(_counted(sink, bar), kind)
        local = local_path(path_or_file) is not None
        with atomic_sink(path_or_file, settings) as sink, gc_paused() if local else contextlib.nullcontext():
            return self._write(_counted(sink, bar), kind)

    def _write(self, sink: BinaryIO, kind: Kind) -> str | None:
        """Write the file's header and bytes to ``sink``, checksums included."""
        pieces = self._tensors
        describe_raw_leaves(kind, pieces)
        with _checksums(pieces) as complete:
            return write_container(sink, kind, [(name, array) for name, array, _ in pieces], self.manifest, complete)


def encode_tree(
    tree: Any | TakenApart,
    *,
    metadata: dict[str, Any] | None = None,
    copy: bool = False,
    file: str = "",
    part: int | None = None,
    hosting: HostBudget | None = None,
    details: dict[int, dict[str, Any]] | None = None,
) -> EncodedTree:
    """Encode ``tree`` for writing (a tree, or one :func:`~jaxstow._write.taken_apart.take_apart` took apart when
    the save was asked for). ``copy=True`` copies the host arrays the caller could change (numpy buffers).

    The JAX arrays' entries get the members their bytes do not say: :func:`array_details` of ``tree``'s leaves, or,
    for a tree held on the host, ``details`` (:func:`array_details` of the leaves of the tree the caller gave).

    With ``hosting``, the arrays whose bytes would cost host memory (on an accelerator, or to copy) are brought to the
    host in pieces while written, within its budget (:mod:`jaxstow._write.host_budget`).

    ``file`` names the destination in error messages. ``part=k`` makes the file that process ``k`` writes of a tree
    saved by several processes: process 0's holds the whole structure and every leaf but the shards and per-process values of other
    processes; the others' hold only their shards and per-process values. Without ``part``, the tree must be held by this process alone.
    """
    if metadata is not None:
        problem = metadata_problem(metadata)
        if problem is not None:
            raise MetadataError(
                f"metadata for {file or 'the file'} must be a JSON-able dict: {problem}", file=file or None
            )
    parts = tree if isinstance(tree, TakenApart) else take_apart(tree, file=file)
    leaves, structure, paths = parts.leaves, parts.structure, parts.paths
    if hosting is not None and not hosting.counts(copy=copy):
        hosting = None  # nothing to count
    with naming_deleted_arrays(lambda: paths, leaves, file=file):
        encoded = [
            _encode_per_process(path, leaf, part=part, file=file)
            if is_per_process(leaf)
            else _encode(path, _whole_if_own(leaf) if part is not None else leaf, file, copy, hosting, whole=not part)
            for path, leaf in zip(paths, leaves, strict=True)
        ]
    for i, members in (array_details(leaves) if details is None else details).items():
        kind = encoded[i].entry["kind"]
        encoded[i].entry.update({key: value for key, value in members.items() if kind in DETAILED_KINDS[key]})
    if part is None:
        _check_addressable(encoded, leaves, file=file)
    if copy:
        encoded = [_copied(leaf, given) for leaf, given in zip(encoded, leaves, strict=True)]
    digest = "" if part is None else _digest(structure, encoded, leaves, hosting)
    replicas = {} if part is None else replica_summary(encoded, part)
    rename_taken_shards(encoded)
    if part:
        encoded = [leaf for leaf in encoded if leaf.entry["kind"] in ("sharded", "per_process")]
        manifest = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "part": part,
            "leaves": [leaf.entry for leaf in encoded],
        }
    else:
        manifest = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "structure": structure,
            "leaves": [leaf.entry for leaf in encoded],
            "metadata": metadata,
        }
    return EncodedTree(encoded, manifest, digest, replicas)


def _copied(leaf: EncodedLeaf, given: Any) -> EncodedLeaf:
    """``leaf`` with its host array copied if it may be the caller's own memory, which the caller may change.

    A JAX array is immutable: its host arrays (its shards' too) are views that keep a donation from reusing its
    buffers (on CPU), or copies already (from an accelerator). An array that encoding made (a C-contiguous or
    native-order copy) owns its memory; a deferred one is copied piece by piece while written.
    """
    array = leaf.array
    if isinstance(given, jax.Array) or array is None or isinstance(array, Deferred):
        return leaf
    if array is given or not array.flags.owndata:
        return EncodedLeaf(leaf.entry, array.copy(), leaf.shards)
    return leaf


def _encode_per_process(path: str, leaf: Any, *, part: int | None, file: str) -> EncodedLeaf:
    """A per-process leaf: this process's value as the bytes of a jaxstow file of its own, and how many processes
    save the tree (one when this file is the only one)."""
    buffer = io.BytesIO()
    encode_tree(state_of(leaf), file=f"{file}:{path}" if file else path).write(buffer)
    entry: dict[str, Any] = {"path": path, "kind": "per_process"}
    entry["processes"], entry["process"] = (1, 0) if part is None else (jax.process_count(), part)
    if not isinstance(leaf, PerProcess) or leaf.iterator:
        entry["iterator"] = True
    return EncodedLeaf(entry, np.frombuffer(buffer.getbuffer(), np.uint8))


def _whole_if_own(leaf: Any) -> Any:
    """Of a tree that several processes save, an array sharded over this process's own devices only (a mesh of its
    local devices), as one host array: it is this process's value, saved once for all (by process 0, compared as
    the others' unsharded values are), not shards of one global array that each process would write whole."""
    if isinstance(leaf, jax.Array) and isinstance(leaf.dtype, np.dtype) and is_sharded(leaf):
        return np.asarray(leaf) if leaf.is_fully_addressable else leaf
    return leaf


def _encode(path: str, leaf: Any, file: str, copy: bool, hosting: HostBudget | None, *, whole: bool) -> EncodedLeaf:
    """One leaf, its bytes brought to the host within ``hosting``: a sharded array's shards, and, where the file
    holds them (``whole``: not a part after the first, which holds only sharded leaves), the other arrays'."""
    if isinstance(leaf, Deferred):  # registered with a budget when the tree was held
        return EncodedLeaf({"path": path, "kind": "array"}, leaf)
    deferred = None if hosting is None or not whole else hosting.defer(leaf, copy=copy)
    if deferred is not None:
        return EncodedLeaf({"path": path, "kind": "array"}, deferred)
    try:
        return encode_leaf(path, leaf, file=file or None, defer=hosting)
    except RecursionError:  # an object saved by its attributes whose attributes lead back to it
        raise cycle_error(file, path) from None


def _check_addressable(encoded: list[EncodedLeaf], leaves: list[Any], *, file: str) -> None:
    for encoded_leaf, leaf in zip(encoded, leaves, strict=True):
        if encoded_leaf.entry["kind"] == "sharded" and not leaf.is_fully_addressable:
            raise ShardingError(
                f"the array spans several processes ({leaf.sharding}), and one file holds what one process has: "
                "save it from every process with jaxstow.CheckpointManager, which writes each process's shards and "
                "commits them together",
                file=file or None,
                path=encoded_leaf.entry["path"],
            )


def _digest(structure: Any, leaves: list[EncodedLeaf], given: list[Any], hosting: HostBudget | None) -> str:
    """What every process saving the same tree agrees on: its structure, each leaf's path, kind, dtype and shape,
    then (after a ``:``) the values that every process saves once for all, in groups of leaves
    (:mod:`~jaxstow._write.grouped_prints`): the value leaves, the bytes of each stored array of at most
    :data:`_VALUE_BYTES`, and 64 windows of 1 KiB of each larger one on the host (reading a larger one whole, or one
    on an accelerator, would cost every process a pass over it on every save). Per-process leaves are left out, and
    sharded arrays, whose replicas are compared between the processes that hold them
    (:mod:`~jaxstow._write.replica_sets`). See :func:`differing_leaves`."""
    described = [json.dumps([leaf.entry["path"], leaf.entry["kind"], *_layout(leaf)]) for leaf in leaves]
    layout = hashlib.sha256(json.dumps([structure, described], separators=(",", ":")).encode()).hexdigest()[:16]
    prints = [_value_print(leaf, value, hosting) for leaf, value in zip(leaves, given, strict=True)]
    return f"{layout}:{grouped(prints)}:{grouped(described)}"


#: The largest unsharded array whose bytes the digest of a tree saved by several processes covers whole: larger ones
#: (replicated parameters, for instance) would cost every process a pass over them on every save.
_VALUE_BYTES = 64 << 10


def differing_layout(digest: str, other: str, count: int) -> int | None:
    """The first leaf of a tree of ``count`` leaves whose path, kind, dtype or shape the other digest's tree does not
    share at its place (``count`` where the other tree has more leaves); ``None`` where the layouts agree or cannot be
    told apart leaf by leaf (a tree of half :data:`~jaxstow._write.grouped_prints.GROUPS` leaves or more has groups
    of several)."""
    ours, theirs = (text.split(":")[2] if text.count(":") == 2 else "" for text in (digest, other))
    few = GROUPS // 2  # fewer groups than that: one leaf each
    if digest.partition(":")[0] == other.partition(":")[0] or not count < few or not len(theirs) < 8 * few:
        return None
    return next((k for k in range(count) if ours[8 * k : 8 * k + 8] != theirs[8 * k : 8 * k + 8]), count)


def differing_leaves(digest: str, other: str, count: int) -> tuple[int, int] | None:
    """The first group of leaves (``start``, ``stop``) whose values two digests of a tree of ``count`` leaves hash
    differently; ``None`` where their values agree or their layouts differ."""
    layout, values = digest.split(":")[:2]
    other_layout, other_values = other.split(":")[:2]
    if layout != other_layout or values == other_values:
        return None
    return differing_group(values, other_values, count)


def _value_print(leaf: EncodedLeaf, given: Any, hosting: HostBudget | None) -> str:
    """What a leaf (``given``, encoded as ``leaf``) contributes to the digest: its JSON (a value leaf), its bytes'
    xxh3 (a stored array of at most :data:`_VALUE_BYTES`, a deferred one read for it), the
    :func:`~jaxstow._format.replicas.replica_print` of a larger one (64 windows of 1 KiB, read from its device where
    it is deferred), or nothing (sharded and per-process leaves)."""
    kind = leaf.entry["kind"]
    if kind == "value":
        return json.dumps(leaf.entry.get("value"), sort_keys=True, separators=(",", ":"), default=str)
    array = leaf.array
    if kind == "per_process" or array is None:
        return ""
    if array.nbytes <= _VALUE_BYTES:
        return array.digest() if isinstance(array, Deferred) else checksum(array)
    if not isinstance(array, Deferred):
        return replica_print(array)
    if type(given) is np.ndarray:  # a copy deferred: the bytes it will hold, native
        return replica_print(given.astype(given.dtype.newbyteorder("="), copy=False))
    return (hosting.replica_print(given) if hosting is not None else None) or ""


def _layout(leaf: EncodedLeaf) -> list[Any]:
    """A leaf's dtype and shape: its array's, or its entry's (sharded arrays, with their sharding and the processes
    that hold each of their boxes, which every process sees whole)."""
    if leaf.array is not None and leaf.entry["kind"] != "per_process":  # each process's value is its own
        return [str(leaf.array.dtype), list(leaf.array.shape)]
    if leaf.entry["kind"] == "sharded":
        return [leaf.entry.get("dtype"), leaf.entry.get("shape"), leaf.entry.get("sharding"), leaf.holders]
    return [leaf.entry.get("dtype"), leaf.entry.get("shape")]


def _counted(sink: BinaryIO, bar: Bar | None) -> BinaryIO:
    return sink if bar is None else counted(sink, bar)


@contextlib.contextmanager
def _checksums(pieces: list[tuple[str, HostArray, dict[str, Any]]]) -> Iterator[Callable[[], None] | None]:
    """Fill the ``xxh3`` of each tensor's entry, and the ``blocks`` of one of several blocks
    (:mod:`~jaxstow._format.block_checksums`).

    At once for small trees (yields ``None``), or in the background (yields ``complete``).

    Large trees are hashed by a few threads that start now, each on a batch of tensors, so that hashing overlaps the
    writing; their entries hold placeholders of the same length until ``complete()``, which waits for the threads.
    The threads are plain ones, not a ``concurrent.futures`` pool, which refuses work once the interpreter has begun
    to exit. A deferred tensor is hashed while it is written (or before, on a sink that cannot go back to its header).
    """
    ready = [(array, entry) for _, array, entry in pieces if isinstance(array, np.ndarray)]
    deferred = [(array, entry) for _, array, entry in pieces if isinstance(array, Deferred)]
    arrays = [array for array, _ in ready]
    if not deferred and sum(array.nbytes for array in arrays) <= _PARALLEL_HASH_BYTES:
        for array, entry in ready:
            _fill(entry, checksums(array))
        yield None
        return
    _fill_placeholders(pieces)  # in a function of its own: a loop here would hold its last tensor while written
    workers = min(4, os.cpu_count() or 1, max(1, len(arrays)))
    blocks = [[""] * block_count(array.nbytes) or None for array in arrays]  # made before any piece: see Checksums
    batches = [_Hashing(arrays[i::workers], blocks[i::workers]) for i in range(workers)]
    try:

        def complete() -> None:
            results = [batch.result() for batch in batches]
            for i, (_, entry) in enumerate(ready):
                _fill(entry, results[i % workers][i // workers])
            for array, entry in deferred:
                _fill(entry, array.checksums())

        yield complete
    finally:
        for batch in batches:
            batch.wait()


def _fill_placeholders(pieces: list[tuple[str, HostArray, dict[str, Any]]]) -> None:
    for _, tensor, entry in pieces:
        _fill(entry, (ZERO_CHECKSUM, ZERO_CHECKSUM * block_count(tensor.nbytes) or None))


def _fill(entry: dict[str, Any], sums: tuple[str, list[str] | str | None]) -> None:
    entry["xxh3"], blocks = sums
    if blocks is not None:
        entry["blocks"] = blocks if isinstance(blocks, str) else "".join(blocks)


class _Hashing:
    """The checksums of a batch of arrays, computed on a thread of its own, or at once where no thread can start."""

    def __init__(self, arrays: list[np.ndarray], blocks: list[list[str] | None]) -> None:
        self._arrays = arrays
        self._blocks = blocks
        self._digests: list[tuple[str, list[str] | None]] = []
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = threading.Thread(target=self._run, name="jaxstow-checksum", daemon=True)
        try:
            start_thread(self._thread)
        except RuntimeError:  # the interpreter is finalizing and starts no thread
            self._thread = None
            self._run()

    def _run(self) -> None:
        try:
            self._digests = [checksums(array, into) for array, into in zip(self._arrays, self._blocks, strict=True)]
        except BaseException as error:
            self._error = error

    def wait(self) -> None:
        """Wait until the batch is hashed."""
        if self._thread is not None:
            self._thread.join()

    def result(self) -> list[tuple[str, list[str] | None]]:
        """The batch's checksums (:func:`~jaxstow._format.checksum.checksums`), in order; raises the error of the
        hashing, if it failed."""
        self.wait()
        if self._error is not None:
            raise self._error
        return self._digests
