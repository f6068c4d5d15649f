"""Restoring one step: its one tree, or its named items together, with ``select`` and shardings spread over the items.

The step's files are opened, and its items restored, side by side, their reads sharing one pool. A local step's
files are all opened before any is read, so a deletion by another process's keep policy meanwhile does no harm; a
step deleted while it is read is a :class:`~jaxstow.errors.StepNotFoundError`, never damage. Paths of named items
start with the item's name (``params/dense/kernel``), so ``select=["params/**"]`` restores only ``params``.

>>> import io, jax.numpy as jnp, jaxstow
>>> from jaxstow.checkpoint.restoring import restore_items
>>> files = {"params": io.BytesIO(), "opt": io.BytesIO()}
>>> jaxstow.save(files["params"], {"w": jnp.ones(2)})
>>> jaxstow.save(files["opt"], {"mu": jnp.zeros(2)})
>>> for file in files.values():
...     _ = file.seek(0)
>>> restore_items(files, {}, select=["params/**"], as_numpy=True, where="step 1")
{'params': {'w': array([1., 1.], dtype=float32)}}
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any, Unpack

import jax

from jaxstow._format.per_process import states_put_back_on_failure
from jaxstow._format.source import ReadSource
from jaxstow._names.registry import every_library_of
from jaxstow._read.options import LoadOptions
from jaxstow._read.placement import ShardingSpec, is_placement
from jaxstow._read.reader import Reader, open_parts
from jaxstow._read.selection import LeafPaths, Selection
from jaxstow._steps.record import StepRecord
from jaxstow._storage.folders import LocalStore
from jaxstow._util.pools import SharedPool
from jaxstow.checkpoint.step_folder import REPLACED_READS, StepFolder
from jaxstow.checkpoint.writing import SINGLE_ITEM
from jaxstow.errors import CheckpointError, CorruptFileError, FormatError, ShardingError, StructureMismatchError

__all__ = ["open_readers", "restore_items", "restore_step"]

_ITEMS = 16  # items restored at once
#: The threads that restore a step's items side by side, shared by every restore of the process.
_RESTORERS = SharedPool("restore", _ITEMS)


def restore_items(
    sources: Mapping[str, Any],
    likes: Mapping[str, Any],
    *,
    where: str,
    at_once: int = _ITEMS,
    **options: Unpack[LoadOptions],
) -> dict[str, Any]:
    """Each item of ``sources`` (name -> path, file object or :class:`~jaxstow._format.source.ReadSource`, a list of them
    for an item saved by several processes, or a function that opens them) restored, fitted into ``likes[name]``
    where there is one; ``options`` go to :meth:`jaxstow.Reader.load`, with ``select`` and ``sharding`` spread over
    the items. Without ``select`` the items are opened and restored side by side, ``at_once`` at a time.

    A live iterator of ``likes`` takes its state only if every item is restored: a failure puts back the state it had.
    """
    with states_put_back_on_failure(dict(likes)):
        return _restore_items(sources, likes, where=where, at_once=at_once, **options)


def _restore_items(
    sources: Mapping[str, Any],
    likes: Mapping[str, Any],
    *,
    where: str,
    at_once: int,
    **options: Unpack[LoadOptions],
) -> dict[str, Any]:
    select = options.get("select")
    if select is None and len(sources) > 1:
        return _side_by_side(sources, likes, options, at_once)
    with contextlib.ExitStack() as stack:
        readers = open_readers(stack, sources)
        chosen = _spread_selection(select, readers, where=where)
        names = [name for name in readers if select is None or name in chosen]
        if len(names) <= 1:
            return {name: readers[name].load(likes.get(name), **_item_options(options, name, chosen)) for name in names}

        def restore(name: str) -> Any:
            return readers[name].load(likes.get(name), **_item_options(options, name, chosen))

        return _results(dict(zip(names, _RESTORERS.run_each(restore, names), strict=True)))


def _side_by_side(
    sources: Mapping[str, Any], likes: Mapping[str, Any], options: LoadOptions, at_once: int
) -> dict[str, Any]:
    """Every item opened and restored side by side, ``at_once`` at a time, in order; the first error, in the
    items' order, is raised once all have ended.

    An object-store item opened to be read whole gets its header with the first part of its data, in one request,
    and its thread reads on from that answer: it waits for no request that brings no data.
    """
    names = list(sources)

    def restore(name: str) -> Any:
        with open_parts(_targets(sources[name])) as reader:
            return reader.load(likes.get(name), **_item_options(options, name, {}))

    return _results(dict(zip(names, _RESTORERS.run_each(restore, names, at_once=at_once), strict=True)))


def _results(futures: Mapping[str, Future[Any]]) -> dict[str, Any]:
    """Each item's tree; or the first error in the items' order, made to name every library not imported that the
    items' errors name, so that one error says all there is to import; where several items do not fit ``like``, one
    error listing every problem of each, its leaves named with their items' names."""
    errors = {name: future.exception() for name, future in futures.items() if future.exception() is not None}
    mismatches = {name: error for name, error in errors.items() if type(error) is StructureMismatchError}
    if len(mismatches) > 1 and len(mismatches) == len(errors):
        raise StructureMismatchError(
            [_in_item(name, problem) for name, error in mismatches.items() for problem in error.problems],
            file=", ".join(str(error.file) for error in mismatches.values()),
        )
    combined = every_library_of(future.exception() for future in futures.values())
    if combined is not None:
        raise combined
    return {name: future.result() for name, future in futures.items()}


def _in_item(item: str, problem: str) -> str:
    """A problem of an item's file, its leaf's path (quoted first) made the path within the step.

    >>> _in_item("opt", "'nu': missing from the file"), _in_item("opt", "'': a per-process value")
    ("'opt/nu': missing from the file", "'opt': a per-process value")
    """
    quote = problem[:1]
    end = problem.find(quote + ":", 1) if quote in ("'", '"') else -1
    if end < 0:
        return f"{item}: {problem}"
    return repr("/".join(filter(None, (item, problem[1:end])))) + problem[end + 1 :]


def _targets(source: Any) -> list[Any]:
    """An item's files: a function's that opens them, a list, or one."""
    opened = source() if callable(source) else source
    return opened if isinstance(opened, list) else [opened]


def open_readers(stack: contextlib.ExitStack, sources: Mapping[str, Any]) -> dict[str, Reader]:
    """A reader of each item of ``sources`` (as :func:`restore_items` takes them), closed when ``stack`` closes; the
    sources of items not yet opened when one fails are closed too."""
    readers: dict[str, Reader] = {}
    items = [(name, _targets(source)) for name, source in sources.items()]
    for index, (name, targets) in enumerate(items):
        try:
            readers[name] = stack.enter_context(open_parts(targets))
        except BaseException:  # open_parts closed the failing item's sources
            for _, later in items[index + 1 :]:
                for target in later:
                    if isinstance(target, ReadSource):
                        target.close()
            raise
    return readers


def _spread_selection(
    select: str | Sequence[str] | None, readers: Mapping[str, Reader], *, where: str
) -> dict[str, LeafPaths]:
    """The leaf paths chosen in each item; an item with none is left out, and a pattern matching nothing is an error."""
    if select is None:
        return {}
    everything = [f"{name}/{path}" for name, reader in readers.items() for path in reader.paths]
    chosen: dict[str, list[str]] = {}
    for path in Selection(select).choose(everything, file=where):
        name, _, inner = path.partition("/")
        chosen.setdefault(name, []).append(inner)
    return {name: LeafPaths(paths) for name, paths in chosen.items()}  # each its own path, whatever it holds


def _item_options(options: LoadOptions, name: str, chosen: Mapping[str, LeafPaths]) -> LoadOptions:
    """The options of one item: its share of the selection, and its own sharding."""
    item = options.copy()
    item["select"] = chosen.get(name)
    item["sharding"] = _item_sharding(options.get("sharding"), name)
    return item


def _check_sharded_items(sharding: ShardingSpec, names: Sequence[str], *, where: str) -> None:
    """Refuse a ``sharding`` dict keyed by a name that is none of the step's items (a typo would place the item it
    meant on the default device, silently)."""
    if not isinstance(sharding, Mapping) or is_placement(sharding):
        return
    if unknown := sorted(str(key) for key in sharding if key not in names):
        raise ShardingError(
            f"sharding= is keyed by {', '.join(map(repr, unknown))}, which the step has no item of (its items are "
            f"{', '.join(map(repr, names))}): key it by item name",
            file=where,
        )


def _item_sharding(sharding: ShardingSpec, name: str) -> ShardingSpec:
    if sharding is None or is_placement(sharding) or isinstance(sharding, jax.sharding.Mesh):  # a Mesh: load says
        return sharding
    if isinstance(sharding, Mapping):
        return sharding.get(name)
    if callable(sharding):
        function = sharding

        def in_item(path: str, shape: tuple[int, ...], dtype: Any) -> Any:  # an item that is one array: its name
            return function("/".join(filter(None, (name, path))), shape, dtype)

        return functools.wraps(function)(in_item)  # an error names the user's function
    return sharding


def restore_step(folder: StepFolder, step: int, like: Any, items: Sequence[str] | None, options: LoadOptions) -> Any:
    """Restore one committed step of ``folder`` as it was saved: one tree, or a dict of (some of) its named items; a
    :class:`~jaxstow.errors.StepNotFoundError` if the step is deleted before it is read.

    A step replaced while it is read (``save(step, force=True)`` by the process that saves here) is read again,
    whole, from its new record: its old files gone or new ones in their place are no damage. A local copy
    (``cache_dir``) found damaged is removed, and the step read again from the store itself, whose damage is the
    step's own. Data that fails its checksum is read again once: bytes damaged on their way (a flaky network) are
    no damage."""
    with folder.reading(step):
        record, read_again = folder.checked_record(step), False
        for _ in range(REPLACED_READS - 1):
            try:
                return _restore_step(folder, step, record, like, items, options)
            except (CheckpointError, FormatError) as error:
                if folder.evict_damaged_copy(error):  # a local copy gone bad (cache_dir): read from the store
                    folder = folder.in_store()
                    continue
                if (now := folder.checked_record(step)) != record:
                    record, read_again = now, False  # replaced while it was read: read the new one
                elif read_again or not isinstance(error, CorruptFileError):
                    raise
                else:
                    read_again = True  # bytes damaged on their way are no damage: the same read once more
        return _restore_step(folder, step, record, like, items, options)


def _restore_step(
    folder: StepFolder, step: int, record: StepRecord, like: Any, items: Sequence[str] | None, options: LoadOptions
) -> Any:
    # Every leaf read, from the first on: an object's first request then brings data with the header.
    whole = options.get("select") is None and not options.get("partial") and jax.process_count() == 1
    if record.single:
        if items is not None:
            raise CheckpointError(
                f"step {step} of {folder.store.location} was saved as one tree, not as named items: restore it "
                "without items=",
                file=folder.url(step),
            )
        with open_parts(folder.open_files(record, [SINGLE_ITEM], whole=whole)[SINGLE_ITEM]) as reader:
            return reader.load(like, **options)
    names = folder.chosen_items(step, record, items, like, partial=bool(options.get("partial")))
    _check_sharded_items(options.get("sharding"), sorted(record.files), where=folder.url(step))
    if isinstance(folder.store, LocalStore):  # an open local file is read whole even if its step is deleted
        return restore_items(folder.open_files(record, names), like or {}, where=folder.url(step), **options)
    # Each item opened as a thread is free for it; no more items at once than requests in flight, each of whose first
    # answer a thread reads on from.
    from jaxstow._storage.remote_store import RemoteStore

    sources = {name: functools.partial(folder.open_item, record, name, whole=whole) for name in names}
    at_once = min(_ITEMS, folder.store.settings.transfer.requests) if isinstance(folder.store, RemoteStore) else _ITEMS
    return restore_items(sources, like or {}, where=folder.url(step), at_once=at_once, **options)
