"""Reading stored leaves back: checked against the manifest, verified against their checksums, placed on devices.

>>> import io, jax.numpy as jnp, jaxstow
>>> from jaxstow.format.container import open_container
>>> from jaxstow.restore import rebuild
>>> buffer = io.BytesIO()
>>> jaxstow.save(buffer, (jnp.ones(2), "label"))
>>> _ = buffer.seek(0)
>>> rebuild(open_container(buffer), as_numpy=True)
(array([1., 1.], dtype=float32), 'label')
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxstow.errors import CorruptFileError, FormatError
from jaxstow.format.checksum import checksum_bytes
from jaxstow.format.container import Container
from jaxstow.format.leaves import StoredLeaf, decode_value_entry, stored_leaf_from_entry
from jaxstow.format.torch_leaves import tensor_from_numpy
from jaxstow.structure import decode_treedef

__all__ = ["load_flat", "read_stored", "rebuild", "stored_leaves", "to_output"]

_ADOPT_BYTES = 1 << 16  # from this size on, arrays are handed to jax in one batch rather than copied


def load_flat(container: Container, *, as_numpy: bool) -> dict[str, Any]:
    names = sorted(container.slots)
    arrays = container.read(names)
    return dict(zip(names, to_output([arrays[name] for name in names], as_numpy=as_numpy), strict=True))


def rebuild(container: Container, *, as_numpy: bool) -> Any:
    assert container.manifest is not None
    manifest = container.manifest
    entries = manifest["leaves"]
    treedef = decode_treedef(manifest.get("structure"), file=container.file)
    if treedef.num_leaves != len(entries):
        raise FormatError(
            f"the structure has {treedef.num_leaves} leaves but the manifest lists {len(entries)}", file=container.file
        )
    stored = stored_leaves(container)
    data = read_stored(container, list(stored.values()))
    values: list[Any] = []
    for entry in entries:
        if isinstance(entry, dict) and entry.get("kind") == "value":
            values.append(decode_value_entry(entry, file=container.file))
        else:
            values.append(data[entry["path"]])
    arrays = [i for i, value in enumerate(values) if isinstance(value, np.ndarray)]
    for i, placed in zip(arrays, to_output([values[i] for i in arrays], as_numpy=as_numpy), strict=True):
        values[i] = placed
    return treedef.unflatten(values)


def stored_leaves(container: Container) -> dict[str, StoredLeaf]:
    """The manifest's stored leaves, each checked against the tensor that holds it."""
    assert container.manifest is not None
    out: dict[str, StoredLeaf] = {}
    for entry in container.manifest["leaves"]:
        if not (isinstance(entry, dict) and isinstance(entry.get("path"), str)):
            raise FormatError(f"malformed manifest entry {entry!r}", file=container.file)
        kind = entry.get("kind")
        if kind in ("array", "npscalar", "key", "torch"):
            out[entry["path"]] = stored_leaf_from_entry(entry, container.slots.get(entry["path"]), file=container.file)
        elif kind != "value":
            raise FormatError(f"unknown leaf kind {kind!r}", file=container.file, path=entry["path"])
    return out


def read_stored(container: Container, leaves: Sequence[StoredLeaf]) -> dict[str, Any]:
    """Read and verify stored leaves; arrays come back as numpy, numpy scalars and PRNG keys as themselves."""
    expected = {leaf.path: leaf.checksum for leaf in leaves}

    def verify(name: str, data: memoryview) -> None:
        wanted = expected.get(name)
        if wanted is not None and (found := checksum_bytes(data)) != wanted:
            raise CorruptFileError(
                f"checksum mismatch (expected xxh3 {wanted}, found {found}): the file is corrupt",
                file=container.file,
                path=name,
            )

    arrays = container.read([leaf.path for leaf in leaves], verify)
    out: dict[str, Any] = {}
    for leaf in leaves:
        array = arrays[leaf.path]
        if array.dtype != leaf.dtype or array.shape != leaf.shape:
            array = array.reshape(-1).view(np.uint8).view(leaf.dtype).reshape(leaf.shape)
        if leaf.kind == "npscalar":
            out[leaf.path] = array[()]
        elif leaf.kind == "torch":
            out[leaf.path] = tensor_from_numpy(array, file=container.file, path=leaf.path)
        elif leaf.kind == "key":
            out[leaf.path] = jax.random.wrap_key_data(jax.device_put(array), impl=leaf.impl)
        else:
            out[leaf.path] = array
    return out


def to_output(arrays: list[np.ndarray], *, as_numpy: bool, shardings: Sequence[Any] | None = None) -> list[Any]:
    """Numpy arrays as the caller wants them: unchanged, or placed on devices.

    Large arrays go in one ``device_put`` batch, which adopts 64-byte-aligned host buffers without a copy; small
    ones are copied by ``jnp.asarray``, which costs less per array than a batch entry.
    """
    if as_numpy or not arrays:
        return list(arrays)
    if shardings is not None:
        return list(jax.device_put(arrays, list(shardings)))
    out: list[Any] = list(arrays)
    large = [i for i, array in enumerate(arrays) if array.nbytes >= _ADOPT_BYTES]
    for i, placed in zip(large, jax.device_put([arrays[i] for i in large]), strict=True):
        out[i] = placed
    large_set = set(large)
    for i, array in enumerate(arrays):
        if i not in large_set:
            out[i] = jnp.asarray(array)
    return out
