"""``jaxstow.save`` and ``jaxstow.load``: whole trees, models with their hyperparameters, or weights into a structure.

>>> import io, jax, jax.numpy as jnp, jaxstow
>>> params = {"dense": {"kernel": jnp.ones((2, 3)), "bias": jnp.zeros(3)}, "act": jax.nn.gelu, "depth": 2}
>>> buffer = io.BytesIO()
>>> jaxstow.save(buffer, params, metadata={"step": 7})
>>> _ = buffer.seek(0)
>>> restored = jaxstow.load(buffer)
>>> restored["act"] is jax.nn.gelu, restored["depth"], restored["dense"]["kernel"].shape
(True, 2, (2, 3))
>>> jaxstow.load_metadata(buffer)
{'step': 7}
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO

import numpy as np

from jaxstow.errors import FormatError
from jaxstow.fitting import fit_into
from jaxstow.format.checksum import checksum
from jaxstow.format.container import FORMAT_NAME, FORMAT_VERSION, container_kind, open_container, write_container
from jaxstow.format.leaves import EncodedLeaf, encode_leaf
from jaxstow.restore import load_flat, rebuild
from jaxstow.storage import atomic_write
from jaxstow.structure import encode_treedef
from jaxstow.tree import flatten_with_paths

__all__ = ["load", "load_metadata", "save"]

PathOrFile = str | os.PathLike[str] | BinaryIO
_PARALLEL_HASH_BYTES = 32 << 20


def _display_name(target: Any) -> str:
    if isinstance(target, str | os.PathLike):
        return os.fspath(target)
    return str(getattr(target, "name", f"<{type(target).__name__}>"))


def save(path_or_file: PathOrFile, tree: Any, *, metadata: dict[str, Any] | None = None) -> None:
    """Save a pytree, with its structure, to a file name or a binary file object.

    A name ending in ``.npz`` gets an npz archive; any other name gets the native format, a safetensors file with the
    jaxstow manifest. A name is written atomically (temporary file, fsync, rename); a file object is written as is.
    ``metadata`` is a JSON-able dict kept with the file (read it back with :func:`load_metadata`).

    >>> import jax.numpy as jnp, jaxstow, os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "weights.npz")
    >>> jaxstow.save(path, {"w": jnp.arange(3.0)})
    >>> import numpy as np; np.load(path, allow_pickle=False)["w"]
    array([0., 1., 2.], dtype=float32)
    """
    file = _display_name(path_or_file)
    tensors, manifest = _encode(tree, metadata, file=file)
    kind = container_kind(path_or_file)
    if isinstance(path_or_file, str | os.PathLike):
        with atomic_write(path_or_file) as sink:
            write_container(sink, kind, tensors, manifest)
    else:
        write_container(path_or_file, kind, tensors, manifest)
        path_or_file.flush()


def _encode(tree: Any, metadata: dict[str, Any] | None, *, file: str) -> tuple[list[tuple[str, np.ndarray]], dict[str, Any]]:
    if metadata is not None:
        try:
            json.dumps(metadata, allow_nan=False)
        except (TypeError, ValueError) as error:
            raise TypeError(f"metadata for {file} must be a JSON-able dict: {error}") from None
    paths, leaves, treedef = flatten_with_paths(tree)
    seen: dict[str, int] = {}
    for index, path in enumerate(paths):
        if path in seen:
            raise FormatError(
                f"leaves {seen[path]} and {index} of the tree both have the path {path!r}; rename a key so that "
                "every leaf has its own path",
                file=file,
                path=path,
            )
        seen[path] = index
    encoded = [encode_leaf(path, leaf, file=file) for path, leaf in zip(paths, leaves, strict=True)]
    stored = [leaf for leaf in encoded if leaf.array is not None]
    _add_checksums(stored)
    manifest = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "structure": encode_treedef(treedef, file=file),
        "leaves": [leaf.entry for leaf in encoded],
        "metadata": metadata,
    }
    return [(leaf.entry["path"], leaf.array) for leaf in stored if leaf.array is not None], manifest


def _add_checksums(stored: Sequence[EncodedLeaf]) -> None:
    arrays = [leaf.array for leaf in stored if leaf.array is not None]
    if sum(array.nbytes for array in arrays) > _PARALLEL_HASH_BYTES:
        with ThreadPoolExecutor(min(4, os.cpu_count() or 1)) as pool:
            digests = list(pool.map(checksum, arrays))
    else:
        digests = [checksum(array) for array in arrays]
    for leaf, digest in zip(stored, digests, strict=True):
        leaf.entry["xxh3"] = digest


def load(path_or_file: PathOrFile, like: Any = None, *, as_numpy: bool = False) -> Any:
    """Load a file written by :func:`save`, by safetensors or by ``numpy.savez``.

    Without ``like`` the whole tree is rebuilt from the file: containers, registered dataclasses, equinox modules with
    their hyperparameters, optax states; Python scalars and strings keep their type, arrays come back as ``jax.Array``
    (numpy with ``as_numpy=True``). A file without a jaxstow manifest loads as a flat dict of its tensors.

    With ``like``, the file's leaves are fitted into ``like``'s structure. It is all or nothing: any missing,
    unexpected or mismatched leaf raises one :class:`~jaxstow.errors.StructureMismatchError` listing every problem.

    >>> import io, jax.numpy as jnp, jaxstow
    >>> buffer = io.BytesIO()
    >>> jaxstow.save(buffer, {"w": jnp.ones(2), "b": jnp.zeros(1)})
    >>> _ = buffer.seek(0)
    >>> jaxstow.load(buffer, like={"w": jnp.zeros(2), "b": jnp.ones(1)})["w"]
    Array([1., 1.], dtype=float32)
    """
    container = open_container(path_or_file)
    try:
        if like is not None:
            return fit_into(container, like, as_numpy=as_numpy)
        if container.manifest is None:
            return load_flat(container, as_numpy=as_numpy)
        return rebuild(container, as_numpy=as_numpy)
    finally:
        container.close()


def load_metadata(path_or_file: PathOrFile) -> dict[str, Any] | None:
    """The ``metadata`` dict saved with a file, read from its header alone."""
    container = open_container(path_or_file)
    try:
        manifest = container.manifest or {}
        return manifest.get("metadata")
    finally:
        container.close()
