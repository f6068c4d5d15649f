"""Per-process leaves restored: this process's own value, or every process's, as a leaf or into ``like``'s subtree.

A file of a save by ``N`` processes holds ``N`` values of each per-process leaf, one in each process's file; process
``k`` of a restore by ``N`` processes gets the value process ``k`` saved. With another number of processes the
values do not belong to anyone, so restoring raises unless every value is asked for (``per_process="all"``).

>>> import io, jaxstow
>>> buffer = io.BytesIO()
>>> jaxstow.save(buffer, {"loader": jaxstow.per_process({"epoch": 2})}); _ = buffer.seek(0)
>>> jaxstow.load(buffer, per_process="all")
{'loader': [{'epoch': 2}]}
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from jaxstow._format.header import open_container
from jaxstow._format.keypaths import flatten_with_paths, path_to_str
from jaxstow._format.per_process import PerProcess, is_stateful
from jaxstow._format.torch_leaves import tensor_from_numpy
from jaxstow._read.opened import OpenedFile
from jaxstow._read.targets import Target
from jaxstow._storage.opening import open_source
from jaxstow.errors import FormatError, RequestError, StructureMismatchError

__all__ = [
    "checked_value",
    "fill_from_per_process",
    "none_as_per_process",
    "per_process_templates",
    "per_process_value",
    "set_into",
    "stored_bytes",
    "whole_per_process",
]


def per_process_value(opened: OpenedFile, path: str, *, every: bool) -> Any:
    """The value of this process at ``path`` (``every``: a list of each process's, in process order)."""
    values = opened.per_process[path]
    saved_by = next(iter(values.values()))[1]["processes"]
    if len(values) != saved_by or sorted(values) != list(range(saved_by)):  # a count from the file: never a range
        missing = list(itertools.islice((process for process in range(saved_by) if process not in values), 9))
        shown = ", ".join(map(str, missing[:8])) + (", ..." if len(missing) > 8 else "")
        raise FormatError(
            f"holds no value of the processes {shown} of the {saved_by} that saved it (a file of the step is missing)",
            file=opened.file,
            path=path,
        )
    if every:
        return [_decode(opened, path, process) for process in range(saved_by)]
    count = jax.process_count()
    if count != saved_by:
        raise RequestError(
            f"a per-process value saved by {saved_by} process{'es' if saved_by > 1 else ''} cannot go to each of "
            f"{count}: restore with per_process='all' to get the list of every process's value",
            file=opened.file,
            path=path,
        )
    return _decode(opened, path, jax.process_index())


def set_into(like: Any, value: Any, *, every: bool) -> Any:
    """What a restored per-process value becomes where ``like`` has a leaf: a live iterator (wrapped in
    :func:`~jaxstow.per_process` or not) takes it as its state, whatever it is (a list too), unless ``every``
    process's value was asked for (a list of them)."""
    live = like.value if isinstance(like, PerProcess) else like
    if is_stateful(live) and not every and not isinstance(value, PerProcess):
        live.set_state(value)
        return live
    return value


def stored_bytes(opened: OpenedFile, path: str, process: int) -> np.ndarray:
    """The bytes ``process``'s value at ``path`` is stored as (a file of its own), checked against its checksum."""
    source, entry = opened.per_process[path][process]
    container = opened.containers[source]
    return container.read([path], lambda name, found: opened.verify(path, found, entry.get("xxh3"), source))[path]


def checked_value(opened: OpenedFile, path: str, process: int) -> int:
    """Read ``process``'s value at ``path`` as a load does, every checksum of its own file compared; its bytes."""
    data = stored_bytes(opened, path, process)
    _decoded(opened, path, process, data)
    return data.nbytes


def _decode(opened: OpenedFile, path: str, process: int) -> Any:
    return _decoded(opened, path, process, stored_bytes(opened, path, process))


def _decoded(opened: OpenedFile, path: str, process: int, data: np.ndarray) -> Any:
    """``process``'s value at ``path``, from ``data``, the file of its own it is stored as."""
    where = f"{opened.file}:{path}"
    nested = OpenedFile(open_container(open_source(io.BytesIO(data.tobytes()))))
    with nested:
        treedef = nested.treedef()
        leaves = nested.read_all()
        if treedef is None or leaves is None:
            raise FormatError(f"process {process}'s value is not a file of plain arrays and values", file=where)
    return treedef.unflatten(leaves)


def none_as_per_process(like: Any, opened: OpenedFile) -> Any:
    """``like`` with each ``None`` where the file holds a per-process leaf made ``per_process(None)``: that place
    takes this process's value as it was saved (``None`` is no leaf to jax, so it would leave the place out)."""
    if not opened.per_process:
        return like
    return jax.tree_util.tree_map_with_path(
        lambda key_path, leaf: (
            PerProcess(None) if leaf is None and path_to_str(key_path) in opened.per_process else leaf
        ),
        like,
        is_leaf=lambda leaf: leaf is None,
    )


def whole_per_process(opened: OpenedFile) -> bool:
    """Whether the file's tree is one per-process value (``jaxstow.save(path, jaxstow.per_process(tree))``), not a
    dict holding one at the empty key ``""``: both name it ``""``, but only the first's structure is a bare leaf."""
    manifest = getattr(opened.container, "manifest", None)
    return "" in opened.per_process and isinstance(manifest, dict) and manifest.get("structure") == "*"


def per_process_templates(opened: OpenedFile, paths: Sequence[str]) -> dict[str, list[int]]:
    """The per-process leaves of the file that ``like`` has a subtree for (a plain template of the value): by the
    leaf's path, the positions of the subtree's leaves among ``paths``."""
    found: dict[str, list[int]] = {}
    root = whole_per_process(opened)  # like's leaves below the root fill it
    for i, path in enumerate(paths):
        parts = path.split("/")
        parents = ["/".join(parts[:end]) for end in range(1, len(parts))]
        parent = "" if root and path else next((name for name in parents if name in opened.per_process), None)
        if parent is not None:
            found.setdefault(parent, []).append(i)
    return found


def fill_from_per_process(
    opened: OpenedFile,
    path: str,
    positions: dict[str, int],
    values: list[Any],
    targets: Sequence[Target],
    *,
    every: bool,
    as_numpy: bool,
) -> None:
    """Put this process's value of the per-process leaf at ``path`` into the leaves of ``like``'s subtree there
    (``targets``: what each leaf of ``like`` asks for), each saved leaf checked to be what its like leaf asks for and
    handed back in its form (numpy with ``as_numpy``)."""
    if every:
        raise RequestError(
            "per_process='all' gives a list of every process's value, which a subtree of like cannot hold: put a "
            "leaf (None, or jaxstow.per_process(...)) there",
            file=opened.file,
            path=path,
        )
    sub_paths, leaves, treedef = flatten_with_paths(per_process_value(opened, path, every=False))
    bare, root = treedef.num_nodes == 1, whole_per_process(opened)  # below a dict's key "", like's paths start "/"
    got = {
        path if bare else sub_path if root else f"{path}/{sub_path}": leaf
        for sub_path, leaf in zip(sub_paths, leaves, strict=True)
    }
    if got.keys() != positions.keys():
        raise StructureMismatchError(
            [f"{path!r}: the saved value has the leaves {sorted(got)}, like has {sorted(positions)}"], file=opened.file
        )
    problems = [
        f"{leaf_path!r}: the saved value is {_described(got[leaf_path])}, like has {targets[i].describe()}"
        for leaf_path, i in positions.items()
        if not _fits(got[leaf_path], targets[i])
    ]
    if problems:
        raise StructureMismatchError(problems, file=opened.file)
    for leaf_path, i in positions.items():
        values[i] = _as_asked(got[leaf_path], targets[i], as_numpy=as_numpy, file=opened.file, path=leaf_path)


def _as_asked(saved: Any, target: Target, *, as_numpy: bool, file: str, path: str) -> Any:
    """A leaf of a per-process value as its ``like`` leaf asks for it: a plain value as saved; a numpy scalar, a numpy
    array, a tensor or a ``jax.Array`` of its values (numpy with ``as_numpy``, or where jax with x64 off would narrow
    it)."""
    if target.output == "value":
        return saved
    array = np.asarray(saved)
    if target.output == "npscalar":
        return array[()]
    if as_numpy or target.output == "numpy":
        return array
    if target.output == "torch":
        return tensor_from_numpy(array, file=file, path=path)
    return jax.numpy.asarray(array) if jax.dtypes.canonicalize_dtype(array.dtype) == array.dtype else array


def _fits(saved: Any, target: Target) -> bool:
    """Whether a leaf of a per-process value is what a like leaf asks for: an array of its shape and dtype for an
    array (or a ``ShapeDtypeStruct``); text for text, and no array for a number (``None`` takes anything)."""
    if target.output == "value":
        wanted = target.value
        return wanted is None or (
            isinstance(wanted, str | bytes) == isinstance(saved, str | bytes) and np.ndim(saved) <= np.ndim(wanted)
        )
    dtype = getattr(saved, "dtype", None)
    return dtype is not None and np.dtype(dtype) == target.dtype and tuple(np.shape(saved)) == tuple(target.shape or ())


def _described(saved: Any) -> str:
    dtype = getattr(saved, "dtype", None)
    return f"{dtype}{list(np.shape(saved))}" if dtype is not None else f"{type(saved).__name__} {saved!r}"[:80]
