"""A folder's tensors as one file's leaves, by tensor name or by the paths of a tree, some read turned over.

:class:`FolderFile` is what :func:`jaxstow._read.sharded_folder.open_folder` opens: each tensor a leaf stored whole in
one of the folder's files. ``names`` gives each tensor its path (``a.b.0.c`` -> ``a/b/0/c`` in :meth:`FolderFile.mapped`
unless it says otherwise) and ``transposed`` marks the 2-d tensors read turned over (torch's ``weight`` is (out, in),
flax's ``kernel`` (in, out)): the names alone decide which, never the shapes, so a square tensor turns over as any other.

>>> import os, tempfile, numpy as np
>>> from safetensors.numpy import save_file
>>> from jaxstow._read.sharded_folder import FolderFile, folder_listing, open_folder
>>> from jaxstow._storage.opening import locate
>>> folder = tempfile.mkdtemp()
>>> save_file({"fc.weight": np.arange(4.0).reshape(2, 2)}, os.path.join(folder, "model.safetensors"))
>>> with open_folder(folder_listing(locate(folder)), FolderFile, transposed={"fc.weight"}) as opened:
...     print(opened.paths, opened["fc.weight"][0], opened.mapped(None).paths)
['fc.weight'] [0. 2.] ['fc/weight']
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from typing import Any

import numpy as np

from jaxstow._format.native_or_npz import Container
from jaxstow._format.shards import Box, ShardedLeaf, Stored
from jaxstow._format.stored_values import values_checked
from jaxstow._read.layer_kinds import refuse_split_kinds, refuse_undecided_kinds, square_kin, torch_conv_as_flax
from jaxstow._read.opened import OpenedFile
from jaxstow._read.shard_reads import ShardReads
from jaxstow._read.slicing import full_box
from jaxstow._util.gc_pause import with_gc_paused
from jaxstow.errors import ArgumentError, excerpt

__all__ = ["FolderFile", "Names", "Transposed"]

#: A tensor name's path in a tree: a function (``None``: leave the tensor out) or a mapping (absent: left out).
Names = Callable[[str], str | None] | Mapping[str, str]
#: The 2-d tensors stored transposed: tensor names (a set, a list, an iterator) or a predicate on them.
Transposed = Callable[[str], bool] | Iterable[str]
#: ``Transposed`` as checked: a predicate, or the names.
_Marks = Callable[[str], bool] | frozenset[str]


class FolderFile(OpenedFile):
    """A sharded safetensors folder's tensors as one file's leaves, by tensor name or mapped onto a tree's paths.

    ``tensors`` holds each tensor as stored, by name; ``layout`` each leaf as stored, by its path in this view;
    ``stored`` each leaf as read, turned over for the paths in ``turned``. ``names`` gives the paths (the tensor names
    if ``None``) and ``transposed`` alone says which tensors turn over, never their shapes.
    """

    def __init__(
        self,
        containers: Sequence[Container],
        tensors: Mapping[str, ShardedLeaf],
        *,
        folder: str,
        metadata: dict[str, Any] | None,
        index: str | None = None,
        names: Names | None = None,
        transposed: Transposed | None = None,
    ) -> None:
        as_stored = isinstance(transposed, tuple) and not transposed  # transposed=(): every tensor as stored
        transposed = _marks(transposed)  # read once: an iterator is a collection only the first time
        layout, presented, turned = _view(folder, tensors, names, transposed, as_stored=as_stored)
        super().__init__(containers, leaves=presented)
        self.file = folder
        self.metadata = metadata if metadata is not None else self.metadata
        #: The index's file name (``model.safetensors.index.json``), or ``None`` for a folder without one.
        self.index = index
        self.tensors = dict(tensors)
        self.layout = layout
        self.turned = turned
        self.names, self.transposed = names, (() if as_stored else transposed)

    def mapped(self, names: Names | None = None, transposed: Transposed | None = None) -> FolderFile:
        """The same tensors by the paths ``names`` gives them (dots become slashes by default).

        Each 2-d tensor that ``transposed`` marks is turned over. The view shares this folder's open files.
        """
        return FolderFile(
            self.containers,
            self.tensors,
            folder=self.file,
            metadata=self.metadata,
            index=self.index,
            names=names if names is not None else _dotted,
            transposed=transposed,
        )

    def shard_of(self, path: str) -> str:
        """The file that holds the tensor at ``path``."""
        return self.containers[self.layout[path].shards[0].source].file

    def origin(self, path: str) -> str:
        """The tensor behind ``path`` when its name or layout is not the path's: its name, and how it is stored."""
        stored = self.layout[path]
        tensor = stored.shards[0].tensor
        if path in self.turned:
            return f" (tensor {tensor!r} stored as {list(stored.shape)}, turned over by transposed=)"
        return f" (tensor {tensor!r})" if tensor != path else ""

    def shape_advice(self, path: str, shape: tuple[int, ...]) -> str:
        """The ``transposed=`` that fits the 2-d tensor at ``path`` to ``shape`` where its shape turned over is it, with
        the square tensors of its kind, taken as it is (for a conv weight in torch's layout where ``shape`` is flax's,
        the turn to make after the load)."""
        stored = self.layout[path]
        if len(stored.shape) > 2 and path not in self.turned and tuple(shape) == torch_conv_as_flax(stored.shape):
            return (
                ": torch's Conv weight (out, in, *window) where flax's kernel is (*window, in, out); transposed= turns "
                "only 2-d tensors: read it apart as stored (huggingface.open(folder)[name]) and turn it with "
                "numpy.moveaxis(weight, (0, 1), (-1, -2))"
            )
        if len(stored.shape) != 2 or stored.shape == stored.shape[::-1]:
            return ""
        tensor, kin = stored.shards[0].tensor, square_kin(self.layout, path, self.turned)
        with_kin = f", and with it the square tensors of its kind, whose shapes cannot tell: {kin[:5]}" if kin else ""
        if path in self.turned and tuple(shape) == stored.shape:
            return f": like asks for it as stored; leave {tensor!r} out of transposed={with_kin}"
        if path not in self.turned and tuple(shape) == stored.shape[::-1]:
            return (
                f": the shape turned over; pass transposed={{{tensor!r}}} if it is stored (out, in), as torch's "
                f"Linear.weight is{with_kin}"
            )
        return ""

    def read_box(self, path: str, box: Box) -> np.ndarray:
        """The elements of ``box`` of the tensor at ``path``, read by byte ranges (turned over where marked)."""
        self.check_open(f"reading leaf {excerpt(path)}")
        stored = self.layout[path]
        turned = path in self.turned
        reads = ShardReads(self.containers)
        assembled = reads.box(stored, box[::-1] if turned else box)
        self.on_read(math.prod(stop - start for start, stop in box) * stored.dtype.itemsize)
        reads.run()
        part = values_checked(assembled(), file=self.file, path=path)
        return np.ascontiguousarray(part.T) if turned else part

    def read_arrays(self, leaves: Sequence[Stored]) -> dict[str, np.ndarray]:
        """Whole tensors by path, read together (the tensors turned over each on its own)."""
        self.check_open("reading leaves")
        arrays = super().read_arrays([self.layout[leaf.path] for leaf in leaves if leaf.path not in self.turned])
        turned = [leaf.path for leaf in leaves if leaf.path in self.turned]
        arrays.update({path: self.read_box(path, full_box(self.stored[path].shape)) for path in turned})
        return arrays

    def __repr__(self) -> str:
        return f"<jaxstow folder {self.file}: {len(self.leaf_order)} tensors in {len(self.containers)} files>"


def _dotted(tensor: str) -> str:
    return tensor.replace(".", "/")


def _view(
    folder: str,
    tensors: Mapping[str, ShardedLeaf],
    names: Names | None,
    transposed: _Marks | None,
    *,
    as_stored: bool,
) -> tuple[dict[str, ShardedLeaf], dict[str, ShardedLeaf], frozenset[str]]:
    """The leaves by path as stored and as read, and the paths read turned over: those ``transposed`` marks.

    Only ``transposed=()`` (``as_stored``) says that every tensor is as stored: an empty set or list, as a set built
    from the names that matched none, marks none, as a predicate that is false for every name does.
    """
    mapping = _path_mapping(names, list(tensors))  # the caller's functions run with the collector as they left it
    marked = _marked(transposed, list(tensors))
    refuse_split_kinds(folder, tensors, mapping, marked)
    if not as_stored:
        refuse_undecided_kinds(folder, tensors, mapping, marked)
    return _laid_out(folder, tensors, mapping, marked)


@with_gc_paused  # a leaf per tensor: see jaxstow._util.gc_pause
def _laid_out(
    folder: str, tensors: Mapping[str, ShardedLeaf], mapping: Mapping[str, str], marked: Set[str]
) -> tuple[dict[str, ShardedLeaf], dict[str, ShardedLeaf], frozenset[str]]:
    """:func:`_view`'s leaves, once ``mapping`` gives each tensor kept its path and ``marked`` those turned over."""
    layout: dict[str, ShardedLeaf] = {}
    presented: dict[str, ShardedLeaf] = {}
    for tensor, path in mapping.items():
        leaf = tensors[tensor]
        if path in layout:
            raise ArgumentError(
                f"names= (without it: every dot a slash) gives {layout[path].shards[0].tensor!r} and {tensor!r} the "
                f"path {path!r}: pass a names= that tells them apart"
            )
        layout[path] = presented[path] = leaf._replace(path=path)
        if tensor in marked:
            if len(leaf.shape) != 2:
                at_path = f" (path {path!r})" if path != tensor else ""
                raise ArgumentError(
                    f"{folder}: transposed= marks {tensor!r}{at_path}, of shape {list(leaf.shape)}: only 2-d tensors "
                    "turn (a conv weight in torch's layout turns with numpy.moveaxis(weight, (0, 1), (-1, -2)) once "
                    "read): leave it out of transposed=, whose predicate may test the layer's name, as "
                    "lambda name: name.endswith('proj.weight') does",
                    file=folder,
                    path=path,
                )
            presented[path] = leaf._replace(path=path, shape=leaf.shape[::-1])
    return layout, presented, frozenset(path for tensor, path in mapping.items() if tensor in marked)


def _path_mapping(names: Names | None, tensors: list[str]) -> dict[str, str]:
    if names is None:
        return {tensor: tensor for tensor in tensors}
    if not (isinstance(names, Mapping) or callable(names)):
        raise ArgumentError(
            f"names= takes a mapping from tensor names to paths or a function of a name, not {excerpt(names)}"
            + (": dict(pairs) makes one of pairs" if isinstance(names, list | tuple) else "")
        )
    if isinstance(names, Mapping):
        unknown = sorted(set(names) - set(tensors))
        if unknown:
            raise ArgumentError(f"names= maps tensors the folder lacks: {unknown[:5]}")
    mapping = {}
    for tensor in tensors:
        path = names.get(tensor) if isinstance(names, Mapping) else names(tensor)
        if path is not None and not isinstance(path, str):
            raise ArgumentError(f"names= gives {tensor!r} the path {path!r}: a string, or None to leave it out")
        if path is not None:
            mapping[tensor] = path
    return mapping


def _marks(transposed: Transposed | None) -> _Marks | None:
    """``transposed=`` checked: ``None``, a predicate, or the names it gives (an iterator's, read once)."""
    if transposed is None or callable(transposed):
        return transposed
    if isinstance(transposed, str | Mapping) or not isinstance(transposed, Iterable):
        raise ArgumentError(
            f"transposed= takes a collection of tensor names or a predicate on a name, not {excerpt(transposed)}"
            + (": pass the names to turn" if isinstance(transposed, Mapping) else "")
        )
    marks = frozenset(transposed)
    strange = [mark for mark in marks if not isinstance(mark, str)]
    if strange:
        raise ArgumentError(f"transposed= holds {excerpt(strange[0])}, not a tensor name")
    return marks


def _marked(transposed: _Marks | None, tensors: list[str]) -> set[str]:
    if transposed is None:
        return set()
    if callable(transposed):
        return {tensor for tensor in tensors if transposed(tensor)}
    unknown = sorted(transposed - set(tensors))
    if unknown:
        raise ArgumentError(f"transposed= names tensors the folder lacks: {unknown[:5]}")
    return set(transposed)
