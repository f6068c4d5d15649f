"""Leaves as the file stores them, and back: each leaf's manifest entry, written and checked.

Every leaf of a tree becomes one manifest entry. Arrays (jax, numpy or torch), numpy scalars and typed PRNG keys are
*stored leaves*: their bytes go to the data region, checksummed, their dtype and shape are their tensor's (or in the
entry, for raw bytes: :func:`~jaxstow._format.native_or_npz.describe_raw_leaves`). Everything else (Python scalars,
strings, registered functions) is a *value* kept in the manifest as tagged JSON.

>>> import jax, numpy as np
>>> from jaxstow._format.leaves import encode_leaf
>>> encode_leaf("w", np.ones((2, 3), np.float32)).entry
{'path': 'w', 'kind': 'array'}
>>> encode_leaf("act", jax.nn.relu).entry
{'path': 'act', 'kind': 'value', 'value': {'ref': 'jax.nn.relu'}}
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from jaxstow._format.dtypes import checked_shape, dtype_from_name, name_of_dtype, unstored_dtype_advice
from jaxstow._format.held_elsewhere import held_elsewhere, on_own_device
from jaxstow._format.per_process import check_per_process_entry
from jaxstow._format.pieces import Deferred, HostArray
from jaxstow._format.replicas import Box, Holders, replica_print, share_box
from jaxstow._format.shard_holders import as_box, holders, holders_digest, shared_by
from jaxstow._format.sharding_description import check_sharding_description, check_whole_placement, describe_sharding
from jaxstow._format.skeleton import decode_value, encode_value
from jaxstow._format.tensor_reads import TensorSlot
from jaxstow._format.torch_leaves import is_tensor, tensor_to_numpy
from jaxstow.errors import FormatError, ShardingError, UnsaveableObjectError, excerpt

__all__ = [
    "Deferral",
    "EncodedLeaf",
    "EncodedShard",
    "EncodedValue",
    "KeyData",
    "StoredLeaf",
    "check_entry",
    "decode_value_entry",
    "encode_leaf",
    "is_sharded",
    "key_impl_name",
    "stored_leaf_from_entry",
    "tensor_names",
]

Entry = dict[str, Any]
#: The kinds of leaf whose entry describes an array: stored leaves and sharded ones.
_ARRAY_KINDS = frozenset({"array", "npscalar", "key", "torch", "sharded"})
_CHECKSUM = re.compile(r"[0-9a-f]{16}")
_IMPL_NAME = re.compile(r"[A-Za-z0-9_]{1,64}")
#: The tags by which jax before 0.4.36 printed its PRNG implementations, as files saved with it name them.
_IMPL_TAGS = {"fry": "threefry2x32", "urbg": "unsafe_rbg"}


class KeyData:
    """Typed PRNG keys held as their raw data on the host, with their implementation's registered name: stored, and
    loaded back, as the keys themselves. Made without a call into jax, which inside a running program's host callback
    waits on the program.

    >>> import os, tempfile, jaxstow
    >>> key = jax.random.key(7)
    >>> path = os.path.join(tempfile.mkdtemp(), "key.jxs")
    >>> jaxstow.save(path, {"key": KeyData(np.asarray(jax.random.key_data(key)), key_impl_name(key.dtype))})
    >>> bool(jaxstow.load(path)["key"] == key)
    True
    """

    __slots__ = ("data", "impl")

    def __init__(self, data: np.ndarray, impl: str) -> None:
        self.data, self.impl = data, impl


class EncodedValue:
    """A value leaf already encoded (its tagged JSON), as a background save holds an object the caller may change.

    Not a tuple, which jax would take for a node of the tree.
    """

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class EncodedShard(NamedTuple):
    """One stored shard of a sharded array: its entry in the leaf's ``shards`` list and its bytes (or a Deferred)."""

    entry: Entry
    array: HostArray


class Deferral(Protocol):
    """What brings a save's shards (each on one device) to the host later, within a host-memory budget: a
    :class:`~jaxstow._write.host_budget.HostBudget`."""

    def defer(self, leaf: Any, *, copy: bool, within: tuple[slice, ...] | None = None) -> Deferred | None:
        """A :class:`Deferred` for ``leaf`` (or its part ``within``) if its host copy costs memory, else ``None``."""

    def replica_print(self, leaf: Any) -> str | None:
        """The :func:`~jaxstow._format.replicas.replica_print` of ``leaf``, read within the budget, or ``None``."""


class EncodedLeaf(NamedTuple):
    """A leaf ready to write: its manifest entry and, for stored leaves, its bytes as a C-contiguous array.

    A sharded array has its distinct shards instead; an array whose bytes a save's host budget brings later, a
    :class:`~jaxstow._format.pieces.Deferred`.
    """

    entry: Entry
    array: HostArray | None = None
    shards: tuple[EncodedShard, ...] = ()
    #: A sharded array's layout over every device of every process (which processes hold each box), hashed: the
    #: processes saving it must agree on it, or their files would not cover the array exactly once.
    holders: str = ""
    #: Of a sharded array, each set of processes that holds some of its boxes (its replicas), with the prints of
    #: those boxes where this process is one of the set ("" where not), which must agree between the set's members.
    replicas: tuple[tuple[Holders, str], ...] = ()

    def tensors(self) -> list[tuple[str, HostArray, Entry]]:
        """Each tensor this leaf stores: its name, its bytes and the entry that receives its checksum."""
        if self.array is not None:
            return [(self.entry["path"], self.array, self.entry)]
        return [(shard.entry["tensor"], shard.array, shard.entry) for shard in self.shards]


_ONE_DEVICE = jax.sharding.SingleDeviceSharding


def is_sharded(leaf: Any) -> bool:
    """Whether ``leaf`` is a ``jax.Array`` laid out over several devices (or not all held by this process)."""
    if not isinstance(leaf, jax.Array) or type(leaf.sharding) is _ONE_DEVICE:
        return False  # on one device: saved whole (refused by encode_leaf if another process holds it)
    return len(leaf.sharding.device_set) > 1 or not leaf.is_fully_addressable


def encode_leaf(path: str, leaf: Any, *, file: str | None = None, defer: Deferral | None = None) -> EncodedLeaf:
    """Classify one leaf and turn it into a manifest entry (plus its host array for stored leaves).

    ``defer`` may take each shard of a sharded array (the part of it this process writes), to be brought to the host
    later, and print the shards that several processes hold within its budget.
    """
    # The common case first, in as few steps as possible: an array on the host or on one device, whose dtype the
    # file stores.
    on_one_device = type(leaf) is np.ndarray or (
        isinstance(leaf, jax.Array) and type(leaf.sharding) is _ONE_DEVICE and on_own_device(leaf)
    )
    if on_one_device and name_of_dtype(leaf.dtype) is not None:
        array = np.asarray(leaf)
        if array.flags.c_contiguous:
            return EncodedLeaf({"path": path, "kind": "array"}, array)
    if type(leaf) is KeyData:
        stored = _stored(path, "key", leaf.data, file)
        stored.entry["impl"] = leaf.impl
        return stored
    if isinstance(leaf, jax.Array):
        if (problem := held_elsewhere(leaf)) is not None:
            raise ShardingError(problem, file=file, path=path)
        # Typed PRNG keys have one of jax's extended dtypes; every other array a numpy dtype.
        if not isinstance(leaf.dtype, np.dtype) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            stored = _stored(path, "key", jax.random.key_data(leaf), file)
            stored.entry["impl"] = key_impl_name(leaf.dtype)
            return stored
        if is_sharded(leaf):
            return _encode_sharded(path, leaf, file=file, defer=defer)
        return _stored(path, "array", leaf, file)
    if is_tensor(leaf):
        return _stored(path, "torch", tensor_to_numpy(leaf, file=file, path=path), file)
    if isinstance(leaf, np.ndarray):
        return _stored(path, "array", leaf, file)
    if isinstance(leaf, np.generic) and not isinstance(leaf, np.void | np.str_ | np.bytes_ | np.object_):
        return _stored(path, "npscalar", leaf, file)
    value = leaf.value if type(leaf) is EncodedValue else encode_value(leaf, path=path, file=file)
    return EncodedLeaf({"path": path, "kind": "value", "value": value})


def key_impl_name(dtype: Any) -> str:
    """The registered name of a PRNG key dtype's implementation, which ``jax.random.key`` takes back.

    Such as ``threefry2x32``, ``rbg``, ``unsafe_rbg``; older jax prints an implementation by a shorter tag (``fry``) it
    does not take.
    """
    return str(dtype._impl.name)


def _encode_sharded(path: str, leaf: jax.Array, *, file: str | None, defer: Deferral | None) -> EncodedLeaf:
    """A sharded array as this process's share of its distinct shards, each with its box in the whole array.

    A shard held by several processes (replicated) is cut into as many ranges along its first axis long enough, one
    written by each of them, so that they share its writing; a shard held by one process alone is written whole.
    Those that several processes hold are printed (:func:`~jaxstow._format.replicas.replica_print`) for their
    holders to compare: copies that differ would be saved as a mix of them. A shard (or the part of it this process
    writes) that ``defer`` takes is brought to the host while written, and printed within its budget.
    """
    shards = []
    held_by = holders(leaf.sharding, leaf.shape)
    prints: dict[Holders, list[str]] = {processes: [] for processes in shared_by(leaf.sharding, leaf.shape)}
    me = jax.process_index()
    chosen: dict[Box, Any] = {}
    for shard in leaf.addressable_shards:
        whole = as_box(shard.index, leaf.shape)
        if whole not in chosen or shard.replica_id < chosen[whole].replica_id:
            chosen[whole] = shard
    for whole, shard in chosen.items():
        processes = held_by[whole]
        box, within = share_box(whole, processes.index(me), len(processes))
        if len(processes) > 1:
            printed = None if defer is None else defer.replica_print(shard.data)
            printed = printed or replica_print(_host_part(shard.data, None, path=path, file=file))
            prints[tuple(processes)].append(f"{whole}:{printed}")
        if box is None:
            continue
        deferred = None if defer is None else defer.defer(shard.data, copy=False, within=within)
        stored = _host_part(shard.data, within, path=path, file=file) if deferred is None else deferred
        name = f"{path}@" + ",".join(f"{start}:{stop}" for start, stop in box)
        shards.append(EncodedShard({"tensor": name, "box": [list(axis) for axis in box]}, stored))
    shards.sort(key=lambda shard: shard.entry["box"])
    _, dtype = _host_array(np.empty(0, leaf.dtype), path=path, file=file)
    entry: Entry = {"path": path, "kind": "sharded", "dtype": dtype, "shape": list(leaf.shape)}
    entry["shards"] = [shard.entry for shard in shards]
    entry["sharding"] = describe_sharding(leaf.sharding)
    replicas = tuple((processes, ",".join(sorted(found))) for processes, found in prints.items())
    return EncodedLeaf(entry, None, tuple(shards), holders_digest(leaf.sharding, leaf.shape), replicas)


def _host_part(shard: jax.Array, within: tuple[slice, ...] | None, *, path: str, file: str | None) -> np.ndarray:
    """A shard's bytes on the host (or those of its part ``within``), C-contiguous."""
    data, _ = _host_array(shard, path=path, file=file)
    return data if within is None else np.ascontiguousarray(data[within])


def _stored(path: str, kind: str, leaf: Any, file: str | None) -> EncodedLeaf:
    """A stored leaf: its bytes on the host and its entry."""
    array, _ = _host_array(leaf, path=path, file=file)
    return EncodedLeaf({"path": path, "kind": kind}, array)


def _host_array(leaf: Any, *, path: str, file: str | None) -> tuple[np.ndarray, str]:
    """``leaf``'s bytes on the host, C-contiguous and in native byte order, and the name of its dtype.

    A masked array, whose mask would be lost, and a dtype outside the table are refused.
    """
    if isinstance(leaf, np.ma.MaskedArray):
        raise UnsaveableObjectError(
            leaf,
            file=file,
            path=path,
            advice="a numpy masked array, whose mask a file does not hold: save its .data and .mask as two leaves, "
            "or .filled(value) of it",
        )
    array = np.asarray(leaf)
    dtype = name_of_dtype(array.dtype)
    if dtype is None:
        native = array.dtype.newbyteorder("=")
        dtype = name_of_dtype(native) if array.dtype.byteorder not in "=|" else None
        if dtype is None:
            what = "a numpy scalar" if isinstance(leaf, np.generic) else "an array"
            advice = unstored_dtype_advice(array.dtype, what)
            raise UnsaveableObjectError(leaf, file=file, path=path, advice=advice)
        array = array.astype(native)
    if not array.flags.c_contiguous:
        array = array.copy(order="C")
    return array, dtype


class StoredLeaf(NamedTuple):
    """A validated manifest entry of a stored leaf."""

    path: str
    kind: str
    dtype: np.dtype
    shape: tuple[int, ...]
    checksum: str | None
    impl: str | None
    #: Where an array or PRNG keys lay on one device other than the first, as
    #: :func:`~jaxstow._format.sharding_description.whole_placement` records it; ``None`` for the first device.
    sharding: dict[str, Any] | None = None
    #: Its blocks' checksums as the manifest gives them, checked where used (:mod:`~jaxstow._format.block_checksums`).
    blocks: object = None

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def stored_leaf_from_entry(entry: Entry, slot: TensorSlot | None, *, file: str) -> StoredLeaf:
    """Check one manifest entry of a stored leaf against the tensor ``slot`` that holds it.

    Every number is validated before it is trusted; the tensor holds the leaf either exactly (same dtype and shape)
    or as raw bytes (``uint8`` of the leaf's size).
    """
    path = entry["path"]
    if slot is None:
        raise FormatError("the manifest lists this leaf but the file holds no tensor for it", file=file, path=path)
    name, shape = entry.get("dtype"), entry.get("shape")
    if name == name_of_dtype(slot.dtype) and shape == list(slot.shape):  # stored exactly: the slot is validated
        dtype, dims = slot.dtype, slot.shape
    else:
        dtype, dims = raw_leaf_layout(entry, slot, file=file)
    checksum = entry.get("xxh3")
    if checksum is not None and not isinstance(checksum, str):
        raise FormatError(f"malformed checksum {excerpt(checksum)}", file=file, path=path)
    impl = entry.get("impl")
    if entry["kind"] == "key" and not isinstance(impl, str):
        raise FormatError("a PRNG key entry needs its implementation name", file=file, path=path)
    if entry["kind"] == "npscalar" and dims:
        raise FormatError(f"a numpy scalar has shape [], not {list(dims)}", file=file, path=path)
    sharding = entry.get("sharding") if entry["kind"] in ("array", "key") else None
    ndim = len(dims) - (entry["kind"] == "key")  # a key's data axis is no axis of the keys' array
    if sharding is not None:
        check_whole_placement(sharding, ndim, file=file, path=path)
    elif entry["kind"] == "key" and entry.get("keys_sharding") is not None:  # keys laid out on several devices
        sharding = entry["keys_sharding"]
        check_sharding_description(sharding, ndim, file=file, path=path)
    return StoredLeaf(path, entry["kind"], dtype, dims, checksum, impl, sharding, entry.get("blocks"))


def raw_leaf_layout(entry: Entry, slot: TensorSlot, *, file: str) -> tuple[np.dtype, tuple[int, ...]]:
    """The dtype and shape of a leaf stored as raw bytes, after checking that the slot holds exactly its bytes."""
    path, name, shape = entry["path"], entry.get("dtype"), entry.get("shape")
    dtype = dtype_from_name(name) if isinstance(name, str) else None
    if dtype is None:
        raise FormatError(f"unknown dtype {excerpt(name)}", file=file, path=path)
    shape = checked_shape(shape, dtype, file=file, path=path)
    if not (slot.dtype == np.uint8 and slot.shape == (math.prod(shape) * dtype.itemsize,)):
        raise FormatError(
            f"the manifest says {dtype}{shape} but the tensor is {slot.dtype}{list(slot.shape)}", file=file, path=path
        )
    return dtype, tuple(shape)


def decode_value_entry(entry: Entry, *, file: str) -> Any:
    """The Python value of a ``value`` entry."""
    return decode_value(entry.get("value"), path=entry["path"], file=file)


def check_entry(entry: Any, index: int, slots: Mapping[str, TensorSlot], *, file: str) -> None:
    """Check the manifest entry ``entry`` (the ``index``-th) of a leaf of a file holding the tensors ``slots``.

    A stored leaf's dtype and shape are filled in from its tensor where the entry leaves them out; a
    :class:`FormatError` names the field that is wrong.
    """
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


def tensor_names(manifest: dict[str, Any]) -> list[str]:
    """The names of the tensors a checked manifest's leaves are stored in, once for each (a sharded leaf's shards each
    have one)."""
    names: list[str] = []
    for entry in manifest["leaves"]:
        if entry["kind"] == "sharded":
            names.extend(shard["tensor"] for shard in entry["shards"])
        elif entry["kind"] != "value":
            names.append(entry["path"])
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
