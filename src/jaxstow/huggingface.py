"""Hugging Face folders in and out: the hub's folders of safetensors files read as one lazy file, and written.

A folder holds ``model.safetensors.index.json``, whose ``weight_map`` names the file of every tensor, and those files
(or ``*.safetensors`` files without an index). :func:`load` and :func:`open` read one, local or at a URL, as
:func:`jaxstow.load` and :func:`jaxstow.open` read a file, and take the options that only a folder's tensors need:
``names=`` gives each tensor its path in the tree (``a.b.0.c`` fills ``a/b/0/c`` by default) and ``transposed=``
marks the 2-d tensors stored turned over (torch's ``Linear.weight`` is ``(out, in)``, flax's ``Dense`` kernel
``(in, out)``). :func:`export_safetensors` writes such a folder from a checkpoint step or a file. See
docs/other-formats.md.

>>> import os, tempfile, numpy as np, jaxstow
>>> from jaxstow import huggingface
>>> folder = tempfile.mkdtemp()
>>> jaxstow.save(os.path.join(folder, "model.jxs"), {"fc": {"weight": np.arange(6.0).reshape(2, 3)}})
>>> _ = huggingface.export_safetensors(os.path.join(folder, "model.jxs"), os.path.join(folder, "hf"))
>>> like = {"dense": {"kernel": np.zeros((3, 2))}}
>>> params = huggingface.load(os.path.join(folder, "hf"), like, names={"fc.weight": "dense/kernel"},
...                           transposed={"fc.weight"}, as_numpy=True)
>>> params["dense"]["kernel"][:, 0]
array([0., 1., 2.])
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Unpack

from jaxstow._read.folder_file import Names, Transposed
from jaxstow._read.options import LoadOptions
from jaxstow._read.reader import FolderReader, open_folder_at
from jaxstow._storage.opening import Readable, locate, reached
from jaxstow._storage.transfer import Transfer
from jaxstow.checkpoint.hf_export import export_safetensors
from jaxstow.errors import ArgumentError

__all__ = ["export_safetensors", "load", "open"]


def load(
    folder: Readable,
    like: Any = None,
    *,
    names: Names | None = None,
    transposed: Transposed | None = None,
    storage_options: Mapping[str, Any] | None = None,
    transfer: Transfer | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    **options: Unpack[LoadOptions],
) -> Any:
    """Load the tensors of a folder of safetensors files, as a flat dict by tensor name or into ``like``.

    With ``like``, the tensor ``a.b.0.c`` fills the leaf ``a/b/0/c`` (the path of ``like["a"]["b"][0]["c"]``) unless
    ``names`` maps it elsewhere; a tensor ``transposed`` marks is turned over, whatever its shape.

    Args:
        folder: the folder's path or fsspec URL (``s3://bucket/model/``).
        like: a pytree of arrays or ``jax.ShapeDtypeStruct`` to fit the tensors into; ``None``: a flat dict by path.
        names: each tensor's path: a function ``name -> path`` or a dict (``None``, and for a dict a name it lacks,
            leave the tensor unread).
        transposed: the 2-d tensors stored turned over (torch's ``weight``): a set of names, or a predicate;
            ``()`` (the empty tuple alone): none, every tensor as stored.
        storage_options: fsspec's options, for a URL.
        transfer: the requests in flight, their size and a bandwidth cap, for a URL.
        cache_dir: a folder keeping a local copy of each remote file, used again while it matches.
        **options: the options of :class:`jaxstow.LoadOptions` (``partial``, ``cast``, ``sharding``, ...).

    Raises:
        StructureMismatchError: ``like`` does not fit; the message names each tensor, as stored and as turned.
        ArgumentError: a file rather than a folder, ``names``/``transposed`` that do not fit the tensors, a
            ``transposed`` that splits a layer kind where a square tensor cannot tell, or none that says how the
            square ``weight`` tensors filling ``kernel`` leaves are stored (see docs/other-formats.md).
    """
    with open(folder, names=names, transposed=transposed, storage_options=storage_options, transfer=transfer,
              cache_dir=cache_dir) as reader:  # fmt: skip
        return reader.load(like, **options)


def open(
    folder: Readable,
    *,
    names: Names | None = None,
    transposed: Transposed | None = None,
    storage_options: Mapping[str, Any] | None = None,
    transfer: Transfer | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    **misplaced: Any,
) -> FolderReader:
    """Open a folder of safetensors files lazily, as one file: every file's header is read now, a tensor when asked for.

    The reader's paths are those ``names`` gives the tensors (their names by default); the tensors ``transposed``
    marks read turned over, whole (``reader[path]``), by slices (``reader.read(path, numpy.s_[0])``) and in
    ``reader.load``, which takes ``names`` and ``transposed`` too. Close it, or use it in a ``with`` block.

    Args:
        folder: the folder's path or fsspec URL.
        names: each tensor's path: a function ``name -> path`` (``None`` leaves the tensor out) or a dict.
        transposed: the 2-d tensors stored turned over: a set of names, or a predicate; ``()`` (the empty tuple alone): none.
        storage_options: fsspec's options, for a URL.
        transfer: the requests in flight, their size and a bandwidth cap, for a URL.
        cache_dir: a folder keeping a local copy of each remote file, used again while it matches.

    Raises:
        ArgumentError: a file rather than a folder (:func:`jaxstow.open` reads it).
        FormatError: a file of the folder is damaged or no plain safetensors file; the message names it.
    """
    if misplaced:  # a load option given here (as_numpy=, like=...), or a misspelt keyword
        raise ArgumentError(
            f"huggingface.open() takes no {', '.join(map(repr, misplaced))}: it opens the folder; give load options "
            "to reader.load(...), or call huggingface.load(folder, ...)"
        )
    settings = reached(storage_options, transfer, cache_dir)
    return open_folder_at(locate(folder), settings, names=names, transposed=transposed)
