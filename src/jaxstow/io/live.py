"""The samples an :class:`~jaxstow.io.HDF5Collector`'s file holds, read while its run may still go on.

A finished chain has the attribute ``sample_count``; a running one counts its written samples in ``/draws_done``,
updated only after the rows reach the file. Reading that count first, then the rows up to it, never shows a torn
block; a killed writer's file is read the same way.

>>> import os, tempfile, h5py, jax, jax.numpy as jnp
>>> from jaxstow import io
>>> from jaxstow.io.live import read_draws, run_finished
>>> path = os.path.join(tempfile.mkdtemp(), "samples.h5")
>>> file = h5py.File(path, "w", libver="latest")
>>> init_save, save, postprocess_save = io.save(io.HDF5Collector(file), block_size=2)
>>> state = init_save({"w": jnp.zeros(2)}, None, io.scheduler.static_information(samples_collected=5))
>>> for step in range(5):
...     state, _ = save(state, True, {"w": jnp.full(2, step, jnp.float32)})
>>> draws = read_draws(path)     # what another process sees while the run goes on (blocks of 2 are being written)
>>> draws.finished, draws.done[0] in (0, 2, 4)
(False, True)
>>> result = postprocess_save(state, None)
>>> draws = read_draws(path)
>>> draws.finished, draws.done, draws.chains[0]["w"][:, 0]
(True, [5], array([0., 1., 2., 3., 4.], dtype=float32))
>>> run_finished(path)                         # the same answer, without reading a sample
True
>>> file.close()
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import time
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from jaxstow._util.optional import require
from jaxstow.errors import FormatError, JaxstowError
from jaxstow.io import host_buffers
from jaxstow.io.hdf5_counts import checked_count, draws_done, refuse_unstored, rows_of
from jaxstow.io.hdf5_dtypes import as_sample, sample_dtype
from jaxstow.io.hdf5_layout import DRAWS_DONE, run_id_of, variable_names
from jaxstow.io.hdf5_links import refuse_stored_elsewhere
from jaxstow.io.swmr import SWMR_SUPERBLOCK, open_for_reading, read_superblock

__all__ = ["FileDraws", "read_draws", "read_stacked", "run_finished"]

#: The highest chain id a file may hold (chains are numbered from 0, one after another).
_MOST_CHAINS = 2**31
_CHAIN_GROUP = re.compile(r"chain~([0-9]+)")  # ASCII digits: "chain~٣" is no chain 3
#: What h5py raises for a structure it fails on.
_STRUCTURE_FAILURES = (RuntimeError, OSError, KeyError, ValueError)
#: How often a file whose writer changed it under the reader is opened again before the read is given up.
_READ_ATTEMPTS = 5
_Read = TypeVar("_Read")


@dataclasses.dataclass(frozen=True)
class FileDraws:
    """Per chain (in the order of their ids): its variables (dict keys joined by ``.``) with the samples written so
    far, and their number; ``finished`` once every chain's run has ended; per chain its id, ``N`` of ``/chain~N`` (a
    file deleted between the runs of one collector holds the later runs' chains only, ``/chain~1``, ...), and whether
    its run ended (``ended``: a run stopped by a failure, or going on, leaves its chains unended)."""

    chains: list[dict[str, np.ndarray]]
    done: list[int]
    finished: bool
    ids: list[int]
    ended: list[bool]


def read_draws(source: Any) -> FileDraws:
    """The samples in an HDF5Collector's file: a path (opened in SWMR mode where it can be) or an open ``h5py.File``."""
    if isinstance(source, str | os.PathLike):
        return _read_consistently(source, _read)
    name = str(getattr(source, "filename", source))
    refuse_stored_elsewhere(source, name)  # as open_for_reading does of a path
    return _read(source, name)


def run_finished(path: str | os.PathLike[str]) -> bool:
    """Whether every chain of the file at ``path`` has finished its run, as ``read_draws(path).finished`` says, but
    without reading a sample (the module's example shows both)."""
    return _read_consistently(path, lambda file, name: all(_locate(file, name=name)[2]))


def read_stacked(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Every chain's samples in the file at ``path``, one array per variable shaped ``(chains, samples, ...)``.

    The rows are read straight into that array, with no array per chain in between; every chain must hold the same
    number of samples (:func:`read_draws` reads chains of any lengths).

    >>> import os, tempfile, h5py, jax.numpy as jnp
    >>> from jaxstow import io
    >>> from jaxstow.io.live import read_stacked
    >>> path = os.path.join(tempfile.mkdtemp(), "samples.h5")
    >>> with h5py.File(path, "w", libver="latest") as file:
    ...     init_save, save, postprocess_save = io.save(io.HDF5Collector(file))
    ...     states = [init_save({"w": jnp.zeros(2)}) for _ in range(3)]
    ...     for step in range(4):
    ...         states = [save(state, True, {"w": jnp.full(2, step + 10 * chain, jnp.float32)})[0]
    ...                   for chain, state in enumerate(states)]
    ...     results = [postprocess_save(state, None) for state in states]
    >>> read_stacked(path)["w"][:, :, 0]
    array([[ 0.,  1.,  2.,  3.],
           [10., 11., 12., 13.],
           [20., 21., 22., 23.]], dtype=float32)
    """
    return _read_consistently(path, _stack)


def _stack(file: Any, name: str) -> dict[str, np.ndarray]:
    chains, done, _, _ = _locate(file, name=name)
    if len(set(done)) > 1:
        raise FormatError(f"the chains hold different numbers of samples ({done}); read_draws reads them", file=name)
    stacked = {}
    for key, first in chains[0].items():
        array = host_buffers.empty((len(chains), done[0], *first.shape[1:]), first.dtype)  # reused, backed
        for index, datasets in enumerate(chains):
            dtype = sample_dtype(datasets[key]) if key in datasets else None  # checked, as in as_sample
            if dtype is None or datasets[key].shape[1:] != first.shape[1:] or dtype != sample_dtype(first):
                other = f"{dtype}{list(datasets[key].shape[1:])}" if key in datasets else "none"
                raise FormatError(
                    f"chain {index}'s draws of {key!r} are {other}, chain 0's {first.dtype}{list(first.shape[1:])}: "
                    "they cannot be stacked; read_draws reads each chain",
                    file=name,
                )
            if array.size:
                datasets[key].read_direct(array, np.s_[: done[0]], np.s_[index])
        stacked[key] = as_sample(first, array)
    return stacked


def _read_consistently(path: str | os.PathLike[str], read: Callable[[Any, str], _Read]) -> _Read:
    """``read(file, name)`` on the file at ``path`` opened for reading, read again when the file changed under it.

    A writer may change the file under a reader in ways SWMR mode does not cover (a run that starts over empties it;
    a killed writer's successor extends it): HDF5 then fails on structures it sees half old, half new, or, where
    the file was emptied in place and written again, reads the new run's bytes as the old run's rows. So a read
    counts only if the file's run (its :data:`~jaxstow.io.hdf5_layout.RUN_ID`) is the same when it is opened again after
    it. What reads whole on a later opening is the file as it is then; a file that never does is damaged, and says so.
    """
    name = os.fspath(path)
    failure: Exception | None = None
    unwritten = 0  # failures in a row with no writer having the file open
    for attempt in range(_READ_ATTEMPTS):
        if attempt:
            time.sleep(0.01 * 2**attempt)
        try:
            return _read_once(name, read)
        except _Torn as torn:
            failure = torn.failure
        unwritten = 0 if _written(name) else unwritten + 1
        if unwritten == 2:  # opened again as it is now, with no writer to wait for: no later opening differs
            raise FormatError(
                f"cannot be read ({failure}), and no writer has it open: the file is damaged", file=name
            ) from failure
    raise FormatError(
        f"could not be read in {_READ_ATTEMPTS} attempts ({failure}); if a writer was starting over meanwhile, read "
        "it again, else the file is damaged",
        file=name,
    ) from failure


class _Torn(Exception):
    """A read of a file that failed, or changed under it: ``failure`` says how."""

    def __init__(self, failure: Exception) -> None:
        super().__init__(str(failure))
        self.failure = failure


def _read_once(name: str, read: Callable[[Any, str], _Read]) -> _Read:
    """``read(file, name)`` on the file opened for reading, if its run is the same when it is opened again after."""
    try:
        opened = open_for_reading(name)
    except JaxstowError:
        raise
    except OSError as error:  # HDF5's own, on a file half written (or emptied) under the reader
        raise _Torn(error) from error
    with opened as file:
        try:
            run = run_id_of(file, name)
            result = read(file, name)
        except JaxstowError:
            raise
        except _STRUCTURE_FAILURES as error:
            raise _Torn(error) from error
    try:
        with open_for_reading(name) as file:
            now = run_id_of(file, name)
    except (JaxstowError, *_STRUCTURE_FAILURES) as error:  # caught in the middle of starting over
        raise _Torn(error) from error
    if now != run:
        raise _Torn(
            RuntimeError(f"another run started the file over while it was read (run {run} before, {now} after)")
        )
    return result


def _written(name: str) -> bool:
    """Whether a writer may have the file open: its superblock's flags say so, or they cannot be read, or the file has
    none (a superblock older than version 3, as files made without ``libver="latest"`` have)."""
    try:
        superblock = read_superblock(name)
    except (JaxstowError, OSError):
        return True
    return superblock.version < SWMR_SUPERBLOCK or superblock.writer is not None


def _read(file: Any, name: str) -> FileDraws:
    chains, done, ended, ids = _locate(file, name=name)
    samples = [
        {key: as_sample(dataset, dataset[:count]) for key, dataset in datasets.items()}
        for datasets, count in zip(chains, done, strict=True)
    ]
    return FileDraws(samples, done, all(ended), ids, ended)


def _locate(file: Any, *, name: str) -> tuple[list[dict[str, Any]], list[int], list[bool], list[int]]:
    """Per chain (in the order of their ids) its datasets by variable, its count of samples written and whether its
    run has ended; the chains' ids. In a file another process is writing, the counts are read before the rows
    they count."""
    h5py = require("h5py", extra="h5py", purpose=f"reading the samples of {name}")
    following = file.mode == "r" and file.swmr_mode  # a reader of a live file: see what the writer added since
    by_id: dict[int, Any] = {}
    for key in file:  # file[key], not file.items(): an object HDF5 fails to open raises, rather than being passed over
        if (match := _CHAIN_GROUP.fullmatch(key)) and isinstance(item := file[key], h5py.Group | h5py.Dataset):
            chain = int(match.group(1))
            if chain > _MOST_CHAINS or (other := by_id.setdefault(chain, item)) is not item:
                also = f"chain {chain}, past any collector's" if chain > _MOST_CHAINS else f"{other.name} and /{key}"
                raise FormatError(f"names {also}: the file was changed by hand, or damaged", file=name, path=f"/{key}")
    items = sorted(by_id.items())
    if not items:
        if following:  # a file an HDF5Collector is writing, whose run has not called init_save yet
            raise FormatError(
                "holds no chain yet: the run writing it has not started (init_save); read it later", file=name
            )
        raise FormatError("holds no /chain~{id} group: it was not written by an HDF5Collector", file=name)
    stored = {chain: item.attrs.get("sample_count") for chain, item in items}  # a finished chain's count
    running = [chain for chain, count in stored.items() if count is None]
    counts = file.get(DRAWS_DONE)
    if counts is not None:  # first the counts, then the rows they count
        counts = draws_done(counts, running, name=name, refresh=following)
    chains, done = [], []
    for chain, item in items:
        count = stored[chain]
        if count is None:
            if counts is None:
                raise FormatError(
                    f"chain {chain} has no sample_count: its run did not finish (postprocess_save was not called), "
                    "and the file does not count the samples written so far",
                    file=name,
                    path=item.name,
                )
            count = counts.get(chain, 0)  # none counted: registered a moment ago
        datasets = {"": item} if isinstance(item, h5py.Dataset) else {}
        if isinstance(item, h5py.Group):
            item.visititems(functools.partial(_collect, datasets, h5py.Dataset))
        if following:
            for dataset in datasets.values():
                dataset.refresh()
        rows = [rows_of(dataset, name=name) for dataset in datasets.values()]
        done.append(checked_count(count, rows, name=name, path=item.name, finished=stored[chain] is not None))
        for dataset in datasets.values():
            refuse_unstored(dataset, done[-1], name=name)
        chains.append(dict(zip(variable_names(list(datasets)), datasets.values(), strict=True)))
    return chains, done, [stored[chain] is not None for chain, _ in items], [chain for chain, _ in items]


def _collect(datasets: dict[str, Any], kind: type, key: str, node: Any) -> None:
    if isinstance(node, kind):
        datasets[key] = node
