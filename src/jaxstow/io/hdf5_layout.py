"""Where an :class:`~jaxstow.io.HDF5Collector`'s file keeps each chain's samples and checkpoints, how a chain's
datasets are made and named (and read back under which names), how the datasets a file holds differ from those of a
run, and how a block of rows is written into a chain's chunked datasets and read back.

>>> import os, tempfile, h5py, numpy as np
>>> from jaxstow.io.chains import SampleLayout
>>> from jaxstow.io.hdf5_layout import checkpoint_path, layout_problems
>>> path = os.path.join(tempfile.mkdtemp(), "samples.h5")
>>> os.path.basename(checkpoint_path(path))
'samples.h5.checkpoint.jxs'
>>> with h5py.File(path, "w") as file:
...     file["chain~0/w"] = np.zeros((5, 3), np.float32)
...     layout_problems(file, 0, SampleLayout.of({"w": np.zeros(2, np.float32)}))
['/chain~0/w: the file holds float32[5, 3], the run samples float32[*, 2]']
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxstow._util.optional import require
from jaxstow.errors import ArgumentError, FormatError, excerpt
from jaxstow.io import host_buffers
from jaxstow.io.batching import block_rows
from jaxstow.io.chains import SampleLayout
from jaxstow.io.dictionize import joined_names
from jaxstow.io.hdf5_dtypes import as_sample, as_stored, mark, sample_dtype, stored_dtype

__all__ = [
    "DIRECT_CHUNK_BYTES",
    "DRAWS_DONE",
    "RUN_ID",
    "WARMUP_GROUP",
    "checked_compression",
    "checkpoint_path",
    "create_datasets",
    "dataset_name",
    "group_name",
    "layout_problems",
    "new_draws_done",
    "read_whole",
    "run_id_of",
    "readable",
    "variable_names",
    "write_block",
    "write_hyperslab",
]

#: Chunks of at least this many bytes are read back raw, one call each; smaller ones in one read of the rows.
DIRECT_CHUNK_BYTES = 256 << 10
#: At most this many rows per chunk. Every leaf's chunks hold the rows of one block of ``io.save`` (a power of two, at
#: most 1 MiB of samples and an eighth of the declared count; see ``batching.block_rows``), so that full blocks fill
#: whole chunks, and a chain's last chunk, written whole however few of its rows are kept, stays small.
_MAX_CHUNK_ROWS = 4096
#: The most bytes of rows a chain's datasets are made with; more grow as blocks arrive.
_MOST_BYTES_MADE = 1 << 30
#: The dataset that counts, per chain, the samples written to the file so far.
DRAWS_DONE = "draws_done"
#: The file's attribute that names, at random, the run that started it empty (made with ``/draws_done``): a reader
#: that finds another one after its read knows that the file was emptied and written again meanwhile.
RUN_ID = "jaxstow_run_id"
#: The root attribute of a file of ``io.run_chains`` that records what started the run: compared when it is continued.
RUN_ATTRIBUTE = "jaxstow_run"
#: The group of the warm-up results of ``io.run_chains``, one dataset per result, shaped ``(chains, ...)``.
WARMUP_GROUP = "warmup"


def new_draws_done(file: Any) -> Any:
    """Create ``/draws_done`` in a file that a run starts empty, and give the file a new :data:`RUN_ID`."""
    counts = file.create_dataset(DRAWS_DONE, shape=(0,), maxshape=(None,), chunks=(64,), dtype="i8")
    file.attrs[RUN_ID] = secrets.token_hex(16)
    return counts


def run_id_of(file: Any, name: str) -> str | None:
    """The :data:`RUN_ID` of the open ``file`` (``name``), ``None`` where it has none; one that is no string (an array,
    a number) is a :class:`~jaxstow.errors.FormatError`: no collector writes it."""
    found = file.attrs.get(RUN_ID)
    if found is None or isinstance(found, str):
        return found
    raise FormatError(
        f"has the attribute {RUN_ID} {excerpt(found)}, where a collector writes a string: the file was damaged, or "
        "changed by something other than jaxstow's collectors",
        file=name,
    )


def checkpoint_path(filename: str, folder: str | None = None) -> str:
    """The checkpoint file of an HDF5 file's chains: ``<file name>.checkpoint.jxs`` in ``folder`` (or beside it)."""
    folder = os.path.dirname(os.path.abspath(filename)) if folder is None else folder
    return os.path.join(folder, f"{os.path.basename(filename)}.checkpoint.jxs")


def group_name(chain_id: int) -> str:
    """The group of a chain's datasets (or its one dataset, for a sample that is one array)."""
    return f"/chain~{chain_id}"


def dataset_name(chain_id: int, name: str) -> str:
    """The dataset of a chain's leaf, named by its dict keys joined by ``/`` (``""`` for a sample that is one array)."""
    return f"{group_name(chain_id)}/{name}" if name else group_name(chain_id)


def checked_compression(h5py: Any, compression: Any) -> None:
    """Refuse a ``compression`` that h5py cannot make a dataset with (an unknown filter, a gzip level past 9), tried on
    a file in memory: an :class:`~jaxstow.errors.ArgumentError` before the collector opens its file."""
    if compression is None:
        return
    try:
        with h5py.File(secrets.token_hex(8), "w", driver="core", backing_store=False) as probe:
            probe.create_dataset("probe", shape=(1,), chunks=(1,), dtype="f4", compression=compression)
    except (ValueError, TypeError) as error:
        raise ArgumentError(
            f"HDF5Collector's compression={compression!r} cannot be used ({error}): give 'gzip' (or a gzip level, "
            "0 to 9), 'lzf', another filter installed in HDF5, or None"
        ) from None


def create_datasets(
    file: Any, chain_id: int, layout: SampleLayout, capacity: int, compression: str | None
) -> list[Any]:
    """Create the chain's datasets, of ``capacity`` rows each, growing along the rows; a leaf of a dtype that HDF5
    lacks held as :mod:`~jaxstow.io.hdf5_dtypes` says."""
    _check_names(layout.names)
    datasets = []
    # Made at most _MOST_BYTES_MADE: a capacity declared far above the samples kept (2**62) is not trimmed row by row.
    capacity = min(capacity, max(_MAX_CHUNK_ROWS, _MOST_BYTES_MADE // max(1, layout.row_bytes)))
    rows = block_rows(layout.row_bytes, capacity, _MAX_CHUNK_ROWS)
    for name, shape, dtype in zip(layout.names, layout.shapes, layout.dtypes, strict=True):
        dataset = file.create_dataset(
            dataset_name(chain_id, name),
            shape=(capacity, *shape),
            # A chunk holds at least one element: an axis of none may grow, so that the chunk fits it.
            maxshape=(None, *(size or None for size in shape)),
            chunks=(rows, *(size or 1 for size in shape)),
            dtype=stored_dtype(dtype),
            compression=compression,
        )
        mark(dataset, dtype)
        datasets.append(dataset)
    return datasets


def variable_names(names: Sequence[str]) -> list[str]:
    """The names that the readers give a chain's datasets, named ``names`` in its group: their keys joined by ``.``,
    a key's ``%2F`` and ``%25`` read as the ``/`` and ``%`` they stand for (a ``/`` in a key, such as a numpyro site's
    of ``numpyro.handlers.scope``, is written so: it would make a group).

    >>> variable_names(["theta", "g%2Fmu", "a/b"])
    ['theta', 'g/mu', 'a.b']

    Raises:
        ArgumentError: Two datasets get one name.
    """
    keys = [
        tuple(key.replace("%2F", "/").replace("%25", "%") for key in name.split("/")) if name else () for name in names
    ]
    return joined_names(keys, ".")


def _check_names(names: Sequence[str]) -> None:
    """Refuse the leaves of a sample, named ``names``, that the file or its readers cannot tell apart."""
    groups = {name[:end] for name in names for end, char in enumerate(name) if char == "/"}
    for name in names:
        if (name or len(names) > 1) and {"", "."} & set(name.split("/")):  # "": the sample is one array
            raise ArgumentError(
                f"the sample leaf {name!r} has an empty key or the key '.', which no dataset of an HDF5 file can be "
                "named by: rename the key"
            )
        if "\x00" in name:  # HDF5 ends a name there: "a\x00b" would be "a", and "\x00" empty
            raise ArgumentError(f"the sample leaf {name!r} has a key holding a NUL character ('\\x00'): rename the key")
        if name in groups:
            raise ArgumentError(
                f"the sample leaf {name!r} would be a dataset of the HDF5 file where the leaves under {name + '/'!r} "
                "need a group of that name: rename one of them"
            )
    variable_names(names)


def layout_problems(file: Any, chain_id: int, layout: SampleLayout, rows: int = 0) -> list[str]:
    """How the chain's datasets in ``file`` differ from ``layout`` (and from holding ``rows`` samples, counted in
    ``/draws_done``)."""
    h5py = require("h5py", extra="h5py", purpose="HDF5Collector")
    group = file[group_name(chain_id)]
    held = {"": group} if isinstance(group, h5py.Dataset) else {}  # a sample that is one array: no group
    if isinstance(group, h5py.Group):
        group.visititems(lambda name, item: held.update({name: item}) if isinstance(item, h5py.Dataset) else None)
    problems = []
    for name, shape, dtype in zip(layout.names, layout.shapes, layout.dtypes, strict=True):
        where, dataset = dataset_name(chain_id, name), held.pop(name, None)
        wanted = f"{dtype}[*, {', '.join(map(str, shape))}]".replace(", ]", "]")
        if dataset is None:
            problems.append(f"{where}: the run samples {wanted}, the file does not hold it")
        elif dataset.shape[1:] != shape or sample_dtype(dataset) != dtype:
            held_now = f"{sample_dtype(dataset)}{list(dataset.shape)}"
            problems.append(f"{where}: the file holds {held_now}, the run samples {wanted}")
        elif len(dataset) < rows:
            problems.append(f"{where}: the file holds {len(dataset)} samples, the checkpoint counts {rows}")
    counts = file.get(DRAWS_DONE)
    counted = int(counts[chain_id]) if counts is not None and chain_id < len(counts) else 0
    if counted < rows:  # an older copy of the file beside a newer checkpoint: the rows between are not in it
        problems.append(f"/{DRAWS_DONE}: the file counts {counted} samples of chain {chain_id}, the checkpoint {rows}")
    problems += [
        f"{dataset_name(chain_id, name)}: the file holds {item.dtype}{list(item.shape)}, the run does not sample it"
        for name, item in held.items()
    ]
    return problems


def write_block(datasets: Sequence[Any], first: int, end: int, values: Sequence[np.ndarray]) -> None:
    """Write rows ``first:end`` of each leaf's dataset (grown as needed): the whole chunks they cover as raw chunks,
    the rest as hyperslabs."""
    for dataset, value in zip(datasets, values, strict=True):
        if len(dataset) < end:
            dataset.resize(max(end, 2 * len(dataset)), axis=0)
        if value.size == 0:  # rows of no element: the dataset's length holds them
            continue
        value = as_stored(value)
        chunk = dataset.chunks[0]
        head, tail = end, end
        if dataset.id.get_create_plist().get_nfilters() == 0:  # raw chunks only where no filter transforms them
            head = min(end, -(-first // chunk) * chunk)
            tail = max(head, end // chunk * chunk)
        write_hyperslab(dataset, first, value[: head - first])
        for start in range(head, tail, chunk):
            offset = (start, *(0 for _ in value.shape[1:]))
            raw = np.ascontiguousarray(value[start - first : start - first + chunk])
            with _hdf5_lock():  # h5py < 3.16 calls H5DOwrite_chunk without its lock, and without the GIL
                dataset.id.write_direct_chunk(offset, raw)
        write_hyperslab(dataset, tail, value[tail - first :])


def _hdf5_lock() -> Any:
    """h5py's lock around every call into HDF5 (a library not built for threads), which h5py before 3.16 does not
    take in ``DatasetID.write_direct_chunk`` and ``read_direct_chunk``: they would run in HDF5 beside another
    thread's h5py call (h5py/h5py#2764). Reentrant, so harmless where h5py takes it itself."""
    from h5py._objects import phil

    return phil


def write_hyperslab(dataset: Any, first: int, value: np.ndarray) -> None:
    """Write ``value`` at row ``first`` as one hyperslab, without h5py's slicing machinery."""
    if len(value):
        h5py = require("h5py", extra="h5py", purpose="HDF5Collector")
        rows = dataset.id.get_space()
        rows.select_hyperslab((first, *(0 for _ in value.shape[1:])), value.shape)
        dataset.id.write(h5py.h5s.create_simple(value.shape), rows, np.ascontiguousarray(value))


def read_whole(dataset: Any) -> np.ndarray:
    """Every row of ``dataset``, read into memory that earlier arrays gave back (:mod:`~jaxstow.io.host_buffers`): the
    whole chunks of at least :data:`DIRECT_CHUNK_BYTES` as raw chunks where no filter transforms them (as
    :func:`write_block` writes them, without HDF5's copy through its own buffers), the rest as one hyperslab (smaller
    chunks cost more as calls of their own than that copy)."""
    out = host_buffers.empty(dataset.id.shape, dataset.id.dtype)
    if out.size == 0:
        return as_sample(dataset, out)
    rows, whole = len(out), 0
    chunk = dataset.chunks[0] if out.nbytes >= DIRECT_CHUNK_BYTES and dataset.chunks else 0
    if chunk * (out.nbytes // rows) >= DIRECT_CHUNK_BYTES and dataset.id.get_create_plist().get_nfilters() == 0:
        whole = rows // chunk * chunk
        raw, row_bytes = out.reshape(-1).view(np.uint8), out.nbytes // rows
        for start in range(0, whole, chunk):
            offset = (start, *(0 for _ in out.shape[1:]))
            with _hdf5_lock():  # as in write_block
                dataset.id.read_direct_chunk(offset, out=raw[start * row_bytes : (start + chunk) * row_bytes])
    h5py = require("h5py", extra="h5py", purpose="HDF5Collector")
    if whole == 0:
        dataset.id.read(h5py.h5s.ALL, h5py.h5s.ALL, out)
    elif whole < rows:
        space = dataset.id.get_space()
        space.select_hyperslab((whole, *(0 for _ in out.shape[1:])), out[whole:].shape)
        dataset.id.read(h5py.h5s.create_simple(out[whole:].shape), space, out[whole:])
    return as_sample(dataset, out)


def readable(dataset: Any) -> Any:
    """``dataset`` as a run on a file given open hands it over: itself, or its rows read, if it holds a dtype that
    HDF5 lacks (h5py would give its values as raw bytes)."""
    return dataset if sample_dtype(dataset) == dataset.dtype else read_whole(dataset)
