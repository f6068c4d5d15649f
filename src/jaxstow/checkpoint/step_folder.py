"""The committed steps of a checkpoint directory, as read back: their records (checksummed), item files and items.

>>> import tempfile, jax.numpy as jnp
>>> from jaxstow import CheckpointManager
>>> from jaxstow._steps.names import StepNames
>>> from jaxstow._steps.record import RECORD_NAME
>>> from jaxstow._storage.store import open_store
>>> from jaxstow.checkpoint.step_folder import StepFolder
>>> directory = tempfile.mkdtemp()
>>> with CheckpointManager(directory) as manager:
...     manager.save(3, {"params": {"w": jnp.ones(2)}}, metrics={"loss": 0.5})
>>> folder = StepFolder(open_store(directory, marker=RECORD_NAME), StepNames("%d"))
>>> folder.committed(), folder.record(3).metrics
([3], {'loss': 0.5})
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from jaxstow._format.source import ReadSource
from jaxstow._steps.keep import KeepPolicy
from jaxstow._steps.names import StepNames, check_step
from jaxstow._steps.record import RECORD_NAME, StepRecord, check_item_header, missing_item_file
from jaxstow._storage.folders import LocalStore
from jaxstow._storage.store import Store
from jaxstow._util.pools import SharedPool
from jaxstow.errors import (
    ArgumentError,
    CheckpointError,
    CorruptFileError,
    FormatError,
    JaxstowError,
    StepNotFoundError,
    StorageError,
    failed,
)

#: The threads that open a step's files side by side (16 at once: on an object store each open is a request for the
#: file's first bytes), shared by every restore and check of the process.
_OPENERS = SharedPool("open", 16)

__all__ = ["REPLACED_READS", "StepFolder", "check_step", "replaced_pause"]

#: The reads of a step that the process saving here replaces (``force=True``) again and again before a mismatch of
#: its files and its record is taken for damage (each read that failed found a new record: the step was replaced
#: between the reads of its record and of its files).
REPLACED_READS = 20


def replaced_pause(attempt: int) -> None:
    """Wait a moment before the next read of a step that may be being replaced: 10, 20, 40, 80, 160 ms, 160 ms, ..."""
    time.sleep(0.01 * 2 ** min(attempt, 4))


logger = logging.getLogger("jaxstow.checkpoint.manager")
T = TypeVar("T")


class StepFolder:
    """The committed steps in ``store``, whose folders ``names`` names.

    Records are checked when read; with ``cache=True`` (set while this process holds the directory's lock, so that no
    one else can replace a step) each is read once.
    """

    def __init__(self, store: Store, names: StepNames) -> None:
        self.store = store
        self.names = names
        self.cache = False
        self._records: dict[int, StepRecord] = {}
        #: Steps this process found damaged: the keep policy neither counts them among the steps it keeps nor
        #: deletes them (an intact older step is worth more than a damaged newer one).
        self.damaged: set[int] = set()

    def in_store(self) -> StepFolder:
        """This folder as a host without its local copies (``cache_dir``) reads it, every file from the store: what
        damage is checked in. The steps found damaged there are this folder's."""
        without_cache = getattr(self.store, "without_cache", None)
        if without_cache is None:
            return self
        folder = StepFolder(without_cache(), self.names)
        folder.damaged = self.damaged
        return folder

    def url(self, step: int, *parts: str) -> str:
        """Where ``step`` (or a file in it) is, for messages."""
        return self.store.url(self.names.name(step), *parts)

    def committed(self) -> list[int]:
        """The committed steps, in increasing order: those the store lists and, while this process holds the lock
        (:attr:`cache`), those it committed or read since, which an object store may list only seconds later (a
        local folder lists each step as it is: one deleted by hand is gone at once)."""
        listed = self.names.steps(self.store.committed())
        lags = self.cache and not isinstance(self.store, LocalStore)
        return sorted({*listed, *self._records}) if lags else listed

    def existing(self, step: int | None) -> int:
        """``step`` if it is committed, or the latest committed step for ``None``; a :class:`StepNotFoundError`
        if there is none."""
        steps = self.committed()
        if step is None:
            if not steps:
                raise StepNotFoundError(f"{self.store.location} holds no committed step to restore")
            return steps[-1]
        step = check_step(step)
        if step not in steps:
            raise StepNotFoundError(f"step {step} is not in {self.store.location}; its committed steps are {steps}")
        return step

    def evict_damaged_copy(self, error: BaseException) -> bool:
        """Remove the local copy (``cache_dir``) that ``error``, a checksum mismatch, names, so that the next read
        fetches the file from the store again; whether there was one. Only the store's bytes make a step damaged."""
        cache = getattr(getattr(self.store, "settings", None), "cache_dir", None)
        named = getattr(error, "file", None)
        if not (cache and named and isinstance(error, CorruptFileError)):
            return False
        copy = os.path.abspath(named)
        if not copy.startswith(os.path.abspath(cache) + os.sep) or not os.path.isfile(copy):
            return False
        logger.warning("%s: the local copy %s is damaged (%s); fetching it again", self.store.location, copy, error)
        os.remove(copy)
        return True

    @contextlib.contextmanager
    def reading(self, step: int) -> Iterator[None]:
        """Read ``step`` in the block; an error that its deletion meanwhile explains becomes a StepNotFoundError.

        A step deleted by the keep policy of the process that saves here is not damage; other errors pass unchanged.

        >>> import os, shutil, tempfile, numpy as np
        >>> from jaxstow import CheckpointManager
        >>> from jaxstow._storage.store import open_store
        >>> directory = tempfile.mkdtemp()
        >>> with CheckpointManager(directory) as manager:
        ...     manager.save(1, {"w": np.ones(2)})
        ...     manager.save(2, {"w": np.ones(2)})
        >>> folder = StepFolder(open_store(directory, marker=RECORD_NAME), StepNames("%d"))
        >>> with folder.reading(1):
        ...     record = folder.read_record(1, check_files=False)
        ...     shutil.rmtree(os.path.join(directory, "1"))  # as the process that saves there deletes it
        ...     folder.open_files(record, ["w"])
        Traceback (most recent call last):
        ...
        jaxstow.errors.StepNotFoundError: step 1 is not in ... any more: it was deleted while it was read (by delete() or the keep policy of the process that saves there); its committed steps are [2]
        """
        try:
            yield
        except StepNotFoundError:
            raise
        except (OSError, CheckpointError, FormatError):
            try:
                steps = self.committed()
            except (OSError, JaxstowError):  # the listing fails too: the read's own error says more
                steps = [step]
            if step in steps:
                raise
            raise StepNotFoundError(
                f"step {step} is not in {self.store.location} any more: it was deleted while it was read (by "
                f"delete() or the keep policy of the process that saves there); its committed steps are {steps}"
            ) from None

    def prune(self, policy: KeepPolicy, *, saved: int) -> Iterator[int]:
        """Delete the committed steps that ``policy`` keeps no more, oldest first, once step ``saved`` is committed;
        each step once deleted (logged: with a warning where it is ``saved``)."""
        steps = self.committed()
        records = {step: self.unchecked_record(step) for step in steps} if policy.ranks or policy.times else {}
        metric = policy.metric or ""
        values = {step: record.metric(metric) if record else None for step, record in records.items()}
        times = {step: record.time for step, record in records.items() if record is not None}
        doomed = list(policy.to_delete([step for step in steps if step not in self.damaged], values, times))
        # A step kept in place of the doomed ones must be one: a record that does not check (a folder copied under
        # another number by hand) would have the rules delete every intact step.
        kept = [step for step in steps if step not in self.damaged and step not in doomed] if doomed else []
        if unreadable := [step for step in kept if (records.get(step) or self.unchecked_record(step)) is None]:
            self.damaged.update(unreadable)
            doomed = list(policy.to_delete([step for step in steps if step not in self.damaged], values, times))
        self._warn_of_other_policies(doomed, policy)
        for step in doomed:
            try:
                self.store.delete(self.names.name(step))
            except StorageError as error:  # the step saved is committed: only the deletion failed
                raise failed(
                    CheckpointError,
                    f"step {saved} is saved, but deleting step {step}, which the keep policy keeps no more, failed "
                    f"(a later save or manager of this folder tries again): {error}",
                    error,
                ) from error
            self.forget(step)
            if step == saved:  # a run gone back to an earlier step: its new work would be lost unseen
                logger.warning(
                    "%s: step %d was saved and at once deleted: no rule of the keep policy (%s) keeps it beside "
                    "the later steps %s; delete the later steps first (manager.delete(step)) when a run goes back to an "
                    "earlier one",
                    self.store.location,
                    step,
                    policy,
                    [later for later in steps if later > step][:5],
                )
            else:
                logger.info("%s: deleted step %d (keep policy)", self.store.location, step)
            yield step

    def _warn_of_other_policies(self, doomed: Sequence[int], policy: KeepPolicy) -> None:
        """Warn of the steps ``policy`` deletes that were saved under another keep policy (a run restarted with other
        rules), which may have kept them: milestones and best steps are gone unseen otherwise."""
        current = dataclasses.asdict(policy)
        earlier: dict[str, list[int]] = {}
        for step in doomed:
            record = self.unchecked_record(step)
            if record is not None and record.keep_policy is not None and record.keep_policy != current:
                earlier.setdefault(_described_policy(record.keep_policy), []).append(step)
        for described, steps in earlier.items():
            logger.warning(
                "%s: deleting steps %s, saved under another keep policy (%s) than this manager's (%s): give the "
                "manager the policy they were saved under (keep=KeepPolicy(...)) to keep such steps",
                self.store.location,
                steps,
                described,
                policy,
            )

    def remember(self, record: StepRecord) -> None:
        """Keep the record of a step this process has just committed."""
        self.damaged.discard(record.step)
        if self.cache:
            self._records[record.step] = record

    def stop_caching(self) -> None:
        """Read every record from storage again from now on: once this process lets the lock go, another may replace
        a step."""
        self.cache = False
        self._records.clear()

    def forget(self, step: int) -> None:
        """Drop the record of a deleted step."""
        self._records.pop(step, None)
        self.damaged.discard(step)

    def record(self, step: int) -> StepRecord:
        """A step's record, its item files checked."""
        record = self._records.get(step)
        if record is None:
            record = self.read_record(step, check_files=True)
            if self.cache:  # kept, but not as committed: a step found damaged in its data stays so
                self._records[step] = record
        return record

    def read_record(self, step: int, *, check_files: bool) -> StepRecord:
        """A step's record read from storage: checksummed, and with ``check_files`` its item files' headers too; a
        :class:`StepNotFoundError` if the step is deleted meanwhile. Files that do not match their record are read
        again with the record: the process that saves here may be replacing the step (``force=True``)."""
        if not check_files:
            with self.reading(step):
                return self._record_alone(step)
        return self.while_replaced(step, self._files_checked)

    def while_replaced(self, step: int, attempt: Callable[[StepRecord], T]) -> T:
        """``attempt(record)`` with the step's record and, where it fails on the step's files (a
        :class:`CheckpointError` or :class:`FormatError`) and the record has changed since, with the new one: the
        process that saves here replaced the step (``force=True``) meanwhile. A failure is the step's own only where
        its record stays the same (or the step was replaced ``REPLACED_READS`` times in a row)."""
        with self.reading(step):
            record, tries = self._record_alone(step), 1
            while True:
                try:
                    return attempt(record)
                except (CheckpointError, FormatError):
                    try:
                        now: StepRecord | None = self._record_alone(step)
                    except (CheckpointError, FormatError):  # replaced in two moves (an object store): read again
                        now = None
                        replaced_pause(tries - 1)
                    if now == record or tries == REPLACED_READS:
                        raise
                    record, tries = now or record, tries + 1

    def _others(self, step: int) -> list[int] | str:
        """The committed steps but ``step`` (deleted, though a listing may show it), or why they are not known."""
        try:
            return [other for other in self.committed() if other != step]
        except (OSError, JaxstowError) as failure:
            return f"not known (listing them failed: {failure})"

    def _record_alone(self, step: int) -> StepRecord:
        """The step's record, checksummed (one that fails is read again once); its files unchecked. A record the store
        does not hold (asked for by key) is a step deleted, whatever a listing shows: a store may list a deleted object
        for seconds."""
        name = self.names.name(step)
        where = self.url(step, RECORD_NAME)
        try:
            data = self.store.read_marker(name)
            try:
                record = StepRecord.from_json(data, where=where)
            except FormatError:  # read again: bytes damaged on their way (a flaky network) are no damage
                if (again := self.store.read_marker(name)) == data:
                    raise
                record = StepRecord.from_json(again, where=where)
        except FileNotFoundError:
            raise StepNotFoundError(
                f"step {step} is not in {self.store.location} any more: the store holds no {RECORD_NAME} of it (a "
                f"store may list a deleted step for a while); its committed steps are {self._others(step)}",
                file=where,
            ) from None
        if record.step != step:
            raise CheckpointError(
                f"{where}: the record says step {record.step}, but its folder is step {step}", file=where
            )
        return record

    def _files_checked(self, record: StepRecord) -> StepRecord:
        """``record``, once each of its files is opened and checked against it."""
        for sources in self.open_files(record, sorted(record.files)).values():
            for source in sources:
                source.close()
        return record

    def checked_record(self, step: int) -> StepRecord:
        """A step's record, its own checksum checked (its files are checked as :meth:`open_files` opens them)."""
        return self._records.get(step) or self.read_record(step, check_files=False)

    def unchecked_record(self, step: int) -> StepRecord | None:
        """A step's record as the keep policy reads it (checksummed, its files unchecked), or ``None`` if it is
        damaged: such a step ranks last and has no time."""
        try:
            return self._records.get(step) or self.read_record(step, check_files=False)
        except JaxstowError:
            return None

    def open_files(
        self, record: StepRecord, items: Sequence[str], *, whole: bool = False
    ) -> dict[str, list[ReadSource]]:
        """The files of ``items`` (each one file, or one per process that saved the step), opened side by side and
        each checked against the header checksum the record names; a missing file is a CheckpointError naming it.
        ``whole``: they are to be read whole (on an object store, each first request brings data with the header)."""
        name = self.names.name(record.step)
        wanted = [(item, file) for item in items for file in record.item_files(item)]

        def open_checked(item_file: tuple[str, str]) -> ReadSource:
            item, file = item_file
            where = self.url(record.step, file)
            try:
                source = self.store.source(name, file, (record.headers or {}).get(file), whole=whole)
            except FileNotFoundError:
                raise missing_item_file(record, item, where) from None
            try:
                check_item_header(record, item, file, source, where)
            except BaseException:
                source.close()
                raise
            return source

        futures = _OPENERS.run_each(open_checked, wanted)
        failed = [future for future in futures if future.exception() is not None]
        if failed:
            for future in futures:
                if future.exception() is None:
                    future.result().close()
            raise failed[0].exception()  # type: ignore[misc]
        opened: dict[str, list[ReadSource]] = {item: [] for item in items}
        for (item, _), future in zip(wanted, futures, strict=True):
            opened[item].append(future.result())
        return opened

    def open_item(self, record: StepRecord, item: str, *, whole: bool = False) -> list[ReadSource]:
        """The files of one item, opened and checked as :meth:`open_files` does."""
        return self.open_files(record, [item], whole=whole)[item]

    def chosen_items(
        self, step: int, record: StepRecord, items: Sequence[str] | None, like: Any, *, partial: bool = False
    ) -> list[str]:
        """The items of ``step`` to restore: ``items`` (all by default; with ``partial``, those ``like`` has), checked
        against the step and ``like``."""
        saved = sorted(record.files)
        if isinstance(items, str) or not (items is None or isinstance(items, Iterable)):
            shown = repr(items) if isinstance(items, str) else "'params'"
            raise ArgumentError(f"items must be a list of item names, such as [{shown}], not {items!r}")
        names = saved if items is None else list(items)
        if twice := sorted({name for name in names if names.count(name) > 1}, key=str):
            raise ArgumentError(f"items names {twice} twice: name each item once")
        unknown = [name for name in names if name not in record.files]
        if unknown:
            raise CheckpointError(f"step {step} of {self.store.location} has no item {unknown} (its items: {saved})")
        if like is None:
            return names
        if not isinstance(like, Mapping):
            raise ArgumentError(
                f"step {step} holds named items {saved}, so like must be a dict from item names to trees (or None to "
                f"rebuild an item), not {type(like).__name__}"
            )
        if partial and items is None:  # the items like leaves out are left unread, as its leaves within one are
            names = [name for name in names if name in like]
        missing = [name for name in names if name not in like]
        # Entries of the step's other items are of no use with items= (a whole train state given as like): left.
        extra = [name for name in like if name not in names and (items is None or name not in record.files)]
        problems = [f"it has no entry for {missing}"] if missing else []
        problems += [f"it has entries for {extra}, which are not restored"] if extra else []
        if problems:
            works = ", ".join(f"{name!r}: ..." for name in names)
            raise CheckpointError(
                f"like does not match the items restored from step {step} ({names}): {'; '.join(problems)}. Give "
                f"like one entry per item restored, like={{{works}}} (None rebuilds an item from its file)"
                + (", or name the items to restore with items=[...]" if items is None else ""),
                file=self.url(step),
            )
        return names


def _described_policy(recorded: dict[str, Any]) -> str:
    """The keep rules a step's record holds, in words (as recorded, where no KeepPolicy takes them)."""
    known = {field.name for field in dataclasses.fields(KeepPolicy)}
    try:
        return str(KeepPolicy(**{name: value for name, value in recorded.items() if name in known}))
    except (TypeError, ValueError):
        return str(recorded)
