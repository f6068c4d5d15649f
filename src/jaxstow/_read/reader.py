"""``jaxstow.open`` and :class:`jaxstow.Reader`: a file opened lazily, only its header read until a leaf is asked for.

The one opening step of the read path (:func:`open_reader_at`) turns a location into a :class:`Reader`: a file's, or a
folder of safetensors files'. A :class:`Reader` is an :class:`~jaxstow._read.opened.OpenedFile`, which indexes and
reads leaves, that also describes them, reads slices and restores trees (:mod:`jaxstow._read.restore`). See
docs/restoring.md.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar, Unpack

import jax
import numpy as np

from jaxstow._format.header import NativeReader, open_container
from jaxstow._format.native_or_npz import Container
from jaxstow._format.per_process import PerProcess, states_put_back_on_failure
from jaxstow._format.skeleton_names import with_every_library
from jaxstow._format.source import ReadSource
from jaxstow._read.folder_file import FolderFile, Names, Transposed
from jaxstow._read.foreign import explained
from jaxstow._read.opened import OpenedFile
from jaxstow._read.options import LoadOptions
from jaxstow._read.restore import refuse_while_tracing, restore
from jaxstow._read.sharded_folder import INDEX_SUFFIX, folder_listing, open_folder
from jaxstow._read.slicing import parse_index
from jaxstow._storage.cache import CachedCopy
from jaxstow._storage.opening import Location, Readable, locate, reached
from jaxstow._storage.settings import StorageSettings
from jaxstow._storage.sources import SourceBase
from jaxstow._storage.transfer import Transfer
from jaxstow._util.deprecation import moved_keywords
from jaxstow.errors import (
    ArgumentError,
    CorruptFileError,
    FormatError,
    IsAFolderError,
    PathNotFoundError,
    SliceError,
    UnknownNameError,
    excerpt,
)

__all__ = [
    "HUGGING_FACE_OPTIONS",
    "FolderReader",
    "LeafInfo",
    "Reader",
    "open",
    "open_folder_at",
    "open_parts",
    "open_reader_at",
    "read_again",
]

#: The options of a folder of safetensors files (:func:`jaxstow.huggingface.load` and ``open`` take them).
HUGGING_FACE_OPTIONS = ("names", "transposed")
_shape_dtype: Callable[..., Any] = jax.ShapeDtypeStruct
T = TypeVar("T")


class LeafInfo(NamedTuple):
    """One leaf of a file, as its header describes it (:meth:`jaxstow.Reader.info`).

    Attributes:
        path: the leaf's path in the tree, such as ``"params/w"``.
        kind: ``"array"``, ``"npscalar"``, ``"key"`` (a typed PRNG key), ``"torch"``, ``"sharded"``, ``"value"`` or ``"per_process"``.
        dtype: a stored leaf's dtype; ``None`` for a value.
        shape: a stored leaf's shape (a PRNG key's leaves out its key data); ``None`` for a value.
        nbytes: the bytes a stored leaf takes in the file; 0 for a value.
    """

    path: str
    kind: str
    dtype: np.dtype | None
    shape: tuple[int, ...] | None
    nbytes: int


class Reader(OpenedFile):
    """A file's leaves by path, read on demand; a context manager that closes the file. Made by :func:`jaxstow.open`.

    ``reader[path]`` reads one whole leaf, verified against its checksum; :meth:`read` reads a slice of an array,
    touching only the bytes it needs (verified where they nearly fill their 1 MiB blocks); :attr:`abstract` is the saved tree with ``jax.ShapeDtypeStruct`` leaves,
    usable as ``like``; :meth:`load` restores the tree, or a part of it. :attr:`paths` lists the leaves and
    :attr:`metadata` is the metadata saved with the file. Bytes from a store that fail their checksum are asked for
    again, once (:func:`read_again`): only damage found twice is the file's.

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

    def __init__(self, containers: Container | Sequence[Container], **options: Any) -> None:
        if isinstance(containers, str | bytes | os.PathLike | io.IOBase):
            raise ArgumentError(f"a Reader is made by jaxstow.open({excerpt(containers)}), not by jaxstow.Reader(...)")
        super().__init__(containers, **options)

    def info(self, path: str) -> LeafInfo:
        """Describe the leaf at ``path`` from the header alone.

        Args:
            path: the leaf's path, one of :attr:`paths`.

        Returns:
            Its :class:`LeafInfo`: kind, dtype, shape and size.

        Raises:
            RequestError: the file has no such leaf.

        >>> import io, numpy as np, jaxstow
        >>> buffer = io.BytesIO()
        >>> jaxstow.save(buffer, {"w": np.ones((4, 3), np.float32)}); _ = buffer.seek(0)
        >>> jaxstow.open(buffer).info("w")
        LeafInfo(path='w', kind='array', dtype=dtype('float32'), shape=(4, 3), nbytes=48)
        """
        self.check_path(path)
        if path in self.value_entries:
            return LeafInfo(path, self.value_entries[path]["kind"], None, None, 0)
        leaf = self.stored[path]
        shape = leaf.shape[:-1] if leaf.kind == "key" else leaf.shape
        return LeafInfo(path, leaf.kind, leaf.dtype, shape, leaf.nbytes)

    @property
    def abstract(self) -> Any:
        """The saved tree with a ``jax.ShapeDtypeStruct`` for every stored leaf (weakly typed where the array was) and
        plain values as they are."""
        leaves = [self._abstract_leaf(path) for path in self.leaf_order]
        treedef = self.treedef()
        return dict(zip(self.leaf_order, leaves, strict=True)) if treedef is None else treedef.unflatten(leaves)

    def _abstract_leaf(self, path: str) -> Any:
        if path in self.per_process:
            return PerProcess(None, iterator=self.value_entries[path].get("iterator", False))
        if path in self.value_entries:
            return self.value(path)
        leaf = self.stored[path]
        if leaf.kind == "key":
            data = _shape_dtype(leaf.shape, leaf.dtype)
            key = jax.eval_shape(lambda d: jax.random.wrap_key_data(d, impl=leaf.impl), data)
            return _shape_dtype(key.shape, key.dtype)
        return _shape_dtype(leaf.shape, leaf.dtype, weak_type=path in self.weak)  # as jax.eval_shape would give it

    def __getitem__(self, path: str) -> Any:
        refuse_while_tracing(self.file, reading="a leaf cannot be read", path=path)
        return read_again(self, functools.partial(super().__getitem__, path))

    def read(self, path: str, index: Any = ...) -> np.ndarray:
        """Read the part ``index`` of the array at ``path``, touching only the bytes it needs: the 1 MiB blocks it
        touches, each verified against its checksum, where they hold at most 5% more; its byte ranges for a narrower
        part (a few rows, a column), the blocks it holds whole verified; unverified in a file saved by jaxstow 0.1.

        Args:
            path: the leaf's path, one of :attr:`paths`.
            index: integers, slices and ``...``, as numpy takes them (``numpy.s_[1:3, 0]``); ``...`` reads the whole
                leaf and verifies it against its checksum.

        Returns:
            A numpy array.

        Raises:
            SliceError: the index is out of bounds or not made of integers and slices, or the leaf is no array.
        """
        self.check_path(path)
        refuse_while_tracing(self.file, reading="a leaf cannot be read", path=path)
        leaf = self.stored.get(path)
        if leaf is None or leaf.kind not in ("array", "npscalar", "torch", "sharded"):
            kind = "a value" if leaf is None else f"a {leaf.kind}"
            raise SliceError("only arrays can be read by slices, and this leaf is " + kind, file=self.file, path=path)
        box, rest = parse_index(index, leaf.shape, file=self.file, path=path)
        return np.asarray(read_again(self, functools.partial(self.read_box, path, box))[rest])

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
        if self.closed:
            self.check_open("loading the tree")
        try:
            with contextlib.nullcontext() if like is None else states_put_back_on_failure(like):  # iterators as were
                return read_again(self, functools.partial(restore, self, like, **options))
        except UnknownNameError as error:  # one error names every library to import, not one library per attempt
            raise with_every_library(error, self.container.manifest, self.value_entries.values()) from None

    def __repr__(self) -> str:
        return f"<jaxstow.Reader {self.file}: {len(self.leaf_order)} leaves>"


class FolderReader(FolderFile, Reader):
    """A folder of safetensors files (a Hugging Face sharded checkpoint) as one lazy file.

    :func:`jaxstow.huggingface.open` and :func:`jaxstow.open` make it. Its paths are the tensor names, or those
    ``names`` gives them; the 2-d tensors that ``transposed`` marks are read turned over, by ``reader[path]``,
    :meth:`read` and :meth:`load` alike. :meth:`load` without ``like`` gives a flat dict by path; with ``like``, the
    tensor ``a.b.0.c`` fills the leaf ``a/b/0/c`` unless ``names`` maps it elsewhere. See docs/other-formats.md.
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

        ``names`` and ``transposed``, when given, stand for those the folder was opened with.
        """
        self.check_open("loading the tree")
        names = names if names is not None else self.names
        transposed = transposed if transposed is not None else self.transposed
        if like is None and names is None and transposed is None:
            return read_again(self, functools.partial(restore, self, None, **options))
        if names is None and like is None:
            names = str  # without like, the tensors keep their names
        with states_put_back_on_failure(like):
            return read_again(self, functools.partial(restore, self.mapped(names, transposed), like, **options))

    def info(self, path: str) -> LeafInfo:
        """Describe the tensor at ``path`` (an array stored in one of the folder's files)."""
        return super().info(path)._replace(kind="array")


def read_again(opened: OpenedFile, read: Callable[[], T]) -> T:
    """``read()``, which reads leaves of ``opened``; called again, once, when it finds a checksum mismatch and a file it
    reads came over a network (a bit flipped on its way is no damage), whose kept bytes are dropped first, or is the
    local copy of one (``cache_dir``), fetched again first: only damage found twice is the file's. A local file's
    bytes are what it holds: its damage is raised at once."""
    try:
        return read()
    except CorruptFileError:
        if not [container for container in opened.containers if _read_anew(container)]:
            raise
    return read()


def _read_anew(container: Container) -> bool:
    """Whether the bytes ``container`` reads come anew from now on: those a network sent, asked for again, or a local
    copy's, fetched again from the store."""
    source = getattr(container, "source", None)
    if isinstance(source, CachedCopy) and isinstance(container, NativeReader):  # a jaxstow file's copy: no other
        container.source = source.fetched_again()
        return True
    return isinstance(source, SourceBase) and source.forget()


def open_reader_at(location: Location, settings: StorageSettings | None = None, *, mmap: bool = False) -> Reader:
    """The one opening step: the file at ``location`` as a :class:`Reader`, or the folder of safetensors files there as
    a :class:`FolderReader`.

    The location is opened once: a file as its container; what is no file (a local folder, a URL that names no object)
    as a folder, whose error, when it is none that loads, says what it is and what reads it.
    """
    try:
        _refuse_as_a_file(location)
        container = _container_at(location, settings)
    except (IsAFolderError, PathNotFoundError) as error:
        folder = _folder_at(location, settings, error)
        if mmap:
            folder.close()
            raise ArgumentError(
                f"mmap=True maps one local file, and {location.name} is a folder of safetensors files"
            ) from None
        return folder
    return Reader(container, mmap=mmap)


def open_folder_at(
    location: Location,
    settings: StorageSettings | None = None,
    *,
    names: Names | None = None,
    transposed: Transposed | None = None,
) -> FolderReader:
    """The folder of safetensors files at ``location`` (or the folder whose index it is), its tensors named by
    ``names``, those ``transposed`` marks turned over; another file there is an :class:`~jaxstow.errors.ArgumentError`."""
    where = location.path or location.url
    if where is not None and where.endswith(INDEX_SUFFIX) and not (location.url or "").startswith(("http:", "https:")):
        parent = os.path.dirname(where) if location.path is not None else where.rpartition("/")[0]
        return open_folder_at(locate(parent or "."), settings, names=names, transposed=transposed)
    try:
        _refuse_as_a_file(location)
        source = location.open(settings)
    except (IsAFolderError, PathNotFoundError) as error:
        return _folder_at(location, settings, error, names=names, transposed=transposed)
    source.close()
    if (location.url or "").startswith(("http:", "https:")):
        raise ArgumentError(
            f"{location.name}: an http(s) URL names one file, and a folder there cannot be listed: download the "
            "folder first (huggingface_hub.snapshot_download gives a local one), or read it from a store that lists "
            "its folders (s3://, gs://, az://, file://)"
        )
    raise ArgumentError(
        f"{location.name}: is a file, not a folder of safetensors files (names= and transposed= are for such folders): "
        f"jaxstow.load({location.name!r}) reads it"
    )


def _refuse_as_a_file(location: Location) -> None:
    """A URL that ends in ``/`` names a folder, never the object of the same name an object store may hold beside
    it (``s3://bucket/model`` and ``s3://bucket/model/...``): the folder is read, or its error raised."""
    url = location.url or ""
    if url.endswith("/") and not url.startswith(("http:", "https:")):  # a web server answers for "/" itself
        raise IsAFolderError(
            "names a folder (its URL ends in '/'), and it is no folder of safetensors files to load", file=location.name
        )


def _folder_at(
    location: Location,
    settings: StorageSettings | None,
    error: IsAFolderError | PathNotFoundError,
    **view: Any,
) -> FolderReader:
    """The folder of safetensors files at ``location``, which did not open as a file (``error``); ``error`` explained
    if it is none."""
    listing = None if location.path is None and location.url is None else folder_listing(location, settings)
    if listing is not None:
        return open_folder(listing, FolderReader, settings, **view)
    if isinstance(error, IsAFolderError):
        raise explained(error, location) from None
    raise error


def open(
    target: Readable,
    *,
    mmap: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    transfer: Transfer | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    **shortcuts: Any,
) -> Reader:
    """Open a jaxstow, safetensors or npz file lazily: only its header is read until a leaf is asked for.

    A folder of safetensors files (Hugging Face's index and shards) opens as one reader whose paths are the tensor
    names; :func:`jaxstow.huggingface.open` names them as a tree wants them (docs/other-formats.md). Close the reader
    returned, or use it in a ``with`` block.

    Args:
        target: a file name, an fsspec URL or a binary file object.
        mmap: for a local native file, leaves are read-only numpy views of the memory-mapped file, never copied.
        storage_options: fsspec's options, for a URL.
        transfer: the requests in flight, their size and a bandwidth cap, for a URL.
        cache_dir: a folder keeping a local copy of a remote file, used again while its header checksum matches.
        **shortcuts: ``names=`` and ``transposed=``, deprecated: :func:`jaxstow.huggingface.open` takes them.

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
    if not isinstance(mmap, bool | np.bool_):
        raise ArgumentError(f"mmap= takes True or False, not {excerpt(mmap)}")
    location = locate(target)
    settings = reached(storage_options, transfer, cache_dir)
    if shortcuts:
        view = moved_keywords("jaxstow.open", shortcuts, HUGGING_FACE_OPTIONS, use="jaxstow.huggingface.open")
        if shortcuts:
            raise ArgumentError(f"open() got an unexpected keyword argument {next(iter(shortcuts))!r}")
        if view:
            return open_folder_at(location, settings, **view)
    return open_reader_at(location, settings, mmap=mmap)


def open_parts(targets: Sequence[Readable]) -> Reader:
    """One tree saved in several files, one per process.

    The first holds the structure, the others more shards. The sources among ``targets`` belong to the reader from now
    on: closed with it, or at once if opening fails.
    """
    containers: list[Container] = []
    try:
        for target in targets:
            location = locate(target)
            try:
                containers.append(_container_at(location))
            except IsAFolderError as error:
                raise explained(error, location) from None
        return Reader(containers)
    except BaseException:
        for container in containers:
            container.close()
        for target in targets[len(containers) + 1 :]:
            if isinstance(target, ReadSource):
                target.close()
        raise


def _container_at(location: Location, settings: StorageSettings | None = None) -> Container:
    """The container of the file at ``location``, which owns the source opened (closed on failure).

    A folder there, or a URL that names no object, raises as :meth:`~jaxstow._storage.opening.Location.open` does.
    When it is a file jaxstow does not read (another library's), the error says what it is and what reads it: the one
    call to :func:`~jaxstow._read.foreign.explained`, made only then, on the source already open. A local copy of a
    URL's file (``cache_dir``) whose header does not fit it (cut short: a full disk, a crash) is fetched again, once.
    """
    source = location.open(settings)
    try:
        try:
            return open_container(source)
        except CorruptFileError:
            if not isinstance(source, CachedCopy):
                raise
            source = source.fetched_again()  # the copy's damage, not the store's file's (an open copy given too)
            return open_container(source)
    except FormatError as error:
        with contextlib.closing(source):
            raise explained(error, location, source) from error.__cause__
    except BaseException:
        source.close()
        raise
