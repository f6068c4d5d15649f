"""A file opened lazily: its leaves by path, read on demand, verified against their checksums.

:class:`OpenedFile` holds what the header says (paths, kinds, dtypes, shapes, the structure) and reads whole leaves,
boxes of leaves (by byte ranges) or the boxes of sharded leaves. Restoring a tree from it is
:mod:`jaxstow._read.restore`'s job; :class:`jaxstow.Reader` adds what a user asks of a file (its leaves described,
slices, the tree restored).

>>> import io, jax.numpy as jnp, jaxstow
>>> from jaxstow._read.opened import OpenedFile
>>> from jaxstow._format.header import open_container
>>> from jaxstow._storage.opening import open_source
>>> buffer = io.BytesIO()
>>> jaxstow.save(buffer, {"w": jnp.arange(3.0), "depth": 2})
>>> _ = buffer.seek(0)
>>> with OpenedFile(open_container(open_source(buffer))) as opened:
...     print(opened.paths, opened["w"], opened["depth"])
['depth', 'w'] [0. 1. 2.] 2
"""

from __future__ import annotations

import contextlib
import math
import mmap as mmap_module
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from types import TracebackType
from typing import Any, Self, cast

import jax
import numpy as np
from jax.tree_util import PyTreeDef

from jaxstow._format.checksum import checksum_bytes
from jaxstow._format.header import NativeReader, SlotTable
from jaxstow._format.leaves import StoredLeaf, stored_leaf_from_entry
from jaxstow._format.manifest import LeafColumns, StoredLeaves
from jaxstow._format.native_or_npz import Container
from jaxstow._format.shards import Box, ShardedLeaf, Stored, check_coverage, sharded_leaf_from_entry
from jaxstow._format.skeleton import decode_treedef, decode_value
from jaxstow._format.stored_values import CHECKED_DTYPES, all_values_checked, values_checked
from jaxstow._format.tensor_reads import read_tensors
from jaxstow._format.torch_leaves import tensor_from_numpy
from jaxstow._read.block_verified import read_part
from jaxstow._read.mapped import mapped_leaf
from jaxstow._read.narrowing import held_problem, narrowing_problem
from jaxstow._read.shard_reads import ShardReads
from jaxstow._read.slicing import full_box
from jaxstow._read.whole_leaves import read_whole
from jaxstow._storage.sources import LocalFile
from jaxstow.errors import ClosedError, CorruptFileError, FormatError, LeafNotFoundError, RequestError, excerpt

__all__ = ["OpenedFile"]

#: The kinds of leaf indexed apart from the stored ones: their values are decoded, not placed on devices.
_KEPT_APART = ("value", "per_process")
_STORED_KINDS = ("array", "npscalar", "key", "torch")


def _ignore(nbytes: int) -> None:
    del nbytes


class OpenedFile(Mapping[str, Any]):
    """A file's leaves by path, read on demand; a context manager that closes the file.

    What the header says is known at once; a whole leaf read (``opened[path]``) is verified against its checksum, a
    slice against its blocks' where it nearly fills them (:mod:`~jaxstow._read.block_verified`). :class:`jaxstow.Reader`
    adds restoring trees.
    """

    def __init__(
        self,
        containers: Container | Sequence[Container],
        *,
        mmap: bool = False,
        leaves: Mapping[str, Stored] | None = None,
    ) -> None:
        """``leaves``: the leaves of plain files that together hold one flat dict (a folder of safetensors files)."""
        self.containers = [containers] if not isinstance(containers, Sequence) else list(containers)
        self.container = self.containers[0]
        self.file = self.container.file
        manifest = self.container.manifest
        if manifest is not None and manifest.get("part"):
            raise FormatError(
                f"holds only the shards of process {manifest.get('part')} of a tree saved by several processes: "
                "restore it with the step's other files (jaxstow.CheckpointManager.restore)",
                file=self.file,
            )
        #: The user's metadata: a jaxstow file's manifest holds it; a plain safetensors file's is its ``__metadata__``.
        self.metadata: dict[str, Any] | None = (
            manifest.get("metadata") if manifest else dict(self.container.metadata) or None
        )
        self.stored: MutableMapping[str, Stored] = {}
        self.value_entries: dict[str, dict[str, Any]] = {}
        #: The paths of the arrays saved weakly typed (``jnp.asarray(2.0)``), restored so.
        self.weak: set[str] = set()
        #: The per-process leaves: by path, each process's entry and the index of the file that holds its value.
        self.per_process: dict[str, dict[int, tuple[int, dict[str, Any]]]] = {}
        if leaves is not None:  # leaf_order: the leaves' paths, in the file's order, which every load pairs values with
            self.leaf_order: tuple[str, ...] = tuple(leaves)
            self.stored = dict(leaves)
        elif manifest is None:
            self.leaf_order = tuple(sorted(self.container.slots))
            self.stored = {
                name: StoredLeaf(name, "array", slot.dtype, slot.shape, None, None)
                for name, slot in self.container.slots.items()
            }
        elif self.container.columns is not None:
            self.leaf_order = self._index_columns(self.container.columns)
        else:
            self.leaf_order = tuple(self._index(entry) for entry in manifest["leaves"])
        for source, part in enumerate(self.containers[1:] if leaves is None else [], start=1):
            self._merge_shards(source, part)
        for leaf in self.stored.described() if isinstance(self.stored, StoredLeaves) else self.stored.values():
            if isinstance(leaf, ShardedLeaf):
                check_coverage(leaf, file=self.file)
        self._map = self._memory_map() if mmap else None
        self._treedef: PyTreeDef | None = None
        self.closed = False
        #: Called with the number of bytes of each leaf or box read (a progress bar's ``update``).
        self.on_read: Callable[[int], None] = _ignore

    def _index_columns(self, columns: LeafColumns) -> tuple[str, ...]:
        """Index a version 3 file: only the leaves with details are described now, the others when asked for."""
        made: dict[str, Stored] = {}
        for entry in columns.entries.values():
            if entry["kind"] in _KEPT_APART:
                self._keep_apart(entry, 0)
            else:
                made[entry["path"]] = self._describe(entry)
        self.stored = StoredLeaves(columns, self.container.slots, made)
        return tuple(columns.paths)

    def _describe(self, entry: dict[str, Any]) -> Stored:
        if "weak" in entry:
            if entry["weak"] is not True:
                raise FormatError(
                    f"malformed weak {excerpt(entry['weak'])} (true or absent)", file=self.file, path=entry["path"]
                )
            self.weak.add(entry["path"])
        if entry["kind"] == "sharded":
            return sharded_leaf_from_entry(entry, self.container.slots, source=0, file=self.file)
        return stored_leaf_from_entry(entry, self.container.slots.get(entry["path"]), file=self.file)

    def _index(self, entry: Any) -> str:
        if not (isinstance(entry, dict) and isinstance(entry.get("path"), str)):
            raise FormatError(f"malformed manifest entry {excerpt(entry)}", file=self.file)
        path: str = entry["path"]
        kind = entry.get("kind")
        if path in self.stored or path in self.value_entries:
            raise FormatError("the manifest lists this leaf twice", file=self.file, path=path)
        if kind in _STORED_KINDS or kind == "sharded":
            self.stored[path] = self._describe(entry)
        elif kind in _KEPT_APART:
            self._keep_apart(entry, 0)
        else:
            raise FormatError(f"unknown leaf kind {excerpt(kind)}", file=self.file, path=path)
        return path

    def _keep_apart(self, entry: dict[str, Any], source: int) -> None:
        """Index a value, or the value of one process of a per-process leaf, held by the file ``source``."""
        path = entry["path"]
        self.value_entries.setdefault(path, entry)
        if entry["kind"] == "per_process":
            values = self.per_process.setdefault(path, {})
            if entry["process"] in values:
                raise FormatError(f"holds a second value of process {entry['process']}", file=self.file, path=path)
            values[entry["process"]] = (source, entry)

    def _merge_shards(self, source: int, part: Container) -> None:
        """Add the shards that another file of the same tree holds (it lists sharded leaves only)."""
        entries = part.manifest.get("leaves") if part.manifest else None
        if part.columns is not None:
            entries = list(part.columns.entries.values())
        if not isinstance(entries, list):
            raise FormatError("a part of a sharded tree needs a manifest listing its shards", file=part.file)
        for entry in entries:
            path = entry.get("path") if isinstance(entry, dict) else None
            if path in self.per_process and entry.get("kind") == "per_process":
                self._keep_apart(entry, source)
                continue
            known = self.stored.get(path) if isinstance(path, str) else None
            if not isinstance(known, ShardedLeaf) or entry.get("kind") != "sharded":
                raise FormatError(
                    f"holds shards of {excerpt(path)}, which {self.file} does not list as a sharded leaf",
                    file=part.file,
                )
            extra = sharded_leaf_from_entry(entry, part.slots, source=source, file=part.file)
            if (extra.dtype, extra.shape) != (known.dtype, known.shape):
                raise FormatError(
                    f"has {extra.dtype}{list(extra.shape)} where {self.file} has {known.dtype}{list(known.shape)}",
                    file=part.file,
                    path=path,
                )
            self.stored[known.path] = known._replace(shards=known.shards + extra.shards)

    def _memory_map(self) -> mmap_module.mmap:
        source = getattr(self.container, "source", None)
        if not (isinstance(self.container, NativeReader) and isinstance(source, LocalFile)):
            raise RequestError("mmap=True needs a local native (.jxs or safetensors) file", file=self.file)
        with source.in_use() as descriptor:  # the file whose header was read, whatever has its name now
            return mmap_module.mmap(descriptor, 0, access=mmap_module.ACCESS_READ)

    @property
    def paths(self) -> list[str]:
        """The leaves' paths, in the file's order: a new list each time, which a caller may sort or change."""
        return list(self.leaf_order)

    # The mapping of paths to leaves.

    def __getitem__(self, path: str) -> Any:
        if self.closed:
            self.check_open(f"reading leaf {excerpt(path)}")
        leaf = self.stored.get(path) if isinstance(path, str) else None
        if leaf is not None:
            return self.as_leaf(leaf, self.read_arrays([leaf])[path])
        self.check_path(path)
        if path in self.per_process:
            raise RequestError("a per-process leaf: restore it with load()", file=self.file, path=path)
        return self.value(path)

    def __iter__(self) -> Iterator[str]:
        return iter(self.leaf_order)

    def __len__(self) -> int:
        return len(self.leaf_order)

    def __contains__(self, path: object) -> bool:
        return isinstance(path, str) and (path in self.stored or path in self.value_entries)

    def check_path(self, path: str) -> None:
        """Raise a :class:`~jaxstow.errors.RequestError` listing the file's leaves if it has none at ``path``."""
        if not isinstance(path, str):
            raise RequestError(f"a leaf is named by its path, a string ('params/w'), not {path!r}", file=self.file)
        if path not in self:
            shown = ", ".join(self.leaf_order[:8]) + (", ..." if len(self.leaf_order) > 8 else "")
            raise LeafNotFoundError(f"no leaf {path!r} in the file (its leaves: {shown or 'none'})", file=self.file)

    # What the header says.

    def value(self, path: str) -> Any:
        """The value of the value leaf at ``path`` (one of :attr:`value_entries`)."""
        return decode_value(self.value_entries[path].get("value"), path=path, file=self.file)

    def origin(self, path: str) -> str:
        """What a message adds to the leaf at ``path`` to say where it comes from: nothing, for a leaf of one file."""
        del path
        return ""

    def shape_advice(self, path: str, shape: tuple[int, ...]) -> str:
        """What a message adds where the leaf at ``path`` is not of the ``shape`` asked for: nothing, in one file."""
        del path, shape
        return ""

    def treedef(self) -> PyTreeDef | None:
        """The saved tree structure; ``None`` for a file without a jaxstow manifest (it holds a flat dict)."""
        manifest = self.container.manifest
        if manifest is None:
            return None
        if self._treedef is not None:
            return self._treedef
        treedef = decode_treedef(manifest.get("structure"), file=self.file)
        if treedef.num_leaves != (listed := len(self.leaf_order)):
            raise FormatError(f"the structure has {treedef.num_leaves} leaves, the manifest {listed}", file=self.file)
        self._treedef = treedef
        return treedef

    # Reading.

    def read_box(self, path: str, box: Box) -> np.ndarray:
        """The elements of ``box`` (start and stop along every axis) of the array at ``path``.

        Only the bytes they take are read; a whole leaf (or a whole shard) is verified against its checksum when
        read, a part of one against its blocks' checksums where it nearly fills them
        (:func:`~jaxstow._read.block_verified.read_part`).
        """
        if self.closed:
            self.check_open(f"reading leaf {excerpt(path)}")
        leaf = self.stored[path]
        self.on_read(math.prod(stop - start for start, stop in box) * leaf.dtype.itemsize)
        if isinstance(leaf, ShardedLeaf):
            return values_checked(self._read_sharded(leaf, box), file=self.file, path=path)
        within = tuple(slice(start, stop) for start, stop in box)
        if box == full_box(leaf.shape) or not isinstance(self.container, NativeReader):
            part: np.ndarray = self.read_arrays([leaf])[path][within]
        elif self._map is not None:
            part = self._mapped(leaf, box)[within]
        else:
            at = self.container.slots[path].offset
            part = read_part(self.container.source, at, leaf.dtype, leaf.shape, box, leaf, file=self.file, path=path)
        return values_checked(part, file=self.file, path=path)

    def _read_sharded(self, leaf: ShardedLeaf, box: Box) -> np.ndarray:
        """Assemble ``box`` of a sharded leaf from the parts of its shards that overlap it."""
        reads = ShardReads(self.containers, self.verify)
        assembled = reads.box(leaf, box)
        reads.run()
        return assembled()

    def read_stored(self, leaves: Sequence[Stored]) -> dict[str, Any]:
        """Whole stored leaves, verified: arrays as numpy, numpy scalars, PRNG keys and torch tensors as themselves."""
        arrays = self.read_arrays(leaves)
        return {leaf.path: self.as_leaf(leaf, arrays[leaf.path]) for leaf in leaves}

    def as_leaf(self, leaf: Stored, array: np.ndarray, *, as_numpy: bool = False) -> Any:
        """A stored leaf's array as the leaf it was: an array, a numpy scalar, a PRNG key or a torch tensor (the
        array itself with ``as_numpy``)."""
        if leaf.kind == "npscalar":
            return array[()]
        if leaf.kind == "torch" and not as_numpy:
            return tensor_from_numpy(array, file=self.file, path=leaf.path)
        if leaf.kind == "key":
            own = array if self._map is None else np.array(array)  # not the map's pages, which the file can change
            return jax.random.wrap_key_data(jax.device_put(own), impl=leaf.impl)
        return array

    def check_bound_for_jax(self, arrays: Sequence[tuple[str, np.ndarray]]) -> None:
        """Refuse the arrays (by leaf path) bound for jax that this jax cannot hold (:func:`held_problem`) or that
        jax with x64 off would change (wrapped integers, floats made infinite: :func:`narrowing_problem`)."""
        for path, array in arrays:
            if (problem := held_problem(array.dtype) or narrowing_problem(array)) is not None:
                raise RequestError(problem, file=self.file, path=path)

    def read_all(self, *, as_numpy: bool = False) -> list[Any] | None:
        """Every leaf of a version 3 native file in leaf order (arrays as numpy, verified; torch tensors as themselves
        unless ``as_numpy``), read by columns.

        One pass over the slot table, with no Python object per leaf but the array itself, and every checksum compared
        at once. ``None`` for a file this cannot read so (another container or version, sharded or per-process leaves,
        a memory map).
        """
        slots, columns = self.container.slots, self.container.columns
        source = getattr(self.container, "source", None)
        if columns is None or not isinstance(slots, SlotTable) or source is None or self._map is not None:
            return None
        if "s" in columns.kinds or "p" in columns.kinds:
            return None
        paths = columns.stored_paths()
        rows = np.fromiter(map(slots.index.__getitem__, paths), np.int64, len(paths))
        row_list = rows.tolist()
        dtypes = [slots.dtypes[row] for row in row_list]
        shapes = [slots.shapes[row] for row in row_list]
        positions = np.flatnonzero(columns.stored).tolist()
        special = [(k, i) for k, i in enumerate(positions) if i in columns.entries or columns.kinds[i] != "a"]
        leaves = {k: self.stored[columns.paths[i]] for k, i in special}
        for k, leaf in leaves.items():  # leaves stored as raw bytes have their dtype and shape in their details
            dtypes[k], shapes[k] = leaf.dtype, leaf.shape
        nbytes = slots.nbytes[rows]
        self.on_read(int(nbytes.sum()))
        digests: list[str] = []
        arrays: list[Any] = read_tensors(source, slots.offsets[rows], nbytes, dtypes, shapes, digests)
        if digests != columns.checksums:
            k = next(
                k for k, (found, wanted) in enumerate(zip(digests, columns.checksums, strict=True)) if found != wanted
            )
            self.verify(paths[k], digests[k], columns.checksums[k])
        if not CHECKED_DTYPES.isdisjoint(dtypes):  # a set operation: 0.1 ms for 10,000 leaves
            all_values_checked(arrays, dtypes, file=self.file, paths=paths)
        for k, leaf in leaves.items():
            arrays[k] = self.as_leaf(leaf, arrays[k], as_numpy=as_numpy)
        if len(positions) == len(columns.paths):
            return arrays
        values: list[Any] = [None] * len(columns.paths)
        for i, array in zip(positions, arrays, strict=True):
            values[i] = array
        for i, entry in columns.entries.items():  # decoded in one go, each as self.value decodes it
            if entry["kind"] == "value":
                values[i] = decode_value(entry.get("value"), path=entry["path"], file=self.file)
        return values

    @property
    def memory_mapped(self) -> bool:
        """Whether leaves are read from a memory map of the file."""
        return self._map is not None

    def read_arrays(self, leaves: Sequence[Stored]) -> dict[str, np.ndarray]:
        """The bytes of whole stored leaves as numpy arrays of their true dtype and shape, verified."""
        self.check_open("reading leaves")
        any_sharded = any(isinstance(leaf, ShardedLeaf) for leaf in leaves)
        if self._map is not None and not any_sharded:
            out = {}
            for leaf in leaves:
                view = self._mapped(leaf)
                self.verify(leaf.path, checksum_bytes(view.reshape(-1).view(np.uint8).data), leaf.checksum)
                out[leaf.path] = values_checked(view, file=self.file, path=leaf.path)
            return out
        for leaf in leaves:
            self.on_read(leaf.nbytes)
        sharded: dict[str, np.ndarray] = {}
        if any_sharded:
            reads = ShardReads(self.containers, self.verify)
            planned = {
                leaf.path: reads.box(leaf, full_box(leaf.shape)) for leaf in leaves if isinstance(leaf, ShardedLeaf)
            }
            reads.run()
            sharded = {path: assembled() for path, assembled in planned.items()}
            leaves = [leaf for leaf in leaves if not isinstance(leaf, ShardedLeaf)]
        arrays = read_whole(self.container, leaves, self.verify)
        arrays.update(sharded)
        for leaf in leaves:
            array = arrays[leaf.path]
            if array.dtype != leaf.dtype or array.shape != leaf.shape:
                typed = array.reshape(-1).view(np.uint8).view(leaf.dtype).reshape(leaf.shape)
                arrays[leaf.path] = np.require(typed, requirements="A")  # raw bytes at an odd offset: copied aligned
        return {path: values_checked(array, file=self.file, path=path) for path, array in arrays.items()}

    def _mapped(self, leaf: Stored, box: Box | None = None) -> np.ndarray:
        """A view of the leaf in the memory map (:func:`~jaxstow._read.mapped.mapped_leaf`)."""
        source = cast(LocalFile, self.container.source)  # type: ignore[attr-defined]  # a LocalFile's: _memory_map
        slot = self.container.slots[leaf.path]
        return mapped_leaf(self._map, slot, source, leaf, box, file=self.file, check_open=self.check_open)

    def verify(self, path: str, found: str, wanted: str | None, source: int = 0) -> None:
        """Raise a :class:`~jaxstow.errors.CorruptFileError` naming the leaf and its file (of the tree's files, the
        ``source``-th) if ``found``, an xxh3, is not ``wanted``."""
        if wanted is not None and found != wanted:
            raise CorruptFileError(
                f"checksum mismatch (expected xxh3 {wanted}, found {found}): the file is corrupt",
                file=self.containers[source].file if source else self.file,
                path=path,
            )

    # Closing.

    def check_open(self, what: str) -> None:
        """Raise a :class:`~jaxstow.errors.ClosedError` saying ``what`` was asked, if the file is closed."""
        if self.closed:
            raise ClosedError(what, file=self.file)

    def close(self) -> None:
        """Release the file (a file object given by the caller stays open): what the header said stays known, and
        reading a leaf raises a :class:`~jaxstow.errors.ClosedError`, in every thread. Closing twice does nothing."""
        if self.closed:
            return
        self.closed = True
        if self._map is not None:
            with contextlib.suppress(BufferError):  # views still in use keep the mapping alive until they go
                self._map.close()
            self._map = None
        for container in self.containers:
            container.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()
