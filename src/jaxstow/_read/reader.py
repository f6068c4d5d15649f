"""``jaxstow.open`` and :class:`jaxstow.Reader`: a file opened lazily, only its header read until a leaf is asked for.

A :class:`Reader` is an :class:`~jaxstow._read.opened.OpenedFile`, which reads leaves and slices, that also restores
trees (:mod:`jaxstow._read.restore`). See docs/restoring.md.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from typing import Any, Unpack

from jaxstow._format.native_or_npz import Container, open_container
from jaxstow._format.skeleton import with_every_library
from jaxstow._format.source import ReadSource
from jaxstow._read.folder_file import FolderFile, Names, Transposed
from jaxstow._read.foreign import explained
from jaxstow._read.opened import LeafInfo, OpenedFile
from jaxstow._read.options import LoadOptions
from jaxstow._read.restore import restore
from jaxstow._read.sharded_folder import folder_listing, open_folder
from jaxstow._storage.opening import Location, Readable, locate
from jaxstow._storage.settings import StorageSettings, storage_settings
from jaxstow._storage.transfer import Transfer
from jaxstow.errors import ArgumentError, FormatError, IsAFolderError, PathNotFoundError, UnknownNameError

__all__ = ["FolderReader", "LeafInfo", "Reader", "open", "open_container_at", "open_parts", "open_reader_at"]


class Reader(OpenedFile):
    """A file's leaves by path, read on demand; a context manager that closes the file. Made by :func:`jaxstow.open`.

    ``reader[path]`` reads one whole leaf, verified against its checksum; :meth:`read` reads a slice of an array,
    touching only the bytes it needs; :attr:`abstract` is the saved tree with ``jax.ShapeDtypeStruct`` leaves,
    usable as ``like``; :meth:`load` restores the tree, or a part of it. :attr:`paths` lists the leaves and
    :attr:`metadata` is the metadata saved with the file.

    >>> import io, jax.numpy as jnp, numpy as np, jaxstow
    >>> buffer = io.BytesIO()
    >>> jaxstow.save(buffer, {"w": jnp.arange(12.0).reshape(4, 3), "name": "mlp"}, metadata={"step": 3})
    >>> _ = buffer.seek(0)
    >>> with jaxstow.open(buffer) as reader:
    ...     print(reader.paths, reader.metadata, reader.read("w", np.s_[1:3, 0]))
    ...     print(reader.abstract)
    ['name', 'w'] {'step': 3} [3. 6.]
    {'name': 'mlp', 'w': ShapeDtypeStruct(shape=(4, 3), dtype=float32)}
    """

    def load(self, like: Any = None, **options: Unpack[LoadOptions]) -> Any:
        """Restore the tree, or a part of it, as :func:`jaxstow.load` does.

        Args:
            like: a pytree to fit the leaves into; ``None`` rebuilds the tree saved.
            **options: the options of :class:`jaxstow.LoadOptions`.

        Returns:
            The restored pytree.

        Raises:
            StructureMismatchError: ``like`` does not fit; the message lists every mismatched leaf.
            ClosedError: the reader is closed.

        >>> import io, numpy as np, jaxstow
        >>> buffer = io.BytesIO()
        >>> jaxstow.save(buffer, {"w": np.ones(2), "b": np.zeros(1)}); _ = buffer.seek(0)
        >>> with jaxstow.open(buffer) as reader:
        ...     reader.load(like={"w": np.zeros(2)}, partial=True, as_numpy=True)
        {'w': array([1., 1.])}
        """
        self.check_open("loading the tree")
        try:
            return restore(self, like, **options)
        except UnknownNameError as error:  # one error names every library to import, not one library per attempt
            raise with_every_library(error, self.container.manifest, self.value_entries.values()) from None

    def __repr__(self) -> str:
        return f"<jaxstow.Reader {self.file}: {len(self.paths)} leaves>"


class FolderReader(FolderFile, Reader):
    """A folder of safetensors files (a Hugging Face sharded checkpoint) as one lazy file; :func:`jaxstow.open` makes it.

    Its paths are the tensor names, or those ``names`` gives them; the 2-d tensors that ``transposed`` marks are read
    turned over, by ``reader[path]``, :meth:`read` and :meth:`load` alike. :meth:`load` without ``like`` gives a flat
    dict by path; with ``like``, the tensor ``a.b.0.c`` fills the leaf ``a/b/0/c`` unless ``names`` maps it elsewhere.
    See docs/other-formats.md.
    """

    def load(
        self,
        like: Any = None,
        *,
        names: Names | None = None,
        transposed: Transposed | None = None,
        **options: Unpack[LoadOptions],
    ) -> Any:
        """Restore the tensors, as :meth:`Reader.load` does, by path or into ``like``'s paths.

        ``names`` and ``transposed``, when given, stand for those given to :func:`jaxstow.open`.
        """
        self.check_open("loading the tree")
        names = names if names is not None else self.names
        transposed = transposed if transposed is not None else self.transposed
        if like is None and names is None and transposed is None:
            return restore(self, None, **options)
        if names is None and like is None:
            names = str  # without like, the tensors keep their names
        return restore(self.mapped(names, transposed), like, **options)


def open_reader_at(
    location: Location,
    settings: StorageSettings | None = None,
    *,
    mmap: bool = False,
    names: Names | None = None,
    transposed: Transposed | None = None,
) -> Reader:
    """A reader of the file, or of the folder of safetensors files, at ``location``.

    ``names`` and ``transposed`` are for a folder; a URL that names no object is looked at as a folder.
    """
    listing = folder_listing(location, settings) if location.path is not None else None
    if listing is None:
        try:
            reader = Reader(open_container_at(location, settings), mmap=mmap)
        except PathNotFoundError:
            if location.url is None or folder_listing(location, settings) is None:
                raise
        else:
            if names is not None or transposed is not None:
                reader.close()
                raise ArgumentError(
                    f"names= and transposed= are for a folder of safetensors files, and {location.name} is a file"
                )
            return reader
    if mmap:
        raise ArgumentError(f"mmap=True maps one local file, and {location.name} is a folder of safetensors files")
    return open_folder(location, FolderReader, settings, names=names, transposed=transposed)


def open(
    target: Readable,
    *,
    mmap: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    transfer: Transfer | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    names: Names | None = None,
    transposed: Transposed | None = None,
) -> Reader:
    """Open a jaxstow, safetensors or npz file lazily: only its header is read until a leaf is asked for.

    A folder of safetensors files (Hugging Face's index and shards) opens as one :class:`FolderReader` whose paths are
    the tensor names (docs/other-formats.md). Close the reader returned, or use it in a ``with`` block.

    Args:
        target: a file name, an fsspec URL or a binary file object.
        mmap: for a local native file, leaves are read-only numpy views of the memory-mapped file, never copied.
        storage_options: fsspec's options, for a URL.
        transfer: the requests in flight, their size and a bandwidth cap, for a URL.
        cache_dir: a folder keeping a local copy of a remote file, used again while its header checksum matches.
        names: for a folder, each tensor's path (a function ``name -> path``, ``None`` to leave it out, or a mapping).
        transposed: for a folder, the 2-d tensors stored turned over (torch's ``weight``), read turned over whatever
            their shape: names, or a predicate.

    Raises:
        FormatError: the file is not one jaxstow reads; the message names the call that reads it.

    >>> import os, tempfile, jax.numpy as jnp, jaxstow
    >>> path = os.path.join(tempfile.mkdtemp(), "w.jxs")
    >>> jaxstow.save(path, {"w": jnp.ones((1000, 4))})
    >>> with jaxstow.open(path, mmap=True) as reader:
    ...     view = reader["w"]
    ...     print(view.shape, view.flags.writeable)
    (1000, 4) False
    """
    settings = storage_settings(storage_options, transfer, cache_dir)
    return open_reader_at(locate(target), settings, mmap=mmap, names=names, transposed=transposed)


def open_parts(targets: Sequence[Readable]) -> Reader:
    """One tree saved in several files, one per process.

    The first holds the structure, the others more shards. The sources among ``targets`` belong to the reader from now
    on: closed with it, or at once if opening fails.
    """
    containers: list[Container] = []
    try:
        for target in targets:
            containers.append(open_container_at(locate(target)))
        return Reader(containers)
    except BaseException:
        for container in containers:
            container.close()
        for target in targets[len(containers) + 1 :]:
            if isinstance(target, ReadSource):
                target.close()
        raise


def open_container_at(location: Location, settings: StorageSettings | None = None) -> Container:
    """The container of the file at ``location``.

    When it is not one jaxstow reads (a folder, a file of another library), the error says what it is and what reads it:
    the one call to :func:`~jaxstow._read.foreign.explained`, made only then. The source opened belongs to the
    container, or is closed on failure.
    """
    try:
        source = location.open(settings)
    except IsAFolderError as error:
        raise explained(error, location) from None
    try:
        return open_container(source)
    except FormatError as error:
        with contextlib.closing(source):
            raise explained(error, location, source) from error.__cause__
    except BaseException:
        source.close()
        raise
