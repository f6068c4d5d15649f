"""``jaxstow.save``, ``jaxstow.load`` and ``jaxstow.load_metadata``: a pytree to one file and back.

A model comes back whole (arrays, hyperparameters, the functions it names) or fitted into a structure; see
docs/saving-and-loading.md and docs/restoring.md.

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
from typing import Any, Unpack, cast

import jax
import numpy as np

from jaxstow._format.source import ReadSource
from jaxstow._read.foreign import read_foreign
from jaxstow._read.memory_tree import TreeInMemory
from jaxstow._read.options import LoadOptions
from jaxstow._read.reader import HUGGING_FACE_OPTIONS, open_folder_at, open_reader_at
from jaxstow._read.restore import restore
from jaxstow._storage.opening import Location, PathOrFile, display_name, locate, reached
from jaxstow._storage.settings import StorageSettings, storage_settings
from jaxstow._storage.transfer import Transfer
from jaxstow._util.arguments import checked_arguments
from jaxstow._util.deprecation import moved_keywords
from jaxstow._util.gc_pause import gc_paused
from jaxstow._util.progress import bar as progress_bar
from jaxstow._write.encoded import encode_tree
from jaxstow._write.host_budget import HostBudget
from jaxstow._write.taken_apart import take_apart
from jaxstow.errors import ArgumentError, excerpt

__all__ = ["load", "load_metadata", "save"]


@checked_arguments
def save(
    path_or_file: PathOrFile,
    tree: Any,
    *,
    metadata: dict[str, Any] | None = None,
    progress: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    transfer: Transfer | None = None,
    host_memory_limit: int | None = None,
) -> None:
    """Save a pytree, with its structure, to a file.

    A name ending in ``.npz`` gets an npz archive, any other name the native format (safetensors with the jaxstow
    manifest). A name or URL is written atomically, a file object from its position, cut where the save ends.
    FlareJax's ``save(tree, path)`` is taken too, whatever methods the tree has. See docs/saving-and-loading.md.

    Args:
        path_or_file: a file name, an fsspec URL or a binary file object.
        tree: the pytree: arrays, Python values, registered functions and classes.
        metadata: a strict JSON dict kept with the file (:func:`load_metadata` reads it back).
        progress: draw a progress bar of the bytes written (needs ``tqdm``).
        storage_options: fsspec's options, for a URL.
        transfer: the requests in flight, their size and a bandwidth cap, for a URL.
        host_memory_limit: bytes of accelerator arrays held on the host at once (default: a quarter of physical
            memory); see docs/accelerators.md.

    Raises:
        UnsaveableObjectError: a leaf is neither data nor registered with :func:`jaxstow.saveable`.
        MetadataError: ``metadata`` is not strict JSON.

    >>> import jax.numpy as jnp, jaxstow, os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "weights.npz")
    >>> jaxstow.save(path, {"w": jnp.arange(3.0)})
    >>> import numpy as np; np.load(path, allow_pickle=False)["w"]
    array([0., 1., 2.], dtype=float32)
    """
    # FlareJax's order: a Path after anything but a Path or a file, or a str after anything no destination.
    flarejax_order = isinstance(tree, os.PathLike) and not isinstance(path_or_file, os.PathLike | io.IOBase)
    if flarejax_order or (isinstance(tree, str) and not isinstance(path_or_file, str | os.PathLike | io.IOBase)):
        path_or_file, tree = tree, path_or_file
    _refuse_two_strings(path_or_file, tree)
    if not _is_destination(path_or_file):
        raise ArgumentError(f"save writes to a path or a binary file object, not {type(path_or_file).__name__}")
    if not isinstance(progress, bool | np.bool_):  # progress="no" would draw a bar
        raise ArgumentError(f"progress= takes True or False, not {excerpt(progress)}")
    if getattr(path_or_file, "closed", False) or isinstance(path_or_file, io.TextIOBase):
        what = "closed" if getattr(path_or_file, "closed", False) else "open in text mode"
        raise ArgumentError(f"save writes to a binary file object; this one is {what}: open it with mode 'wb'")
    settings = storage_settings(storage_options, transfer, None)
    name = display_name(path_or_file)
    parts = take_apart(tree, file=name, paused=gc_paused).computed()  # the caller's code, and the wait, unpaused
    with gc_paused():  # the tree's objects, which live until it is written: see jaxstow._util.gc_pause
        encoded = encode_tree(parts, metadata=metadata, file=name, hosting=HostBudget(host_memory_limit))
        nbytes = encoded.nbytes
    with progress_bar(nbytes, f"saving {name}", enabled=progress) as bar:
        encoded.write(path_or_file, bar=bar, settings=settings)


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
    """Load the pytree of a file written by :func:`save`, by safetensors or by ``numpy.savez``.

    Without ``like`` the whole tree is rebuilt from the file; with ``like`` the file's leaves are fitted into its
    structure, all or nothing, each landing on its leaf's sharding. See docs/restoring.md.

    Args:
        path_or_file: a file name, an fsspec URL or a binary file object.
        like: a pytree of arrays or ``jax.ShapeDtypeStruct`` to fit the leaves into; ``None`` rebuilds the tree.
        from_format: ``"torch"``, ``"flax"``, ``"orbax"`` or ``"equinox"``: read a file of that library.
        storage_options: fsspec's options, for a URL.
        transfer: the requests in flight, their size and a bandwidth cap, for a URL.
        cache_dir: a folder keeping a local copy of a remote file, used again while it matches.
        **options: the options of :class:`jaxstow.LoadOptions` (``as_numpy``, ``sharding``, ``select``, ...).
            ``names=`` and ``transposed=`` are deprecated here: :func:`jaxstow.huggingface.load` takes them.

    Raises:
        StructureMismatchError: ``like`` does not fit; the message lists every mismatched leaf.
        FormatError: the file is not one jaxstow reads; the message names what reads it.

    >>> import io, jax, jax.numpy as jnp, jaxstow
    >>> buffer = io.BytesIO()
    >>> jaxstow.save(buffer, {"w": jnp.ones(2)}); _ = buffer.seek(0)
    >>> jaxstow.load(buffer, like={"w": jax.ShapeDtypeStruct((2,), jnp.float32)})
    {'w': Array([1., 1.], dtype=float32)}
    """
    view: dict[str, Any] = {}
    if options.keys() & set(HUGGING_FACE_OPTIONS):  # deprecated here: jaxstow.huggingface.load takes them
        given = cast(dict[str, Any], options)
        view = moved_keywords("jaxstow.load", given, HUGGING_FACE_OPTIONS, use="jaxstow.huggingface.load")
    settings = reached(storage_options, transfer, cache_dir)
    location = locate(path_or_file)
    if from_format is not None:
        return _load_foreign(location, like, from_format, options, settings)
    if view:
        with open_folder_at(location, settings, **view) as folder:
            return folder.load(like, **options)
    with open_reader_at(location, settings) as reader:
        return reader.load(like, **options)  # what a store sent damaged, or a copy of it, is fetched again there


def _load_foreign(
    location: Location, like: Any, from_format: str, options: LoadOptions, settings: StorageSettings | None
) -> Any:
    """A file of another library, read into memory, then restored from there as a jaxstow file is (equinox: into
    ``like``); errors name the file."""
    other = sorted(set(options) - {"as_numpy", "progress"})
    if from_format == "equinox" and other:  # told before the stream is read: cast=True is no answer to its dtypes
        raise ArgumentError(f"from_format='equinox' reads into like, without the options {other}")
    tree = read_foreign(location, from_format, like=like, settings=settings)
    if from_format == "equinox":
        as_numpy = options.get("as_numpy", False)
        return jax.tree.map(lambda leaf: np.asarray(leaf) if as_numpy and isinstance(leaf, jax.Array) else leaf, tree)
    with TreeInMemory(tree, name=location.name) as opened:
        return restore(opened, like, **options)


def _refuse_two_strings(path: Any, tree: Any) -> None:
    """Refuse ``save("hello", "vocab.jxs")``: jaxstow's order writes the string ``"vocab.jxs"`` to a file named
    ``hello``, where FlareJax's order (``save(tree, path)``), whose destination the second names, was meant."""
    suffixes = (".jxs", ".safetensors", ".npz")
    if isinstance(path, str) and isinstance(tree, str) and tree.endswith(suffixes) and not path.endswith(suffixes):
        raise ArgumentError(
            f"save got two strings, {excerpt(path)} and {excerpt(tree)}: save(path, tree) would write the second to "
            "a file named as the first, yet the second names a file; to save a string, give the path as a "
            "pathlib.Path, whichever is the destination"
        )


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
    """Read the ``metadata`` dict saved with a file, from its header alone.

    Args:
        path_or_file: a file name, an fsspec URL or a binary file object.
        storage_options: fsspec's options, for a URL.
        transfer: the requests in flight, their size and a bandwidth cap, for a URL.
        cache_dir: a folder keeping a local copy of a remote file.

    Returns:
        The dict given to :func:`save`; a plain safetensors file's own ``__metadata__``; ``None`` for a file
        without metadata.

    >>> import io, numpy as np, jaxstow
    >>> from safetensors.numpy import save
    >>> jaxstow.load_metadata(io.BytesIO(save({"x": np.ones(2)}, metadata={"source": "hub"})))
    {'source': 'hub'}
    """
    with open_reader_at(locate(path_or_file), reached(storage_options, transfer, cache_dir)) as reader:
        return reader.metadata
