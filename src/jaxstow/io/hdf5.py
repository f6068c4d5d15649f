"""``HDF5Collector``: the samples of every chain in an HDF5 file, written by a background thread.

The file holds one dataset per leaf of the sample at ``/chain~{id}/<keys>`` (the keys of
:func:`~jaxstow.io.pytree_to_dict` joined by ``/``), of shape ``(samples, *leaf)`` and the leaf's dtype (one of
``ml_dtypes``, which HDF5 lacks, as :mod:`~jaxstow.io.hdf5_dtypes` says). Datasets are chunked and resizable: they
grow as blocks arrive and are trimmed to the samples kept when the run ends, when ``/chain~{id}`` also gets the
attribute ``sample_count``. The dataset ``/draws_done`` holds, per chain, how many samples are written so far: each
block is flushed to the file before it counts it, so a reader in SWMR mode sees the samples up to that count, never a
torn block.

>>> import os, tempfile, h5py, jax, jax.numpy as jnp
>>> from jaxstow import io
>>> file = h5py.File(os.path.join(tempfile.mkdtemp(), "samples.h5"), "w", libver="latest")
>>> init_save, save, postprocess_save = io.save(io.HDF5Collector(file))
>>> state = init_save({"w": jnp.zeros(3), "loss": 0.0}, None, io.scheduler.static_information(samples_collected=100))
>>> step = lambda state, i: save(state, i % 2 == 1, {"w": jnp.full(3, i, jnp.float32), "loss": i / 10})
>>> state, _ = jax.lax.scan(step, state, jnp.arange(8))
>>> file.swmr_mode, postprocess_save(state, None)["sample_count"]   # another process may read the file
(True, Array(4, dtype=int32, weak_type=True))
>>> file["/chain~0/w"].shape, file["/chain~0/loss"][:], file["/chain~0"].attrs["sample_count"]
((4, 3), array([0.1, 0.3, 0.5, 0.7], dtype=float32), np.int64(4))
>>> file.close()
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxstow._storage.failures import storage_failures
from jaxstow._util.arguments import checked_arguments, optional_path
from jaxstow._util.optional import require
from jaxstow.errors import ArgumentError
from jaxstow.io import host_buffers
from jaxstow.io.chains import (
    ChainBook,
    KeepsChains,
    SampleLayout,
    read_checkpoints,
    remove_checkpoint,
    restore_checkpoint,
    write_checkpoints,
)
from jaxstow.io.collector import ChainCheckpoint, DataCollector
from jaxstow.io.hdf5_closed import closed_file, named_if_closed
from jaxstow.io.hdf5_groups import claim, give_up
from jaxstow.io.hdf5_layout import (
    DRAWS_DONE,
    checked_compression,
    checkpoint_path,
    dataset_name,
    group_name,
    layout_problems,
    new_draws_done,
    read_whole,
    readable,
    run_id_of,
    write_block,
    write_hyperslab,
)
from jaxstow.io.hdf5_queued import checkpoints_of, queued, rows_of
from jaxstow.io.hdf5_read_back import read_back
from jaxstow.io.hdf5_resume import fresh_datasets, mark_checkpointed, reopened
from jaxstow.io.hdf5_writable import given_file
from jaxstow.io.hdf5_writers import opened_again, opened_first
from jaxstow.io.job_queue import JobQueue
from jaxstow.io.scheduler import static_information as StaticInformation
from jaxstow.io.stopped_runs import StoppedRun, resumed_before_init
from jaxstow.io.swmr import (
    DISK_DRIVERS,
    WriterLock,
    hold_metadata_in_memory,
    writes_live,
)

__all__ = ["DRAWS_DONE", "HDF5Collector", "checkpoint_path", "layout_problems"]

_DESCRIPTOR_DRIVERS = ("sec2", "direct")  # whose file handle is a file descriptor, to fsync


class HDF5Collector(KeepsChains, DataCollector):
    """Save to hdf5 format, as jax_sgmc's ``io.HDF5Collector`` does.

    Samples of every chain go to an HDF5 file, viewable with any HDF5 viewer, written on a background thread; the
    checkpoints of all chains go to one jaxstow file beside it, replaced atomically, so that the chains of a ``vmap``
    resume from the same step. Given a path, the same code run again after a kill continues from the checkpoint, or
    starts over; any process may read the file while the run goes on, and the collector's next run goes on in it with
    chains of its own (``/chain~1``, ...). See docs/sampling.md.

    >>> import os, tempfile, jax.numpy as jnp
    >>> from jaxstow import io
    >>> path = os.path.join(tempfile.mkdtemp(), "samples.h5")
    >>> def run(steps):                                  # the same code, run again, continues
    ...     collector = io.HDF5Collector(path)
    ...     init_save, save, postprocess_save = io.save(collector, checkpoint_every=4)
    ...     state = init_save({"w": jnp.zeros(2)}, 0.0, io.scheduler.static_information(samples_collected=10))
    ...     for step in range(int(state.step), steps):
    ...         state, _ = save(state, True, {"w": jnp.full(2, step, jnp.float32)}, solver_state=float(step))
    ...     return collector, state, postprocess_save
    >>> collector, state, postprocess_save = run(6)      # stops after 6 steps, as a crash would: checkpointed at 4
    >>> collector.close()                                # (a killed process needs no close)
    >>> collector, state, postprocess_save = run(10)
    >>> postprocess_save(state, None)["samples"]["w"][:, 0]
    array([0., 1., 2., 3., 4., 5., 6., 7., 8., 9.], dtype=float32)
    >>> sorted(os.listdir(os.path.dirname(path)))        # no checkpoint, no lock: the run is finished
    ['samples.h5']
    """

    copies_blocks = True
    _stores_key_data = True

    @functools.partial(checked_arguments, name="HDF5Collector")
    def __init__(
        self,
        file: Any,
        *,
        compression: str | None = None,
        checkpoint_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        """Take the file to write the samples to.

        Args:
            file: A path, which the collector opens itself in SWMR mode, holding its
                :class:`~jaxstow.io.swmr.WriterLock` (and continues from the checkpoint beside it, if any); or an open
                ``h5py.File``, jax_sgmc's form (mode ``"w"`` starts over, ``"a"`` continues), put in SWMR mode at
                once if opened with ``libver="latest"``, else saved with a :class:`~jaxstow.io.LiveReadWarning`.
            compression: Passed to ``h5py`` (``"gzip"``, ``"lzf"``, ...). HDF5 may then move a chunk rewritten
                after a checkpoint, so resuming after a crash is not guaranteed.
            checkpoint_dir: Where ``<file name>.checkpoint.jxs`` goes (by default the file's folder).

        Raises:
            IsAFolderError: ``file`` is a folder.
            ArgumentError: ``file`` is neither a path nor an ``h5py.File``.
            FormatError: The file links a chain's samples to another file (:mod:`~jaxstow.io.hdf5_links`).
            CheckpointError: Another process writes the file.
            StructureMismatchError: The file or its checkpoint holds other samples or another solver state (raised
                by :meth:`register_chain`).
            CollectorError: An ``h5py.File`` given was closed before a later run (raised by :meth:`register_chain`).
        """
        checked_compression(require("h5py", extra="h5py", purpose="HDF5Collector"), compression)
        self._lock: WriterLock | None = None  # held while the collector writes a file it opened itself
        self._senders: list[Callable[[], None]] = []  # each waits for the blocks an io.save has on their way here
        self._writer = JobQueue(f"jaxstow-hdf5-{os.path.basename(str(getattr(file, 'filename', file)))}")
        self._checkpoint_dir = optional_path(checkpoint_dir, what="HDF5Collector's checkpoint_dir")
        if isinstance(file, str | os.PathLike):
            file, self._lock = opened_first(file, self._checkpoint_dir, self, self._writer, self._senders)
        else:
            file = given_file(file)
        if self._checkpoint_dir is None and file.driver in DISK_DRIVERS:
            self._checkpoint_dir = os.path.dirname(os.path.abspath(file.filename))
        self._file = file
        self._filename: str = file.filename
        own, path = self._lock is not None, self.checkpoint_path  # a failed write says how to resume: from there
        self._queued = functools.partial(queued, filename=self._filename, checkpoint=path, own_file=own)
        self._compression = compression
        self._chains = ChainBook()
        self._datasets: dict[int, list[Any]] = {}  # per chain whose run goes on
        self._stored: dict[int, dict[str, Any]] | None = None  # the checkpoint records on disk, read once
        self._stopped = StoppedRun()  # the chains of a stopped run that the run registered now continues
        self._latest: dict[int, ChainCheckpoint] = {}  # each chain's latest checkpoint, all rewritten together
        self._marked: set[int] = set()  # the chains whose groups say that they were checkpointed
        self._published: list[int] = []  # per chain: the samples /draws_done counts
        self._counts: Any = None  # the dataset /draws_done, once looked up in the file
        self._run_id: str | None = None  # the file's RUN_ID then: its samples are read back from that file only
        self._finalized: set[int] = set()
        self._closing = threading.Lock()  # a run's end closes the file while another thread's run reads its samples
        self._live = writes_live(file, stacklevel=3)  # a warning points at the code that made the collector
        # A crash leaves the file as it was at the last checkpoint (or block published, in SWMR mode): the file is
        # flushed before each checkpoint is committed, its HDF5 metadata is held in memory between flushes, and it is
        # flushed now and after each chain is registered, so that a process killed before its first checkpoint
        # leaves a file that opens.
        with self._failures():
            hold_metadata_in_memory(file)
            self._settle()

    @property
    def checkpoint_path(self) -> str | None:
        """Where the checkpoints of the chains go (``None`` for a file that is not on disk, without a folder)."""
        if self._checkpoint_dir is None:
            return None
        return checkpoint_path(self._filename, self._checkpoint_dir)  # no HDF5 call: read on the callback thread

    def register_chain(
        self, init_sample: Any = None, init_checkpoint: Any = None, static_information: StaticInformation | None = None
    ) -> int:
        """Create the chain's datasets, or reopen them to continue from the chain's checkpoint."""
        layout = SampleLayout.of(init_sample)
        if not self._file:  # closed when the last run ended
            if self._lock is None:
                raise closed_file(self._filename, "after its last run, so this run cannot go on in it", "for every run")
            self._open_again()  # this run goes on in the file
        chain_id = self._chains.next_id
        claim(self._file, group_name(chain_id), self)
        path = self.checkpoint_path
        if self._stored is None:
            run = run_id_of(self._file, self._filename)  # another run's checkpoints are refused
            self._stored = {} if path is None else read_checkpoints(path, run, samples=self._filename)
            if self._stored and path is not None and DRAWS_DONE not in self._file:
                remove_checkpoint(path)  # the file was emptied (mode "w"): the samples it counted are gone
                self._stored = {}
        record = self._stored.get(chain_id)
        resumed = None
        if record is not None and path is not None:
            resumed = restore_checkpoint(record, init_checkpoint, chain_id=chain_id, file=path)
        advice = f"delete it and {self._filename}" if self._lock else "open the file with mode 'w'"
        self._stopped = StoppedRun(self._stored, path or "", f"{advice} to start over, or use another file")
        with self._failures():
            if resumed is None:
                capacity = static_information.samples_collected if static_information is not None else None
                self._datasets[chain_id] = fresh_datasets(
                    self._file,
                    chain_id,
                    layout,
                    capacity or 0,
                    self._stopped,
                    own_file=self._lock is not None,
                    compression=self._compression,
                )
            else:
                self._datasets[chain_id] = reopened(self._file, chain_id, layout, resumed.sample_count, path)
                self._latest[chain_id] = resumed
            self._published.append(0 if resumed is None else resumed.sample_count)
            self._count_draws()
            self._settle()
        return self._chains.add(layout, resumed)

    def _open_again(self) -> None:
        """Open the file the collector closed at the end of its last run again, to add the chains of another run."""
        assert self._lock is not None
        self._file, self._lock = opened_again(self._lock.path, self, self._writer, self._senders)
        with self._failures():
            hold_metadata_in_memory(self._file)
            self._settle()

    def _failures(self) -> contextlib.AbstractContextManager[None]:
        """h5py's errors of a failed system call (a full disk, an I/O error) as a StorageError naming the file."""
        if self._caller_closed():
            raise closed_file(self._filename, "while its run went on", "until postprocess_save returns")
        return named_if_closed(self._caller_closed, self._filename, storage_failures(self._filename, hdf5=True))

    def _caller_closed(self) -> bool:
        return not self._file and self._lock is None  # the caller's file, closed by its owner

    def _settle(self) -> None:
        """Put the file on disk as it is now: flushed, and in SWMR mode from the first time it can be."""
        if self._live and not self._file.swmr_mode:
            self._file.swmr_mode = True  # flushes the file; from now on other processes may read it
        else:
            self._file.flush()

    def _count_draws(self) -> None:
        """Set ``/draws_done`` to the samples published of every chain (creating or growing the dataset)."""
        counts = self._counts
        if counts is None or not counts.id.valid:  # not looked up yet in the file as it is open now
            counts = self._file.get(DRAWS_DONE)
            if counts is None:  # a file started anew (deleted since the last run): it holds this run's chains only
                counts = new_draws_done(self._file)
                self._published = [done if chain in self._datasets else 0 for chain, done in enumerate(self._published)]
            self._counts, self._run_id = counts, run_id_of(self._file, self._filename)
        if len(counts) < len(self._published):
            counts.resize(len(self._published), axis=0)
        write_hyperslab(counts, 0, np.asarray(self._published, np.int64))  # after each block: h5py's slicing costs more

    def _kept_rows(self, chain_id: int, first: int, count: int) -> list[np.ndarray]:
        """The chain's rows from ``first`` that another run of one saving state is about to write over, once written."""
        self._writer.wait(again=False)
        return [dataset[first : first + count] for dataset in self._datasets.get(chain_id, [])]

    def save(self, chain_id: int, first: int, values: Sequence[np.ndarray]) -> None:
        """Queue a block of samples for writing."""
        self.save_chains({chain_id: (first, values)})

    def save_chains(self, blocks: Mapping[int, tuple[int, Sequence[np.ndarray]]]) -> None:
        """Queue copies of blocks of several chains, written together and then counted in ``/draws_done`` at once; the
        copies go to memory that earlier blocks gave back once written (:mod:`~jaxstow.io.host_buffers`)."""
        self.refuse_missing_chains()
        ends = {
            chain_id: self._chains.received(chain_id, first, values) for chain_id, (first, values) in blocks.items()
        }
        copies = {
            chain_id: (first, [host_buffers.copy(value) for value in values])
            for chain_id, (first, values) in blocks.items()
        }
        self._writer.submit(self._queued(rows_of(copies, self._filename), functools.partial(self._write, copies, ends)))

    def _write(self, blocks: Mapping[int, tuple[int, Sequence[np.ndarray]]], ends: dict[int, int]) -> None:
        """Write each chain's rows; in SWMR mode, where readers may come at any time, publish them at once."""
        with self._failures():
            for chain_id, (first, values) in blocks.items():
                write_block(self._datasets[chain_id], first, ends[chain_id], values)
            for chain_id, end in ends.items():
                self._published[chain_id] = max(self._published[chain_id], end)
            if self._file.swmr_mode:
                self._publish()

    def _publish(self) -> None:
        """Flush the rows written so far to the file, then count them in ``/draws_done`` and flush that.

        ``/draws_done`` is written only here, and at a chain's registration, when every row it counts is in the file:
        HDF5 may write a dataset's values to the file before it is flushed, so a count written earlier could reach
        the file before the rows it counts, and a crash in between would leave it counting rows the file lacks.
        """
        self._file.flush()
        self._count_draws()
        self._file.flush()

    def checkpoint(self, chain_id: int, checkpoint: ChainCheckpoint) -> None:
        """Queue the chain's checkpoint (see :meth:`checkpoint_chains`)."""
        self.checkpoint_chains({chain_id: checkpoint})

    def checkpoint_problem(self) -> str | None:
        """For a file not on disk without a ``checkpoint_dir``, that checkpoints cannot go next to it."""
        if self.checkpoint_path is not None or type(self).checkpoint_chains is not HDF5Collector.checkpoint_chains:
            return None
        return (
            f"the HDF5 file {self._file.filename} is not on disk, so checkpoints cannot go next to it: give "
            "HDF5Collector a checkpoint_dir"
        )

    def checkpoint_chains(self, checkpoints: Mapping[int, ChainCheckpoint]) -> None:
        """Queue the checkpoints: after the blocks before them are written and flushed to disk, commit them, with the
        latest checkpoint of every other chain, atomically in one file."""
        path = self.checkpoint_path
        if path is None:
            raise ArgumentError(self.checkpoint_problem() or "")
        self.refuse_missing_chains()
        records = {chain_id: self._chains.with_loader_state(chain_id, cp) for chain_id, cp in checkpoints.items()}
        commit = functools.partial(self._commit, path, records, self._waiting())
        self._writer.submit(self._queued(checkpoints_of(records, path, self._filename), commit))

    def _waiting(self) -> dict[int, dict[str, Any]]:
        """The checkpoint records of the stopped run's chains that this collector has not registered yet: a run of
        one chain continues them one per call, and keeps theirs as they are for the calls to come."""
        return {
            chain_id: record for chain_id, record in (self._stored or {}).items() if chain_id >= self._chains.next_id
        }

    def _commit(self, path: str, records: dict[int, ChainCheckpoint], waiting: dict[int, dict[str, Any]]) -> None:
        with self._failures():
            self._publish()
            if self._file.driver in _DESCRIPTOR_DRIVERS:
                os.fsync(self._file.id.get_vfd_handle())
        with storage_failures(os.path.dirname(path), doing="make the folder"):
            os.makedirs(os.path.dirname(path), exist_ok=True)
        self._latest.update(records)
        write_checkpoints(path, self._latest, waiting, self._run_id)
        if unmarked := [chain_id for chain_id in records if chain_id not in self._marked]:
            with self._failures():
                mark_checkpointed(self._file, unmarked)  # once the checkpoint is there: a kill before, no mark
            self._marked.update(unmarked)

    def finalize(self, chain_id: int) -> None:
        """Finalize one chain (see :meth:`finalize_chains`)."""
        self.finalize_chains([chain_id])

    def finalize_chains(self, chain_ids: Sequence[int]) -> None:
        """Wait for the writes, trim each chain's datasets to the samples kept, record its ``sample_count``, flush once.

        The checkpoints are removed once every registered chain is finalized: a run killed in between resumes.
        """
        self.refuse_missing_chains()
        self._writer.wait()
        with self._failures():
            for chain_id in chain_ids:
                end = self._chains.ends[chain_id]
                for dataset in self._datasets[chain_id]:
                    dataset.resize(end, axis=0)
                self._published[chain_id] = end
            self._publish()
            for chain_id in chain_ids:
                self._file[group_name(chain_id)].attrs["sample_count"] = self._chains.ends[chain_id]
            self._file.flush()
        self._finalized.update(chain_ids)
        path = self.checkpoint_path
        if self._finalized >= set(self._datasets):
            if path is not None:
                self._stored = self._waiting()
                if self._stored:  # the finished chains' records go: a chain is never continued twice
                    write_checkpoints(path, {}, self._stored, self._run_id)
                else:
                    remove_checkpoint(path)
                self._latest.clear()
            self.close()

    def close(self) -> None:
        """Wait for the writes; close a file the collector opened itself, and release its lock (idempotent).

        :meth:`finalize` calls it once every chain is finalized; a chain not finalized keeps its checkpoint.
        """
        try:
            for wait in self._senders:
                wait()
            self._writer.wait(again=False)  # a failure raised before, the run's or an earlier close()'s, is known
        finally:
            if self._lock is not None:
                with self._closing:
                    if self._file:
                        with self._failures():
                            self._file.close()
                self._lock.release()

    def register_sender(self, wait: Callable[[], None]) -> None:
        """Have :meth:`close` first call ``wait``, which returns once a sender's blocks in flight have arrived."""
        self._senders.append(wait)

    def finished(self, chain_id: int) -> Any:
        """The chain's samples (see :meth:`finished_chains`)."""
        return self.finished_chains([chain_id])[0]

    def finished_chains(self, chain_ids: Sequence[int]) -> list[Any]:
        """Each chain's samples as the sample is structured: datasets of a file given open, or NumPy arrays read (into
        memory that the arrays of earlier runs gave back, see :mod:`~jaxstow.io.host_buffers`), the file opened once."""
        layouts = [self._chains.layout(chain_id) for chain_id in chain_ids]
        if self._lock is None:
            return [
                layout.treedef.unflatten([readable(dataset) for dataset in self._datasets[chain_id]])
                for chain_id, layout in zip(chain_ids, layouts, strict=True)
            ]
        with (
            self._closing,
            contextlib.nullcontext(self._file)
            if self._file
            else read_back(self._lock.path, self._run_id, chain_ids) as file,
        ):
            return [
                layout.treedef.unflatten([read_whole(file[dataset_name(chain_id, name)]) for name in layout.names])
                for chain_id, layout in zip(chain_ids, layouts, strict=True)
            ]

    def release(self, chain_id: int) -> None:
        """Forget the chain, whose run is over: its samples are in the file."""
        give_up(self._filename, group_name(chain_id), self)
        self._datasets.pop(chain_id, None)
        self._finalized.discard(chain_id)
        self._latest.pop(chain_id, None)
        self._chains.drop(chain_id)

    def resume(self) -> Mapping[int, ChainCheckpoint]:
        """Restore the data loader's state; the checkpoints the registered chains continue from."""
        waiting = not self._datasets and self._file and DRAWS_DONE in self._file  # no chain registered: a stopped run?
        if waiting and os.path.exists(path := self.checkpoint_path or ""):
            raise resumed_before_init(path)
        return self._chains.resume()
