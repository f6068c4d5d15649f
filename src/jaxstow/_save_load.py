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

import io
import os
from collections.abc import Mapping
from typing import Any, Unpack

import jax
import numpy as np

from jaxstow._format.source import ReadSource
from jaxstow._read.foreign import read_foreign
from jaxstow._read.options import LoadOptions
from jaxstow._read.reader import Reader, open_container_at
from jaxstow._storage.opening import Location, locate
from jaxstow._storage.paths import PathOrFile, display_name
from jaxstow._storage.settings import StorageSettings, storage_settings
from jaxstow._storage.transfer import Transfer
from jaxstow._util.gc_pause import with_gc_paused
from jaxstow._util.progress import bar as progress_bar
from jaxstow._write.encoded import encode_tree
from jaxstow.errors import ArgumentError

__all__ = ["load", "load_metadata", "save"]


@with_gc_paused
def save(
    path_or_file: PathOrFile,
    tree: Any,
    *,
    metadata: dict[str, Any] | None = None,
    progress: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    transfer: Transfer | None = None,
) -> None:
    """Save a pytree, with its structure, to a file name, an fsspec URL or a binary file object.

    A name ending in ``.npz`` gets an npz archive; any other name gets the native format, a safetensors file with the
    jaxstow manifest. A name is written atomically (temporary file, fsync, rename); a URL too, in the store's terms:
    on ``s3://`` a multipart upload, parts sent in parallel, that the object appears from only once complete (a failed
    save leaves the previous object and no upload behind), on other stores a temporary object moved into place. A file
    object is written as is. ``metadata`` is a JSON-able dict kept with the file (read it back with
    :func:`load_metadata`). ``progress=True`` draws a progress bar of the bytes written, their rate and the time left
    (needs ``tqdm``). For a URL, ``storage_options`` go to fsspec and ``transfer`` (a :class:`jaxstow.Transfer`) sets
    the parts in flight, their size and a bandwidth cap. FlareJax's order, ``save(tree, path)``, is taken too: when
    the first argument is neither a path nor a file and the second is a path, they are read the other way round.

    >>> import jax.numpy as jnp, jaxstow, os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "weights.npz")
    >>> jaxstow.save(path, {"w": jnp.arange(3.0)})
    >>> import numpy as np; np.load(path, allow_pickle=False)["w"]
    array([0., 1., 2.], dtype=float32)
    """
    if not _is_destination(path_or_file) and isinstance(tree, str | os.PathLike):
        path_or_file, tree = tree, path_or_file
    if not _is_destination(path_or_file):
        raise ArgumentError(f"save writes to a path or a binary file object, not {type(path_or_file).__name__}")
    settings = storage_settings(storage_options, transfer, None)
    name = display_name(path_or_file)
    encoded = encode_tree(tree, metadata=metadata, file=name)
    with progress_bar(encoded.nbytes, f"saving {name}", enabled=progress) as bar:
        encoded.write(path_or_file, bar=bar, settings=settings)


@with_gc_paused
def load(
    path_or_file: PathOrFile | ReadSource,
    like: Any = None,
    *,
    from_format: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    transfer: Transfer | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    **options: Unpack[LoadOptions],
) -> Any:
    """Load a file written by :func:`save`, by safetensors or by ``numpy.savez`` (a path, a file object or a URL).

    Without ``like`` the whole tree is rebuilt from the file: containers, registered dataclasses, equinox modules with
    their hyperparameters, optax states; Python scalars and strings keep their type, arrays come back as ``jax.Array``.
    A file without a jaxstow manifest loads as a flat dict of its tensors.

    With ``like``, the file's leaves are fitted into ``like``'s structure. ``like``'s leaves may be arrays (jax or
    numpy) or ``jax.ShapeDtypeStruct`` (from ``jax.eval_shape``, ``eqx.filter_eval_shape``, ``nnx.eval_shape``), each
    landing on its own sharding. It is all or nothing: any missing, unexpected or mismatched leaf raises one
    :class:`~jaxstow.errors.StructureMismatchError` listing every problem.

    The options (``as_numpy``, ``sharding``, ``partial``, ``select``, ``cast``, ``progress``) are those of
    :class:`jaxstow.LoadOptions`.

    A file of another library raises a :class:`~jaxstow.errors.FormatError` that names it and what reads it.
    ``from_format`` reads it, into memory, then as above: ``"torch"`` (a ``torch.save`` state dict, through
    ``torch.load(weights_only=True)``), ``"flax"`` (flax msgpack, as nested dicts), ``"orbax"`` (an orbax checkpoint
    folder or a step of its ``CheckpointManager``, every item) and ``"equinox"`` (a ``tree_serialise_leaves`` stream,
    read into ``like``; of the options only ``as_numpy``).

    A URL is read as :func:`jaxstow.open` reads it: ``storage_options`` to fsspec, ``transfer`` for the requests in
    flight (their size, a bandwidth cap), ``cache_dir`` for a local copy used again while it matches.

    >>> import io, jax, jax.numpy as jnp, jaxstow
    >>> buffer = io.BytesIO()
    >>> jaxstow.save(buffer, {"w": jnp.ones(2), "b": jnp.zeros(1)})
    >>> _ = buffer.seek(0)
    >>> jaxstow.load(buffer, like={"w": jax.ShapeDtypeStruct((2,), jnp.float32), "b": jnp.ones(1)})["w"]
    Array([1., 1.], dtype=float32)
    """
    settings = storage_settings(storage_options, transfer, cache_dir)
    location = locate(path_or_file)
    if from_format is not None:
        return _load_foreign(location, like, from_format, options, settings)
    with Reader(open_container_at(location, settings)) as reader:
        return reader.load(like, **options)


def _load_foreign(
    location: Location, like: Any, from_format: str, options: LoadOptions, settings: StorageSettings
) -> Any:
    """A file of another library, read into memory, then restored as a jaxstow file is (equinox: into ``like``)."""
    tree = read_foreign(location, from_format, like=like, settings=settings)
    if from_format == "equinox":
        other = sorted(set(options) - {"as_numpy", "progress"})
        if other:
            raise ArgumentError(f"from_format='equinox' reads into like, without the options {other}")
        as_numpy = options.get("as_numpy", False)
        return jax.tree.map(lambda leaf: np.asarray(leaf) if as_numpy and isinstance(leaf, jax.Array) else leaf, tree)
    buffer = io.BytesIO()
    save(buffer, tree)
    buffer.seek(0)
    with Reader(open_container_at(Location(location.name, file=buffer))) as reader:  # named as the file in errors
        return reader.load(like, **options)


def _is_destination(target: Any) -> bool:
    """Whether ``target`` is something to save to: a path or a writable file object."""
    return isinstance(target, str | os.PathLike) or callable(getattr(target, "write", None))


def load_metadata(
    path_or_file: PathOrFile | ReadSource,
    *,
    storage_options: Mapping[str, Any] | None = None,
    transfer: Transfer | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> dict[str, Any] | None:
    """The ``metadata`` dict saved with a file, read from its header alone (a URL as :func:`load` reads it).

    For a plain safetensors file, its own ``__metadata__`` (strings by string keys); ``None`` for a file without
    metadata.

    >>> import io, numpy as np, jaxstow
    >>> from safetensors.numpy import save
    >>> jaxstow.load_metadata(io.BytesIO(save({"x": np.ones(2)}, metadata={"source": "hub"})))
    {'source': 'hub'}
    """
    settings = storage_settings(storage_options, transfer, cache_dir)
    with Reader(open_container_at(locate(path_or_file), settings)) as reader:
        return reader.metadata
