"""``HDF5Collector``: the samples of every chain in an HDF5 file, written by a background thread.

The file holds one dataset per leaf of the sample at ``/chain~{id}/<keys>`` (the keys of
:func:`~jaxstow.io.pytree_to_dict` joined by ``/``), of shape ``(samples, *leaf)`` and the leaf's dtype. Datasets
are chunked and resizable: they grow as blocks arrive and are trimmed to the samples kept when the run ends, when
``/chain~{id}`` also gets the attribute ``sample_count``.

>>> import os, tempfile, h5py, jax, jax.numpy as jnp
>>> from jaxstow import io
>>> file = h5py.File(os.path.join(tempfile.mkdtemp(), "samples.h5"), "w")
>>> init_save, save, postprocess_save = io.save(io.HDF5Collector(file))
>>> state = init_save({"w": jnp.zeros(3), "loss": 0.0}, None, io.scheduler.static_information(samples_collected=100))
>>> def step(state, i):
...     return save(state, i % 2 == 1, {"w": jnp.full(3, i, jnp.float32), "loss": i / 10})
>>> state, _ = jax.lax.scan(step, state, jnp.arange(8))
>>> postprocess_save(state, None)["sample_count"]
Array(4, dtype=int32, weak_type=True)
>>> file["/chain~0/w"].shape, file["/chain~0/loss"][:], file["/chain~0"].attrs["sample_count"]
((4, 3), array([0.1, 0.3, 0.5, 0.7], dtype=float32), np.int64(4))
>>> file.close()
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxstow._util.optional import require
from jaxstow.errors import ArgumentError
from jaxstow.io.batching import block_rows
from jaxstow.io.chains import ChainBook, SampleLayout, read_checkpoint, remove_checkpoint, write_checkpoint
from jaxstow.io.collector import ChainCheckpoint, DataCollector, DataLoader
from jaxstow.io.scheduler import static_information as StaticInformation
from jaxstow.io.writer import BackgroundWriter

__all__ = ["HDF5Collector"]

#: At most this many rows per chunk. Every leaf's chunks hold the rows of one block of ``io.save`` (a power of two, at
#: most 1 MiB of samples and an eighth of the declared count; see ``batching.block_rows``), so that full blocks fill
#: whole chunks, and a chain's last chunk, written whole however few of its rows are kept, stays small.
_MAX_CHUNK_ROWS = 4096
_DISK_DRIVERS = ("sec2", "stdio", "direct")
_DESCRIPTOR_DRIVERS = ("sec2", "direct")  # whose file handle is a file descriptor, to fsync


class HDF5Collector(DataCollector):
    """Save to hdf5 format.

    Samples (and, next to the file, checkpoints) of every chain go to ``file``, an open ``h5py.File``, and can be
    viewed with any HDF5 viewer. Writing happens on a background thread; :meth:`finalize` waits for it.
    ``compression`` is passed to ``h5py`` (``"gzip"``, ``"lzf"``, ...).

    Checkpoints are jaxstow files named ``<file name>.chain~{id}.checkpoint.jxs`` in ``checkpoint_dir`` (by default
    the file's folder). At every checkpoint the file is flushed to disk before the checkpoint is committed, and the
    collector holds the file's HDF5 metadata in memory between flushes, so that a crash leaves the file as it was at
    the last checkpoint. (With ``compression``, HDF5 may move a chunk that was rewritten after the checkpoint; resuming
    after a crash is then not guaranteed.) Open the file in mode ``"a"`` to resume: a chain with a checkpoint
    continues from it, a chain that was interrupted before its first checkpoint starts again.

    >>> import tempfile
    >>> tf = tempfile.TemporaryFile()
    >>>
    >>> import h5py
    >>> from jaxstow import io
    >>>
    >>> file = h5py.File(tf, "w") # Use a real file for real saving
    >>> data_collector = io.HDF5Collector(file)
    >>> saving = io.save(data_collector)
    >>>
    >>> # ... use the solver ...
    >>>
    >>> # Close the file
    >>> file.close()
    """

    def __init__(
        self,
        file: Any,
        *,
        compression: str | None = None,
        checkpoint_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        h5py = require("h5py", extra="h5py", purpose="HDF5Collector")
        if not isinstance(file, h5py.File):
            raise ArgumentError(f"HDF5Collector needs an open h5py.File, got {type(file).__name__}")
        self._h5py = h5py
        self._file = file
        self._compression = compression
        if checkpoint_dir is not None:
            self._checkpoint_dir: str | None = os.fspath(checkpoint_dir)
        elif file.driver in _DISK_DRIVERS:
            self._checkpoint_dir = os.path.dirname(os.path.abspath(file.filename))
        else:
            self._checkpoint_dir = None
        self._chains = ChainBook()
        self._datasets: list[list[Any]] = []
        self._writer = BackgroundWriter(f"jaxstow-hdf5-{os.path.basename(file.filename)}")
        _hold_metadata_in_memory(file)

    def _group(self, chain_id: int) -> str:
        return f"/chain~{chain_id}"

    def _checkpoint_path(self, chain_id: int) -> str | None:
        if self._checkpoint_dir is None:
            return None
        name = f"{os.path.basename(self._file.filename)}.chain~{chain_id}.checkpoint.jxs"
        return os.path.join(self._checkpoint_dir, name)

    def register_data_loader(self, data_loader: DataLoader) -> None:
        """Register a data loader whose state is checkpointed with the chains."""
        self._chains.data_loader = data_loader

    def register_chain(
        self,
        init_sample: Any = None,
        init_checkpoint: Any = None,
        static_information: StaticInformation | None = None,
    ) -> int:
        """Create the chain's datasets, or reopen them to continue from the chain's checkpoint."""
        layout = SampleLayout.of(init_sample)
        chain_id = len(self._datasets)
        path = self._checkpoint_path(chain_id)
        stored = None if path is None else read_checkpoint(path)
        if stored is None:
            capacity = static_information.samples_collected if static_information is not None else None
            self._datasets.append(self._create(chain_id, layout, capacity or 0))
            return self._chains.add(layout, None)
        self._datasets.append(self._reopen(chain_id, layout, stored[0].sample_count))
        return self._chains.add(layout, stored[0])

    def _dataset_name(self, chain_id: int, name: str) -> str:
        return f"{self._group(chain_id)}/{name}" if name else self._group(chain_id)

    def _create(self, chain_id: int, layout: SampleLayout, capacity: int) -> list[Any]:
        group = self._group(chain_id)
        if group in self._file:
            if "sample_count" in self._file[group].attrs:
                raise FileExistsError(
                    f"{self._file.filename} already holds the samples of a finished run at {group}; "
                    "open the file with mode 'w' to replace them, or use another file"
                )
            del self._file[group]  # interrupted before its first checkpoint: start again
        datasets = []
        rows = block_rows(layout.row_bytes, capacity, _MAX_CHUNK_ROWS)
        for name, shape, dtype in zip(layout.names, layout.shapes, layout.dtypes, strict=True):
            datasets.append(
                self._file.create_dataset(
                    self._dataset_name(chain_id, name),
                    shape=(capacity, *shape),
                    maxshape=(None, *shape),
                    chunks=(rows, *shape),
                    dtype=dtype,
                    compression=self._compression,
                )
            )
        return datasets

    def _reopen(self, chain_id: int, layout: SampleLayout, sample_count: int) -> list[Any]:
        datasets = []
        for name, shape, dtype in zip(layout.names, layout.shapes, layout.dtypes, strict=True):
            dataset_name = self._dataset_name(chain_id, name)
            dataset = self._file.get(dataset_name)
            found = "nothing" if dataset is None else f"{dataset.dtype}{list(dataset.shape)}"
            if dataset is None or dataset.shape[1:] != shape or dataset.dtype != dtype or len(dataset) < sample_count:
                raise ValueError(
                    f"{self._file.filename}: the checkpoint of chain {chain_id} counts {sample_count} samples, so "
                    f"{dataset_name} should be {dtype}[{sample_count}+, {', '.join(map(str, shape))}], but the file "
                    f"has {found}; delete {self._checkpoint_path(chain_id)} to start the chain again"
                )
            datasets.append(dataset)
        return datasets

    def save(self, chain_id: int, first: int, values: Sequence[np.ndarray]) -> None:
        """Queue a block of samples for writing."""
        end = self._chains.received(chain_id, first, values)
        self._writer.submit(functools.partial(self._write, self._datasets[chain_id], first, end, values))

    def _write(self, datasets: list[Any], first: int, end: int, values: Sequence[np.ndarray]) -> None:
        """Write rows ``first:end``: the whole chunks they cover as raw chunks, the rest as hyperslabs."""
        for dataset, value in zip(datasets, values, strict=True):
            if len(dataset) < end:
                dataset.resize(max(end, 2 * len(dataset)), axis=0)
            chunk = dataset.chunks[0]
            head, tail = end, end
            if dataset.id.get_create_plist().get_nfilters() == 0:  # raw chunks only where no filter transforms them
                head = min(end, -(-first // chunk) * chunk)
                tail = max(head, end // chunk * chunk)
            self._write_rows(dataset, first, value[: head - first])
            for start in range(head, tail, chunk):
                offset = (start, *(0 for _ in value.shape[1:]))
                dataset.id.write_direct_chunk(
                    offset, np.ascontiguousarray(value[start - first : start - first + chunk])
                )
            self._write_rows(dataset, tail, value[tail - first :])

    def _write_rows(self, dataset: Any, first: int, value: np.ndarray) -> None:
        """Write ``value`` at row ``first`` as one hyperslab, without h5py's slicing machinery."""
        if len(value):
            rows = dataset.id.get_space()
            rows.select_hyperslab((first, *(0 for _ in value.shape[1:])), value.shape)
            dataset.id.write(self._h5py.h5s.create_simple(value.shape), rows, np.ascontiguousarray(value))

    def checkpoint(self, chain_id: int, checkpoint: ChainCheckpoint) -> None:
        """Queue the checkpoint: after the blocks before it are written and flushed to disk, commit it atomically."""
        path = self._checkpoint_path(chain_id)
        if path is None:
            raise ValueError(
                f"the HDF5 file {self._file.filename} is not on disk, so checkpoints cannot go next to it: "
                "give HDF5Collector a checkpoint_dir"
            )
        record = self._chains.with_loader_state(chain_id, checkpoint)
        self._writer.submit(functools.partial(self._commit, path, record))

    def _commit(self, path: str, record: ChainCheckpoint) -> None:
        self._file.flush()
        if self._file.driver in _DESCRIPTOR_DRIVERS:
            os.fsync(self._file.id.get_vfd_handle())
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_checkpoint(path, record)

    def finalize(self, chain_id: int) -> None:
        """Wait for the writes, trim the datasets to the samples kept, record ``sample_count``, flush."""
        self._writer.wait()
        end = self._chains.ends[chain_id]
        for dataset in self._datasets[chain_id]:
            dataset.resize(end, axis=0)
        self._file[self._group(chain_id)].attrs["sample_count"] = end
        self._file.flush()
        path = self._checkpoint_path(chain_id)
        if path is not None:
            remove_checkpoint(path)

    def finished(self, chain_id: int) -> Any:
        """The chain's datasets, in the structure of the sample (read them with ``[:]``)."""
        return self._chains.layouts[chain_id].treedef.unflatten(self._datasets[chain_id])

    def resume(self) -> Mapping[int, ChainCheckpoint]:
        """Restore the data loader's state; the checkpoints the registered chains continue from."""
        return self._chains.resume()


def _hold_metadata_in_memory(file: Any) -> None:
    """Let HDF5 write the file's metadata only when it is flushed, never on its own in between."""
    config = file.id.get_mdc_config()
    config.incr_mode = config.decr_mode = config.flash_incr_mode = 0  # adaptive resizing off, as HDF5 requires
    config.evictions_enabled = False
    file.id.set_mdc_config(config)
