"""``MemoryCollector``: the samples of every chain in numpy arrays in RAM.

>>> import jax, jax.numpy as jnp
>>> from jaxstow import io
>>> init_save, save, postprocess_save = io.save(io.MemoryCollector())
>>> state = init_save({"x": jnp.zeros(2)}, None, io.scheduler.static_information(samples_collected=None))
>>> def step(state, i):
...     return save(state, i % 3 == 0, {"x": jnp.full(2, i, jnp.float32)})
>>> state, _ = jax.lax.scan(step, state, jnp.arange(7))
>>> postprocess_save(state, None)["samples"]["x"][:, 0]
array([0., 3., 6.], dtype=float32)
"""

from __future__ import annotations

import functools
import os
import re
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxstow._format.native_or_npz import write_container
from jaxstow._format.npz import check_member_name, stores_exactly
from jaxstow._save_load import save
from jaxstow._storage.folders import make_folder
from jaxstow._storage.sinks import atomic_sink
from jaxstow._util.arguments import checked_arguments, optional_path
from jaxstow.errors import ArgumentError, CollectorError, FormatError, NotAFolderError, StructureMismatchError
from jaxstow.io import host_buffers
from jaxstow.io.chain_commits import commit_chains, settle
from jaxstow.io.chains import (
    OTHER_RUN,
    ChainBook,
    KeepsChains,
    SampleLayout,
    read_checkpoint,
    remove_checkpoint,
    restore_checkpoint,
    write_checkpoint,
)
from jaxstow.io.collector import ChainCheckpoint, DataCollector
from jaxstow.io.scheduler import static_information as StaticInformation
from jaxstow.io.stopped_runs import StoppedRun, resumed_before_init
from jaxstow.io.swmr import WriterLock

__all__ = ["MemoryCollector"]

_CHECKPOINT = ".checkpoint.jxs"
#: A chain's checkpoint, or a file its commit writes first (``.next``), in ``save_dir``.
_CHECKPOINT_FILE = re.compile(rf"chain_(\d+){re.escape(_CHECKPOINT)}")
_locks: dict[str, tuple[WriterLock, weakref.ref[MemoryCollector]]] = {}  # a folder's writer lock and its collector


class MemoryCollector(KeepsChains, DataCollector):
    """Stores samples entirely in RAM (numpy arrays).

    The RAM is usually larger than the device memory and thus allows to store a greater number of samples. Storage
    is allocated once for ``samples_collected`` samples per chain and doubles when more arrive (from none when the
    number is ``None``); :meth:`finished` returns exactly the samples kept. The storage comes from buffers that
    earlier runs' arrays gave back once nothing held them (see :mod:`jaxstow.io.host_buffers`), whose pages are
    already backed: copying the blocks in costs no page faults after the first run. When a run ends, its samples are
    handed to the caller and the collector keeps none of them (:meth:`release`): a collector (and its ``io.save``
    functions) used for any number of runs holds only the run going on.

    With ``save_dir``, :meth:`finalize` also writes one ``chain_{id}.npz`` per chain whose keys are the sample's
    dict keys joined by ``/``, and checkpoints are written there as ``chain_{id}.checkpoint.jxs``, those of a step's
    chains committed together (a crash leaves every chain at one step). A later run resumes from the checkpoints, and
    refuses to replace the samples of a finished run (another process's chain 0 is this one's chain 0). A checkpoint
    holds the samples kept so far, so its cost grows with them; for long checkpointed runs prefer the
    :class:`~jaxstow.io.HDF5Collector`.
    """

    copies_blocks = True
    _stores_key_data = True

    @functools.partial(checked_arguments, name="MemoryCollector")
    def __init__(self, save_dir: str | os.PathLike[str] | None = None) -> None:
        self._save_dir = optional_path(save_dir, what="MemoryCollector's save_dir")
        if self._save_dir is not None and os.path.exists(self._save_dir) and not os.path.isdir(self._save_dir):
            raise NotAFolderError("is a file, not a folder for MemoryCollector's save_dir", file=self._save_dir)
        self._chains = ChainBook()
        self._samples: dict[int, list[np.ndarray]] = {}  # the storage of each chain whose run goes on
        self._given: dict[int, list[np.ndarray]] = {}  # what finished() last returned of each such chain
        self._handed: dict[int, tuple[Any, list[weakref.ref[np.ndarray]]]] = {}  # runs over: what the caller holds
        self._lock: str | None = None  # the key in _locks of save_dir's writer lock, while a run goes on
        self._stopped = StoppedRun()  # the chains of a stopped run in save_dir that the run registered now continues

    @property
    def chain_count(self) -> int:
        """The number of chains registered, over every run."""
        return self._chains.next_id

    def chains(self) -> list[int]:
        """The chains whose samples :meth:`finished` gives: those of the run going on, and those of runs over whose
        samples the caller still holds."""
        return sorted([*self._samples, *(chain for chain in self._handed if self._held(chain) is not None)])

    def _path(self, chain_id: int, suffix: str) -> str | None:
        return None if self._save_dir is None else os.path.join(self._save_dir, f"chain_{chain_id}{suffix}")

    def register_chain(
        self, init_sample: Any = None, init_checkpoint: Any = None, static_information: StaticInformation | None = None
    ) -> int:
        """Register a chain; with a checkpoint of it in ``save_dir``, continue from there. The first chain of a run
        takes ``save_dir``'s writer lock: another process's collector of the folder is refused until the run is over,
        as an :class:`~jaxstow.io.HDF5Collector`'s file is (in this process, the newest collector of a folder takes
        the lock over from one whose run failed or was dropped, which then writes nothing there: one run at a time
        writes a folder)."""
        taking = self._save_dir is not None and self._lock is None  # the run's first chain
        if self._save_dir is not None and taking:
            self._lock = key = os.path.realpath(self._save_dir)
            if key not in _locks:
                make_folder(self._save_dir)
                _locks[key] = (WriterLock(self._save_dir, lock_file=os.path.join(key, ".lock")), weakref.ref(self))
            _locks[key] = (_locks[key][0], weakref.ref(self))
        try:
            if self._save_dir is not None and taking:
                advice = "move its chain_*.checkpoint.jxs away to start over, or give MemoryCollector another save_dir"
                self._stopped = StoppedRun(_stopped_chains(self._save_dir), self._save_dir, advice)
            return self._register(init_sample, init_checkpoint, static_information)
        except BaseException:
            if not self._samples:  # no run goes on
                self.close()
            raise

    def close(self) -> None:
        """Release ``save_dir`` for other collectors (idempotent): done once no chain's run goes on, and for a run
        that failed before ``postprocess_save``, whose checkpoints the next run resumes from."""
        key, self._lock = self._lock, None
        if key is not None and key in _locks and _locks[key][1]() is self:
            _locks.pop(key)[0].release()

    def _register(self, init_sample: Any, init_checkpoint: Any, static_information: StaticInformation | None) -> int:
        layout = SampleLayout.of(init_sample)
        if self._save_dir is not None:  # each leaf a member of chain_{id}.npz: refused now, not once the run is over
            for name in layout.names:
                try:
                    check_member_name(name)
                except FormatError as error:
                    raise ArgumentError(
                        f"{error} (save_dir keeps each chain's samples as an npz archive)", path=name
                    ) from None
        capacity = (static_information.samples_collected if static_information is not None else None) or 0
        chain_id = self._chains.next_id
        path = self._path(chain_id, _CHECKPOINT)
        if path is not None:
            settle(chain_id, path)
        stored = None if path is None else read_checkpoint(path)
        finished = self._path(chain_id, ".npz")
        if stored is None and finished is not None and os.path.exists(finished):
            waiting = self._stopped.waiting_after(chain_id)
            raise CollectorError(
                f"{finished} holds the samples of chain {chain_id} of a finished run, which this run would replace"
                + (
                    f", and {waiting}; give MemoryCollector another save_dir to start anew"
                    if waiting
                    else ": move them away, or give MemoryCollector another save_dir"
                )
            )
        if stored is None:
            self._stopped.refuse_new(chain_id)
        if stored is not None and stored[1] is not None and (problems := layout.problems_with(stored[1])):
            raise StructureMismatchError(
                [*(f"the samples of chain {chain_id} {problem}" for problem in problems), OTHER_RUN], file=path
            )
        resumed = None
        if stored is not None and path is not None:
            resumed = restore_checkpoint(stored[0], init_checkpoint, chain_id=chain_id, file=path)
        for gone in [chain for chain in self._handed if self._held(chain) is None]:
            del self._handed[gone]
        try:
            self._samples[chain_id] = [
                host_buffers.empty((capacity, *shape), dtype)
                for shape, dtype in zip(layout.shapes, layout.dtypes, strict=True)
            ]
        except (MemoryError, ValueError):  # numpy's "Unable to allocate" or "Maximum allowed dimension exceeded"
            raise ArgumentError(
                f"samples_collected={capacity} samples of {layout.row_bytes} bytes each are more than this process can "
                "hold: declare the samples each chain keeps, or None to let the storage grow as they come"
            ) from None
        self._chains.add(layout, resumed)
        if stored is not None and stored[1] is not None:
            self.save(chain_id, 0, [stored[1][name] for name in layout.names])
        return chain_id

    def save(self, chain_id: int, first: int, values: Sequence[np.ndarray]) -> None:
        """Copy a block of samples into the chain's arrays, growing them if needed."""
        end = self._chains.received(chain_id, first, values)
        arrays = self._samples[chain_id]
        for leaf, (array, value) in enumerate(zip(arrays, values, strict=True)):
            if end > len(array):
                grown = host_buffers.empty((max(end, 2 * len(array)), *array.shape[1:]), array.dtype)
                grown[: len(array)] = array
                arrays[leaf] = array = grown
            array[first:end] = value

    def _kept_rows(self, chain_id: int, first: int, count: int) -> list[np.ndarray]:
        """The chain's rows from ``first`` that another run of one saving state is about to write over, as views."""
        return [array[first : first + count] for array in self._samples.get(chain_id, [])]

    def _kept(self, chain_id: int, count: int) -> dict[str, np.ndarray]:
        names = self._chains.layout(chain_id).names
        self._chains.refuse_gaps(chain_id, count)
        return {name: array[:count] for name, array in zip(names, self._samples[chain_id], strict=True)}

    def checkpoint(self, chain_id: int, checkpoint: ChainCheckpoint) -> None:
        """Write the checkpoint and the samples it counts to ``save_dir`` atomically."""
        self.checkpoint_chains({chain_id: checkpoint})

    def checkpoint_problem(self) -> str | None:
        """Without ``save_dir``, that the collector has nowhere to keep checkpoints (unless a subclass keeps them)."""
        if self._save_dir is not None or type(self).checkpoint_chains is not MemoryCollector.checkpoint_chains:
            return None
        return "MemoryCollector() has nowhere to keep checkpoints: give it a save_dir"

    def checkpoint_chains(self, checkpoints: Mapping[int, ChainCheckpoint]) -> None:
        """Write the checkpoints of a step's chains and the samples they count to ``save_dir``, a file each,
        committed together (:mod:`jaxstow.io.chain_commits`): a crash leaves every chain at one step."""
        if self._save_dir is None:
            raise ArgumentError(self.checkpoint_problem() or "")
        self.refuse_missing_chains()
        self._refuse_folder_taken_over()
        make_folder(self._save_dir)

        def write(chain_id: int, path: str) -> None:
            checkpoint = checkpoints[chain_id]
            samples = self._kept(chain_id, checkpoint.sample_count)
            write_checkpoint(path, self._chains.with_loader_state(chain_id, checkpoint), samples, chain_id=chain_id)

        commit_chains(
            {chain_id: os.path.join(self._save_dir, f"chain_{chain_id}{_CHECKPOINT}") for chain_id in checkpoints},
            write,
        )

    def _refuse_folder_taken_over(self) -> None:
        """A :class:`CollectorError` if this collector no longer holds ``save_dir``'s writer lock: a collector of the
        folder made later in this process took it over while this run went on, and writes its own chains there."""
        held = _locks.get(os.path.realpath(self._save_dir or ""))
        if held is None or held[1]() is not self:
            raise CollectorError(
                f"{self._save_dir} was taken over by another MemoryCollector of the folder, made while this collector's "
                "run went on (the newest collector of a folder writes it, as after a run that failed), or released by "
                "this collector's close(): this run writes nothing there, so as not to replace that collector's chain "
                "files. Give each collector a save_dir of its own, or make the next one once this run's "
                "postprocess_save has returned"
            )

    def finalize(self, chain_id: int) -> None:
        """Finalize one chain (see :meth:`finalize_chains`)."""
        self.finalize_chains([chain_id])

    def finalize_chains(self, chain_ids: Sequence[int]) -> None:
        """With ``save_dir``, write ``chain_{id}.npz`` of each chain, then remove their checkpoints: the run is
        complete. A run killed in between resumes every chain; a ``chain_{id}.npz`` without its checkpoint is a
        finished run's, which a later run refuses to replace."""
        if self._save_dir is None:
            return
        self.refuse_missing_chains()
        self._refuse_folder_taken_over()
        make_folder(self._save_dir)
        for chain_id in chain_ids:
            _write_npz(
                os.path.join(self._save_dir, f"chain_{chain_id}.npz"), self._kept(chain_id, self._chains.ends[chain_id])
            )
        for chain_id in chain_ids:
            remove_checkpoint(os.path.join(self._save_dir, f"chain_{chain_id}{_CHECKPOINT}"))

    def finished(self, chain_id: int) -> Any:
        """The chain's samples in the structure of the sample, as numpy arrays of the samples kept.

        After :meth:`release`, the arrays handed over then, as long as the caller holds them; a
        :class:`~jaxstow.errors.CollectorError` once it does not.
        """
        if chain_id in self._samples:
            leaves = list(self._kept(chain_id, self._chains.ends[chain_id]).values())
            self._given[chain_id] = leaves
            return self._chains.layout(chain_id).treedef.unflatten(leaves)
        held = self._held(chain_id)
        if held is None:
            if not 0 <= chain_id < self._chains.next_id:
                self._chains.layout(chain_id)  # the error of a chain never registered
            raise CollectorError(
                f"the samples of chain {chain_id} were handed over when its run ended (postprocess_save returned "
                "them), and nothing holds them any more: keep what postprocess_save returns to use them later"
            )
        return held

    def _held(self, chain_id: int) -> Any:
        """The samples of a chain whose run is over, if the caller still holds every array of them."""
        if chain_id not in self._handed:
            return None
        treedef, references = self._handed[chain_id]
        leaves = [reference() for reference in references]
        return None if any(leaf is None for leaf in leaves) else treedef.unflatten(leaves)

    def release(self, chain_id: int) -> None:
        """Keep nothing of the chain: the arrays :meth:`finished` handed over are the caller's, and their memory goes
        back to :mod:`~jaxstow.io.host_buffers` for the next run once the caller drops them."""
        if chain_id not in self._samples:
            return
        leaves = self._given.pop(chain_id, None) or list(self._kept(chain_id, self._chains.ends[chain_id]).values())
        self._handed[chain_id] = (self._chains.layout(chain_id).treedef, [weakref.ref(leaf) for leaf in leaves])
        del self._samples[chain_id]
        self._chains.drop(chain_id)
        if not self._samples:
            self.close()

    def resume(self) -> Mapping[int, ChainCheckpoint]:
        """Restore the data loader's state; the checkpoints the registered chains continue from."""
        if not self._samples and self._save_dir and any(map(_CHECKPOINT_FILE.match, _listed(self._save_dir))):
            raise resumed_before_init(self._save_dir)
        return self._chains.resume()


def _listed(folder: str) -> list[str]:
    return os.listdir(folder) if os.path.isdir(folder) else []


def _stopped_chains(save_dir: str) -> list[int]:
    """The chains whose checkpoints a run that stopped before it finished left in ``save_dir`` (a commit of them that
    a crash cut short finished or forgotten first)."""
    chains = {int(found[1]) for name in os.listdir(save_dir) if (found := _CHECKPOINT_FILE.match(name))}
    for chain_id in chains:
        settle(chain_id, os.path.join(save_dir, f"chain_{chain_id}{_CHECKPOINT}"))
    return [chain_id for chain_id in chains if os.path.exists(os.path.join(save_dir, f"chain_{chain_id}{_CHECKPOINT}"))]


def _write_npz(path: str, samples: dict[str, np.ndarray]) -> None:
    """A chain's ``chain_{id}.npz`` as ``numpy.savez`` writes it, a member per leaf named by its path, all or nothing;
    dtypes numpy lacks (bfloat16, float8, int4) as :func:`~jaxstow.save` writes them, raw bytes with their dtypes in
    a jaxstow manifest (the member ``__jaxstow__``)."""
    if not all(stores_exactly(array.dtype) for array in samples.values()):
        save(path, samples)
        return
    with atomic_sink(path) as sink:
        write_container(sink, "npz", list(samples.items()), None)
