"""``CheckpointManager``: the numbered steps of a run, kept by policy, saved in the background, safe against crashes.

A directory (local path or fsspec URL) holds one folder per committed step::

    <directory>/<step>/params.safetensors     one jaxstow file per item; jaxstow.load opens each on its own
    <directory>/<step>/opt_state.safetensors
    <directory>/<step>/checkpoint.json        step, time, metrics, metadata, files; written last
    <directory>/.jaxstow.lock                 the writer's process and host, while it writes

>>> import tempfile, jax.numpy as jnp
>>> from jaxstow import CheckpointManager
>>> with CheckpointManager(tempfile.mkdtemp(), keep_last=2) as manager:
...     for step in range(4):
...         manager.save(step, {"params": {"w": jnp.full(2, step)}, "epoch": step // 2}, metrics={"loss": 1 / (1 + step)})
...     print(manager.steps(), manager.metrics(3), manager.restore())
[2, 3] {'loss': 0.25} {'epoch': 1, 'params': {'w': Array([3, 3], dtype=int32)}}
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import re
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, Unpack, cast

from jaxstow._read.options import LoadOptions
from jaxstow._read.reader import open_parts
from jaxstow._steps.keep import KeepPolicy
from jaxstow._steps.names import StepNames
from jaxstow._steps.record import (
    RECORD_NAME,
    Metrics,
    StepRecord,
    check_metadata,
    check_metrics,
)
from jaxstow._storage.lock import Lock, lock_store
from jaxstow._storage.store import Store, open_store
from jaxstow._util.progress import require_progress_bar
from jaxstow._write.background import BackgroundWriter
from jaxstow._write.held import HeldTree, hold
from jaxstow._write.save_report import SaveReport
from jaxstow.checkpoint.processes import Processes
from jaxstow.checkpoint.restoring import restore_items
from jaxstow.checkpoint.shared import save_shared
from jaxstow.checkpoint.step_folder import StepFolder, check_step
from jaxstow.errors import ArgumentError, CheckpointError

__all__ = ["CheckpointManager"]

logger = logging.getLogger(__name__)

#: The item name of a step saved as one tree rather than a dict of named items.
SINGLE_ITEM = "state"
_ITEM_NAME = re.compile(r"[A-Za-z0-9_-]+")
_EXTENSION = ".safetensors"


def _split_items(items: Any) -> tuple[dict[str, Any], bool]:
    """Named items (a dict with string keys) or one tree; the flag says which."""
    if not (isinstance(items, dict) and all(isinstance(name, str) for name in items)):
        return {SINGLE_ITEM: items}, True
    bad = [name for name in items if not _ITEM_NAME.fullmatch(name)]
    if bad:
        raise ArgumentError(
            f"item names become file names, so they may hold only letters, digits, '_' and '-'; {bad!r} do not "
            "(to save a dict with such keys as one tree, wrap it: save(step, {'state': tree}))"
        )
    return dict(items), False


class CheckpointManager:
    """Saves and restores the numbered steps of a run in ``directory`` (a path or an fsspec URL such as ``s3://...``).

    Keep policies combine: the latest ``keep_last`` steps, every step divisible by ``keep_every``, and the
    ``keep_best`` steps by the metric ``metric`` (lowest first with ``mode="min"``, highest with ``"max"``). The newest
    step is kept until a newer one is committed; older steps are deleted only after a save has committed. With no
    policy every step is kept.

    With ``async_save`` (the default), :meth:`save` returns once the arrays are held on the host and the files are
    written on a background thread, one save at a time; an error there is raised, with its cause, by the next
    :meth:`save`, :meth:`wait`, :meth:`close` or the end of a ``with`` block. Reads (:meth:`steps`, :meth:`restore`,
    ...) first wait for the save in flight, so they see every save made before them. ``progress=True`` draws a progress
    bar (needs ``tqdm``); progress is always logged to the ``jaxstow`` logger. ``storage_options`` go to fsspec.

    The first save takes the directory's lock (a second writer gets a :class:`~jaxstow.errors.CheckpointError` naming
    the first; the lock of a dead writer is taken over) and removes what interrupted saves left. Reading takes no lock,
    so another process may restore while this one writes.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        keep_last: int | None = None,
        keep_every: int | None = None,
        keep_best: int | None = None,
        metric: str | None = None,
        mode: Literal["min", "max"] = "min",
        async_save: bool = True,
        progress: bool = False,
        storage_options: dict[str, Any] | None = None,
        process_timeout: float = 600.0,
    ) -> None:
        self._policy = KeepPolicy(keep_last, keep_every, keep_best, metric, mode)
        if progress:
            require_progress_bar()
        self._store: Store = open_store(directory, marker=RECORD_NAME, storage_options=storage_options)
        self._progress = progress
        self._names = StepNames("%d")
        self._folder = StepFolder(self._store, self._names)
        self._writer = BackgroundWriter(asynchronous=async_save)
        self._lock: Lock | None = None
        self._closed = False
        self._processes = Processes(self._store.location, timeout=process_timeout)

    @property
    def directory(self) -> str:
        """The directory, as given (a path or a URL)."""
        return self._store.location

    @property
    def policy(self) -> KeepPolicy:
        return self._policy

    def __repr__(self) -> str:
        return f"CheckpointManager({self.directory!r}, {self._policy})"

    # -- saving ---------------------------------------------------------------------------------------------------

    def save(
        self,
        step: int,
        items: Any,
        *,
        metrics: Mapping[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        force: bool = False,
        copy: bool = False,
    ) -> None:
        """Save ``items`` as ``step``: a dict of named pytrees (one file each) or any other pytree (one file).

        ``metrics`` (numbers, e.g. ``{"loss": 0.1}``) rank steps for ``keep_best`` and come back from
        :meth:`metrics`; ``metadata`` is any JSON-able dict, back from :meth:`metadata`. A step that exists raises a
        :class:`~jaxstow.errors.CheckpointError` unless ``force=True``, which replaces it atomically. ``copy=True``
        copies the arrays before returning, for numpy buffers that the caller changes in place.
        """
        self._check_open()
        step = check_step(step)
        named, single = _split_items(items)
        checked_metrics = check_metrics(metrics, step=step)
        if self._policy.ranks and self._policy.metric not in (checked_metrics or {}):
            raise ArgumentError(
                f"keep_best ranks steps by the metric {self._policy.metric!r}, so save(step={step}) needs "
                f"metrics={{{self._policy.metric!r}: ...}}"
            )
        checked_metadata = check_metadata(metadata, step=step)
        self._writer.wait()
        if self._lock is None and self._processes.index == 0:
            self._take_lock()
        exists = step in self._committed_steps()
        if exists and not force:
            raise CheckpointError(
                f"step {step} already exists in {self.directory}; pass force=True to replace it", file=self._url(step)
            )
        part = self._processes.index if self._processes.many else None
        held = {
            name: hold(tree, copy=copy, file=self._url(step, name + _EXTENSION), part=part)
            for name, tree in named.items()
        }
        write = self._write_shared if self._processes.many else self._write
        job = functools.partial(write, step, held, single, checked_metrics, checked_metadata, exists)
        if self._processes.many:
            job = functools.partial(job, key=self._processes.next_save())
        self._writer.submit(job, what=f"saving step {step} to {self.directory}")

    def delete(self, step: int) -> None:
        """Delete a committed step now, whatever the keep policy says (after the save in flight)."""
        self._check_open()
        self._writer.wait()
        step = self._existing(step)
        if self._processes.index != 0:  # process 0 deletes for all
            return
        if self._lock is None:
            self._take_lock()
        self._store.delete(self._names.name(step))
        self._folder.forget(step)
        logger.info("%s: deleted step %d", self.directory, step)

    def _check_open(self) -> None:
        if self._closed:
            raise CheckpointError(f"the checkpoint manager of {self.directory} is closed")

    def _take_lock(self) -> None:
        self._lock = lock_store(self._store)
        self._folder.cache = True  # no one else can replace a step now
        removed = self._store.cleanup(lambda name: self._names.step(name) is not None)
        if removed:
            logger.info("%s: removed leftovers of interrupted saves: %s", self.directory, ", ".join(removed))

    def _write(
        self,
        step: int,
        held: dict[str, HeldTree],
        single: bool,
        metrics: Metrics | None,
        metadata: dict[str, Any] | None,
        replace: bool,
    ) -> None:
        """The background half of a save: encode, write every item, commit, then apply the keep policy."""
        encoded = {name: item.encode() for name, item in held.items()}
        total = sum(tree.nbytes for tree in encoded.values())
        progress = SaveReport(f"step {step} of {self.directory}", total=total, bar=self._progress)
        staging = self._store.stage(self._names.name(step), replace=replace)
        try:
            files, headers = {}, {}
            for name, tree in encoded.items():
                with staging.open(name + _EXTENSION) as (stored, sink):
                    header = tree.write(progress.sink(sink))
                files[name] = stored
                if header is not None:
                    headers[stored] = header
            record = StepRecord(
                step, files, single, metrics, metadata, keep_policy=dataclasses.asdict(self._policy), headers=headers
            )
            staging.commit(record.to_json())
        except BaseException:
            staging.abort()
            raise
        self._folder.remember(record)
        progress.finish()
        self._prune()

    def _write_shared(
        self,
        step: int,
        held: dict[str, HeldTree],
        single: bool,
        metrics: Metrics | None,
        metadata: dict[str, Any] | None,
        replace: bool,
        *,
        key: str,
    ) -> None:
        """The background half of a save made by every process together (see :mod:`jaxstow.checkpoint.shared`)."""
        progress = SaveReport(f"step {step} of {self.directory}", total=0, bar=self._progress)
        record = save_shared(
            self._processes,
            self._store,
            key=key,
            step=step,
            folder=self._names.name(step),
            items=held,
            extension=_EXTENSION,
            single=single,
            metrics=metrics,
            metadata=metadata,
            replace=replace,
            progress=progress,
            keep_policy=dataclasses.asdict(self._policy),
        )
        progress.finish()
        if record is not None:
            self._folder.remember(record)
            self._prune()

    def _prune(self) -> None:
        steps = self._committed_steps()
        metric = cast(str, self._policy.metric)
        values = {step: self._folder.ranking_value(step, metric) for step in steps} if self._policy.ranks else {}
        for step in self._policy.to_delete(steps, values):
            self._store.delete(self._names.name(step))
            self._folder.forget(step)
            logger.info("%s: deleted step %d (keep policy)", self.directory, step)

    # -- reading --------------------------------------------------------------------------------------------------

    def _url(self, step: int, *parts: str) -> str:
        return self._folder.url(step, *parts)

    def _committed_steps(self) -> list[int]:
        return self._folder.committed()

    def _record(self, step: int) -> StepRecord:
        return self._folder.record(step)

    def damaged_steps(self) -> dict[int, str]:
        """The committed steps that cannot be restored as saved, each with the reason (waits for the save in flight).

        A step is damaged when its ``checkpoint.json`` was changed, an item file is missing or an item file's header
        is not the one recorded. (Damage to the data of an item is found when it is restored, by its checksums.)
        """
        self._writer.idle()
        return self._folder.damaged()

    def latest_intact_step(self) -> int | None:
        """The newest committed step that is not damaged (see :meth:`damaged_steps`), or ``None``.

        ``restore()`` never falls back on its own: a damaged latest step raises. To fall back, ask for it:
        ``manager.restore(manager.latest_intact_step())``.
        """
        damaged = self.damaged_steps()
        intact = [step for step in self._committed_steps() if step not in damaged]
        return intact[-1] if intact else None

    def steps(self) -> list[int]:
        """The committed steps, in increasing order (waits for the save in flight)."""
        self._writer.idle()
        return self._committed_steps()

    def latest_step(self) -> int | None:
        """The newest committed step, or ``None`` if there is none."""
        steps = self.steps()
        return steps[-1] if steps else None

    def _existing(self, step: int | None) -> int:
        self._writer.idle()
        return self._folder.existing(step)

    def metrics(self, step: int) -> dict[str, float | None] | None:
        """The metrics saved with ``step`` (non-finite values read back as ``None``)."""
        return self._record(self._existing(step)).metrics

    def metadata(self, step: int) -> dict[str, Any] | None:
        """The metadata saved with ``step``."""
        return self._record(self._existing(step)).metadata

    def items(self, step: int) -> list[str] | None:
        """The names of the items of ``step``, or ``None`` if it was saved as one tree."""
        record = self._record(self._existing(step))
        return None if record.single else sorted(record.files)

    def restore(
        self,
        step: int | None = None,
        like: Any = None,
        *,
        items: Sequence[str] | None = None,
        **options: Unpack[LoadOptions],
    ) -> Any:
        """Restore ``step`` (the latest committed one by default), as it was saved: a dict of items, or one tree.

        Without ``like`` every tree is rebuilt from its file, as :func:`jaxstow.load` does. With ``like``, leaves are
        fitted into its structure, all or nothing (dtype and shape checked, the sharding of its arrays applied); for
        named items ``like`` is a dict from item names to trees, or to ``None`` to rebuild that item. ``items`` restores
        only the named ones. A manager made with ``progress=True`` draws a bar for each item read. The options are
        those of :func:`jaxstow.load` (:class:`jaxstow.LoadOptions`); with named items, paths start with the item's name (``select=["params/**"]``), and a
        ``sharding`` dict keyed by item names gives each item its own.
        """
        step = self._existing(step)
        record = self._record(step)
        options.setdefault("progress", self._progress)
        if record.single:
            if items is not None:
                raise CheckpointError(
                    f"step {step} of {self.directory} was saved as one tree, not as named items: restore it without "
                    "items=",
                    file=self._url(step),
                )
            with open_parts(self._folder.sources(step, record, SINGLE_ITEM)) as reader:
                return reader.load(like, **options)
        names = self._folder.chosen_items(step, record, items, like)
        sources = {name: self._folder.sources(step, record, name) for name in names}
        return restore_items(sources, like or {}, where=self._url(step), **options)

    # -- lifetime -------------------------------------------------------------------------------------------------

    def wait(self) -> None:
        """Wait for the save in flight; raise its error (with the original as ``__cause__``) if it failed."""
        self._writer.wait()

    def close(self) -> None:
        """Finish the save in flight, release the lock and raise the save's error, if any (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._writer.close()
        finally:
            if self._lock is not None:
                self._lock.release()
                self._lock = None

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()
