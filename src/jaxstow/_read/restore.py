"""Restoring a tree from an opened file: rebuilt from the file alone, or fitted into a ``like`` tree.

Both are one plan: which stored leaves to read (all, those ``select`` names, or those ``like`` holds), what each
becomes (numpy, ``jax.Array`` on a sharding, a cast), all checked from the header before any data is read. It is all
or nothing: any problem raises before a tree is returned. Then one read: a whole version 3 file by its columns, or the
chosen leaves, those the pipeline takes streamed to their devices, sharded leaves bound for several devices box by
box (:mod:`jaxstow._read.device_boxes`), the rest at once.

>>> import io, jax, jax.numpy as jnp, jaxstow
>>> buffer = io.BytesIO()
>>> jaxstow.save(buffer, {"params": {"w": jnp.ones(2), "b": jnp.zeros(1)}, "opt": {"mu": jnp.zeros(2)}})
>>> _ = buffer.seek(0)
>>> jaxstow.load(buffer, select=["params/w"])
{'params': {'w': Array([1., 1.], dtype=float32)}}
>>> _ = buffer.seek(0)
>>> like = {"params": {"w": jax.ShapeDtypeStruct((2,), jnp.bfloat16)}}
>>> jaxstow.load(buffer, like=like, partial=True, cast=True)
{'params': {'w': Array([1, 1], dtype=bfloat16)}}
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any, Unpack

import jax
import jax.numpy as jnp
import numpy as np

from jaxstow._format.shards import Stored
from jaxstow._format.torch_leaves import tensor_from_numpy
from jaxstow._read.device_boxes import bound_for_devices, read_onto_devices
from jaxstow._read.opened import OpenedFile
from jaxstow._read.options import LoadOptions, check_options
from jaxstow._read.per_process import (
    fill_from_per_process,
    none_as_per_process,
    per_process_templates,
    per_process_value,
    set_into,
    whole_per_process,
)
from jaxstow._read.pipeline import pipelined_paths, restore_pipelined
from jaxstow._read.placement import ShardingSpec, check_fits, place_whole, resolve_shardings, saved_shardings
from jaxstow._read.pruning import SKIPPED, prune
from jaxstow._read.selection import Selection
from jaxstow._read.structure import check_rebuilt, flatten_like, like_paths_in_file, where_like_sits
from jaxstow._read.targets import Target, cast_values, describe_file_leaf, fit_problem, scalar_targets, target_of
from jaxstow._read.tracing import READING_WHILE_TRACING
from jaxstow._util.jax_compat import CURRENT_TRACE, typed_as, weakly_typed
from jaxstow._util.progress import bar as progress_bar
from jaxstow.errors import FormatError, JaxstowError, RequestError, StructureMismatchError

__all__ = ["pipeline_by_default", "refuse_while_tracing", "restore"]

_SCALARS = (bool, int, float, complex, str, bytes)
#: From this size on, arrays are handed to jax in one batch, which adopts their buffers, rather than copied.
_ADOPT_BYTES = 1 << 16


def restore(opened: OpenedFile, like: Any = None, **options: Unpack[LoadOptions]) -> Any:
    """The tree in ``opened``'s file, rebuilt or fitted into ``like``; see :class:`LoadOptions` for the options (one
    it does not define is an :class:`~jaxstow.errors.ArgumentError`; :func:`refuse_while_tracing` says when it runs)."""
    refuse_while_tracing(opened.file)
    if options:
        check_options(options)
    choice, pipeline = options.get("per_process", "own"), options.get("pipeline")

    def run() -> Any:
        return _restore(
            opened,
            like,
            as_numpy=options.get("as_numpy", False),
            sharding=options.get("sharding"),
            partial=options.get("partial", False),
            select=options.get("select"),
            cast=options.get("cast", False),
            every=choice == "all",
            pipeline=pipeline_by_default() if pipeline is None else bool(pipeline),
        )

    if not options.get("progress", False):
        return run()
    total = sum(leaf.nbytes for leaf in opened.stored.values())
    with progress_bar(total, f"loading {opened.file}", enabled=True) as bar:
        opened.on_read = bar.update
        return run()


def refuse_while_tracing(file: str, *, reading: str = "a file cannot be loaded", path: str | None = None) -> None:
    """A :class:`~jaxstow.errors.RequestError` where jax traces a user's function (``jit``, ``vmap``, ``grad``): the
    current trace is not eval, and jaxstow is not reading on purpose while it traces (``read_while_tracing``)."""
    if not READING_WHILE_TRACING.get() and type(_current_trace()()).__name__ != "EvalTrace":
        raise RequestError(
            f"{reading} inside jax.jit/vmap/grad: its arrays would become constants of the traced function, which "
            "would not read the file again; read it outside and pass the arrays in",
            file=file,
            path=path,
        )


_current_trace: Callable[[], Callable[[], Any]] = cache(CURRENT_TRACE.resolve)


def _has_nodes(opened: OpenedFile) -> bool:
    """Whether the file's structure has nodes other than dicts, lists, tuples and ``None`` (``True`` if unknown),
    read from the header's JSON: cheaper than from the structure jax built."""
    manifest = getattr(opened.container, "manifest", None)
    stack = [manifest.get("structure")] if isinstance(manifest, dict) else []
    while stack:
        node = stack.pop()
        if type(node) is dict:
            [(tag, items)] = node.items() if len(node) == 1 else [("node", None)]
            if tag not in ("dict", "list", "tuple") or type(items) is not list:
                return True
            try:  # a malformed header is named by the structure's decoder
                stack += (
                    [pair[1] for pair in items if pair[1] != "*"] if tag == "dict" else [i for i in items if i != "*"]
                )
            except (LookupError, TypeError):
                return True
    return not isinstance(manifest, dict)


def pipeline_by_default() -> bool:
    """Whether a restore takes the pipeline unless told: on an accelerator, where reading many leaves at once, each
    transferred as soon as it is read, beats reading the file and then transferring it in one batch (an H200, 4 GiB
    from the page cache: 0.27 s against 0.35 s) and holds a pool rather than the file on the host. On CPU the read
    buffers become the arrays."""
    return jax.default_backend() != "cpu"


def _restore(
    opened: OpenedFile,
    like: Any,
    *,
    as_numpy: bool,
    sharding: ShardingSpec,
    partial: bool,
    select: str | Sequence[str] | None,
    cast: bool,
    every: bool,
    pipeline: bool,
) -> Any:
    pipeline = pipeline and not as_numpy
    if as_numpy and sharding is not None:
        raise RequestError("as_numpy=True gives numpy arrays, which have no sharding: pass one or the other")
    if like is None:
        if partial or cast:
            raise RequestError(
                "partial= and cast= work with like=...; without a template, choose leaves with select=[...]",
                file=opened.file,
            )
        return _rebuild(opened, as_numpy=as_numpy, sharding=sharding, select=select, every=every, pipeline=pipeline)
    if select is not None:
        raise RequestError(
            "select= chooses leaves without a template: with like=..., leave select= out and give like= only the "
            "leaves to restore, with partial=True",
            file=opened.file,
        )
    return _fit(
        opened, like, as_numpy=as_numpy, sharding=sharding, partial=partial, cast=cast, every=every, pipeline=pipeline
    )


def _rebuild(
    opened: OpenedFile,
    *,
    as_numpy: bool,
    sharding: ShardingSpec,
    select: str | Sequence[str] | None,
    every: bool,
    pipeline: bool,
) -> Any:
    if _has_nodes(opened) and (saved := opened.treedef()) is not None:
        check_rebuilt(opened, saved)
    everything = opened.read_all(as_numpy=as_numpy) if select is None and sharding is None and not pipeline else None
    if everything is not None:  # the whole tree of a version 3 file, read by columns
        treedef = opened.treedef()
        numpy_leaves = [i for i, value in enumerate(everything) if type(value) is np.ndarray]
        _to_devices(opened, opened.leaf_order, everything, numpy_leaves, {}, as_numpy=as_numpy)
        return _rebuilt(opened, treedef, opened.leaf_order, everything)
    paths = opened.leaf_order
    chosen = set(Selection(select).choose(paths, file=opened.file) if select is not None else paths)
    treedef = opened.treedef()
    positions = [i if path in chosen else SKIPPED for i, path in enumerate(paths)]

    def index_tree() -> Any:
        return prune(dict(zip(paths, positions, strict=True)) if treedef is None else treedef.unflatten(positions))

    stored = [i for i, path in enumerate(paths) if path in chosen and path in opened.stored]
    arrays = {
        i: (paths[i], _shape(leaf), leaf.dtype)
        for i in stored
        if (leaf := opened.stored[paths[i]]).kind in ("array", "key", "sharded")
    }

    def value(i: int, data: dict[str, Any]) -> Any:
        path = paths[i]
        if path not in chosen:
            return SKIPPED
        if path in data:
            return opened.as_leaf(opened.stored[path], data[path], as_numpy=as_numpy)
        return _value(opened, path, every=every)

    placements = _placements(opened, sharding, index_tree, arrays)
    values = _read(opened, paths, stored, arrays, placements, value, {}, as_numpy=as_numpy, pipeline=pipeline)
    tree = _rebuilt(opened, treedef, paths, values)
    return prune(tree) if select is not None else tree


def _read(
    opened: OpenedFile,
    paths: Sequence[str],
    stored: Sequence[int],
    arrays: dict[int, tuple[str, tuple[int, ...], np.dtype]],
    placements: dict[int, Any],
    value: Callable[[int, dict[str, Any]], Any],
    dtypes: dict[int, np.dtype | None],
    *,
    as_numpy: bool,
    pipeline: bool,
) -> list[Any]:
    """The restored leaves, in order: the stored leaves at ``stored`` read, each leaf made by ``value(i, data)``
    from the arrays read by path, and the ``arrays`` put on their devices. A sharded leaf bound for several devices
    is read box by box onto its placement (cast to ``dtypes[i]``), the whole arrays the pipeline takes are streamed
    to their devices, the rest read at once."""
    by_ranges = set() if as_numpy else bound_for_devices(opened, paths, placements)
    on_devices = [i for i in arrays if i not in by_ranges]
    streamed = _streamed(opened, on_devices, paths, placements, pipeline=pipeline)
    data: dict[str, Any] = dict(
        opened.read_arrays([opened.stored[paths[i]] for i in stored if i not in by_ranges and i not in streamed])
    )
    data.update(restore_pipelined(opened, list(streamed.values())))
    values = [None if i in by_ranges else value(i, data) for i in range(len(paths))]
    _to_devices(opened, paths, values, on_devices, placements, as_numpy=as_numpy)
    for i in by_ranges:
        values[i] = _weak_if_saved(opened, paths[i], read_onto_devices(opened, paths[i], placements[i], dtypes.get(i)))
    return values


def _weak_if_saved(opened: OpenedFile, path: str, value: Any) -> Any:
    """``value``, weakly typed if its leaf was saved so (``jnp.asarray(2.0)``) and not cast, but as jax holds it."""
    saved = opened.stored[path].dtype if path in opened.weak else None  # 64 bits, read with jax's 64-bit mode off
    if saved is not None and isinstance(value, jax.Array) and value.dtype == jax.dtypes.canonicalize_dtype(saved):
        return weakly_typed(value)
    return value


def _shape(leaf: Stored) -> tuple[int, ...]:
    return leaf.shape[:-1] if leaf.kind == "key" else leaf.shape


def _placements(
    opened: OpenedFile,
    sharding: ShardingSpec,
    index_tree: Callable[[], Any],
    arrays: dict[int, tuple[str, tuple[int, ...], np.dtype]],
) -> dict[int, Any]:
    """Each restored array's placement from ``sharding=``, checked to fit before anything is read.

    ``index_tree()`` gives the restored tree with positions for leaves, needed only when ``sharding`` is a tree.
    """
    if isinstance(sharding, str) and sharding == "saved":
        placements = saved_shardings(opened.stored, arrays, file=opened.file)
    else:
        placements = resolve_shardings(sharding, index_tree, arrays, file=opened.file)
    for i, placement in placements.items():
        check_fits(placement, arrays[i][1], file=opened.file, path=arrays[i][0])
    return placements


def _to_devices(
    opened: OpenedFile,
    paths: Sequence[str],
    values: list[Any],
    positions: Sequence[int],
    placements: dict[int, Any],
    *,
    as_numpy: bool,
) -> None:
    """Put the numpy arrays at ``positions`` of ``values`` (the leaves at ``paths``) on their devices, in place
    (unless ``as_numpy``); arrays this jax cannot hold, or would change (x64 off), are refused first.

    PRNG keys there, already on a device, move to their placement; arrays saved weakly typed come back so.
    """
    if as_numpy:
        return
    arrays = [i for i in positions if isinstance(values[i], np.ndarray)]
    for i in arrays:  # a jax.Array on a memory map's pages would change with the file
        values[i] = np.array(values[i]) if _on_a_map(values[i]) else values[i]
    opened.check_bound_for_jax([(paths[i], values[i]) for i in arrays])
    for i, placed in zip(arrays, _place([values[i] for i in arrays], [placements.get(i) for i in arrays]), strict=True):
        values[i] = placed
    for i in positions:
        if isinstance(values[i], jax.Array) and placements.get(i) is not None and i not in arrays:
            values[i] = place_whole(values[i], placements[i])
        values[i] = _weak_if_saved(opened, paths[i], values[i]) if opened.weak else values[i]


def _on_a_map(array: np.ndarray) -> bool:
    """Whether ``array`` is a view of a memory map (``jaxstow.open(path, mmap=True)``)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return isinstance(array.base, mmap.mmap) or isinstance(getattr(array.base, "obj", None), mmap.mmap)


def _place(arrays: Sequence[np.ndarray], placements: Sequence[Any]) -> list[jax.Array]:
    """Numpy arrays as ``jax.Array``s on their placements (``None``: the default device).

    Large arrays go in one ``device_put`` batch, which adopts 64-byte-aligned host buffers on CPU without a copy;
    small ones are copied by ``jnp.asarray``, which costs less per array than a batch entry.
    """
    out: list[Any] = list(arrays)
    placed = [i for i, placement in enumerate(placements) if placement is not None]
    default = [i for i, array in enumerate(arrays) if placements[i] is None and array.nbytes >= _ADOPT_BYTES]
    for batch, where in ((placed, [placements[i] for i in placed]), (default, None)):
        if batch:
            for i, array in zip(batch, jax.device_put([arrays[i] for i in batch], where), strict=True):
                out[i] = array
    for i in set(range(len(arrays))) - set(placed) - set(default):
        out[i] = jnp.asarray(arrays[i])
    return out


def _fit(
    opened: OpenedFile,
    like: Any,
    *,
    as_numpy: bool,
    sharding: ShardingSpec,
    partial: bool,
    cast: bool,
    every: bool,
    pipeline: bool,
) -> Any:
    paths, wanted, treedef = flatten_like(like, lambda tree: none_as_per_process(tree, opened), file=opened.file)
    if len(set(paths)) < len(paths):  # one file leaf would fill both
        twice = sorted({path for path in paths if paths.count(path) > 1})
        raise StructureMismatchError(
            [f"{path!r}: like has two leaves of this path (a key with '/' beside a nested one?)" for path in twice],
            file=opened.file,
        )
    whole = whole_per_process(opened)  # the file's tree is one per-process value, which like's leaves fill
    paths, problems = (
        like_paths_in_file(opened, paths, treedef, like) if _has_nodes(opened) and not whole else (paths, [])
    )
    placed = sharding is not None and not as_numpy  # sharding= overrides like's placement: numpy leaves' too
    targets = [
        target_of(leaf, file=opened.file, path=path, placed=placed) for path, leaf in zip(paths, wanted, strict=True)
    ]
    targets = scalar_targets(opened, paths, targets, wanted, as_numpy=as_numpy)  # eval_shape's of Python scalars
    templates = per_process_templates(opened, paths) if opened.per_process else {}
    inside = {i for positions in templates.values() for i in positions}
    problems += [
        problem
        for i, (path, target) in enumerate(zip(paths, targets, strict=True))
        if i not in inside and (problem := fit_problem(opened, path, target, cast=cast, as_numpy=as_numpy)) is not None
    ]
    if not partial:
        expected = set(paths) | set(templates)
        problems += [
            f"{path!r}: in the file but not in the structure ({describe_file_leaf(opened, path)}); pass partial=True "
            "to leave it unread"
            for path in opened.leaf_order
            if path not in expected
        ]
    if problems:
        raise StructureMismatchError(problems + where_like_sits(opened.leaf_order, paths), file=opened.file)

    arrays = {
        i: (path, target.shape or (), target.dtype or np.dtype(np.uint8))
        for i, (path, target) in enumerate(zip(paths, targets, strict=True))
        if target.output in ("jax", "key", "scalar") and i not in inside  # a scalar is placed as an array is
    }
    placements = _placements(opened, sharding, lambda: treedef.unflatten(range(len(paths))), arrays)
    for i in arrays:
        if sharding is None and targets[i].sharding is not None and not as_numpy:  # numpy arrays lie nowhere
            placements[i] = targets[i].sharding
            check_fits(placements[i], arrays[i][1], file=opened.file, path=arrays[i][0])
    stored = [i for i, target in enumerate(targets) if target.output not in ("value", "scalar") and i not in inside]

    def value(i: int, data: dict[str, Any]) -> Any:
        return None if i in inside else _output(opened, paths[i], targets[i], data, as_numpy=as_numpy, every=every)

    dtypes = {i: targets[i].dtype for i in arrays}
    values = _read(opened, paths, stored, arrays, placements, value, dtypes, as_numpy=as_numpy, pipeline=pipeline)
    for path, positions in templates.items():
        filled = {paths[i]: i for i in positions}
        fill_from_per_process(opened, path, filled, values, targets, every=every, as_numpy=as_numpy)
    for i in arrays:  # weakly typed as the like leaf is: it promotes alike, and like's traced functions fit it
        values[i] = typed_as(values[i], wanted[i])
    return _rebuilt(opened, treedef, paths, values)


def _streamed(
    opened: OpenedFile, positions: Sequence[int], paths: Sequence[str], placements: dict[int, Any], *, pipeline: bool
) -> dict[int, tuple[str, Any]]:
    """The leaves at ``positions`` that the pipeline restores (none without ``pipeline``), with their placements."""
    if not pipeline:
        return {}
    chosen = set(pipelined_paths(opened, [paths[i] for i in positions]))
    return {i: (paths[i], placements.get(i)) for i in positions if paths[i] in chosen}


def _value(opened: OpenedFile, path: str, *, every: bool) -> Any:
    """The value at ``path``: a value leaf's, or a per-process leaf's own (``every``: each process's)."""
    if path in opened.per_process:
        return per_process_value(opened, path, every=every)
    return opened.value(path)


def _output(opened: OpenedFile, path: str, target: Target, data: dict[str, Any], *, as_numpy: bool, every: bool) -> Any:
    """The restored leaf at ``path`` in the form ``target`` asks for."""
    if target.output == "value":
        value = _value(opened, path, every=every)
        return set_into(target.value, value, every=every) if path in opened.per_process else value
    if target.output == "scalar":  # made already
        return target.value
    value = data[path]
    if target.output == "key":
        return opened.as_leaf(opened.stored[path], value)
    if target.dtype is not None and value.dtype != target.dtype:
        narrowed = isinstance(value, jax.Array) and value.dtype == jax.dtypes.canonicalize_dtype(target.dtype)
        if not narrowed:  # narrowed: jax's x64 is off, and the values were checked to fit as they were narrowed
            value = cast_values(value, target.dtype, file=opened.file, path=path)
    if target.output == "torch" and not as_numpy:
        return tensor_from_numpy(value, file=opened.file, path=path)
    if target.output == "npscalar":
        return value[()]
    return value


def _rebuilt(opened: OpenedFile, treedef: Any, paths: Sequence[str], values: list[Any]) -> Any:
    """The tree of ``values`` (a plain file's: a dict by ``paths``); a class of it that refuses them (its
    ``__post_init__`` checks its arrays) is a :class:`FormatError` naming the file, its own error the cause."""
    if treedef is None:
        return dict(zip(paths, values, strict=True))
    try:
        return treedef.unflatten(values)
    except JaxstowError:
        raise
    except Exception as error:
        raise FormatError(
            f"a class of the saved tree refused the restored values ({type(error).__name__}: {error}); has it changed "
            "since the save?",
            file=opened.file,
        ) from error
