"""The samples an :class:`~jaxstow.io.HDF5Collector`'s file holds, read while its run may still go on.

A chain that finished has the attribute ``sample_count``; one that is still running counts its written samples in
``/draws_done``, which its writer updates only after the rows reach the file. Reading that count first, then the
rows up to it, never shows a torn block.

>>> import os, tempfile, h5py, jax, jax.numpy as jnp
>>> from jaxstow import io
>>> from jaxstow.io.live import read_draws
>>> path = os.path.join(tempfile.mkdtemp(), "samples.h5")
>>> file = h5py.File(path, "w", libver="latest")
>>> init_save, save, postprocess_save = io.save(io.HDF5Collector(file), block_size=2)
>>> state = init_save({"w": jnp.zeros(2)}, None, io.scheduler.static_information(samples_collected=5))
>>> file.swmr_mode = True                      # every chain is registered: readers may come
>>> for step in range(5):
...     state, _ = save(state, True, {"w": jnp.full(2, step, jnp.float32)})
>>> draws = read_draws(path)     # what another process sees while the run goes on (blocks of 2 are being written)
>>> draws.finished, draws.done[0] in (0, 2, 4)
(False, True)
>>> result = postprocess_save(state, None)
>>> draws = read_draws(path)
>>> draws.finished, draws.done, draws.chains[0]["w"][:, 0]
(True, [5], array([0., 1., 2., 3., 4.], dtype=float32))
>>> file.close()
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from typing import Any

import numpy as np

from jaxstow._util.optional import require
from jaxstow.errors import FormatError
from jaxstow.io.hdf5 import DRAWS_DONE
from jaxstow.io.swmr import open_for_reading

__all__ = ["FileDraws", "read_draws"]

_CHAIN_GROUP = re.compile(r"chain~(\d+)")


@dataclasses.dataclass(frozen=True)
class FileDraws:
    """Per chain (in the order of their ids): its variables (dict keys joined by ``.``) with the samples written so
    far, and their number; ``finished`` once every chain's run has ended."""

    chains: list[dict[str, np.ndarray]]
    done: list[int]
    finished: bool


def read_draws(source: Any) -> FileDraws:
    """The samples in an HDF5Collector's file: a path (opened in SWMR mode where it can be) or an open ``h5py.File``."""
    if isinstance(source, str | os.PathLike):
        with open_for_reading(source) as file:
            return _read(file, name=os.fspath(source))
    return _read(source, name=str(getattr(source, "filename", source)))


def _read(file: Any, *, name: str) -> FileDraws:
    h5py = require("h5py", extra="h5py", purpose=f"reading the samples of {name}")
    following = file.mode == "r" and file.swmr_mode  # a reader of a live file: see what the writer added since
    items = sorted(
        (int(match.group(1)), item)
        for key, item in file.items()
        if (match := _CHAIN_GROUP.fullmatch(key)) and isinstance(item, h5py.Group | h5py.Dataset)
    )
    if not items:
        raise FormatError("holds no /chain~{id} group: it was not written by an HDF5Collector", file=name)
    counts = file.get(DRAWS_DONE)
    if counts is not None:
        if following:
            counts.refresh()
        counts = counts[()]  # first the counts, then the rows they count
    chains, done, finished = [], [], True
    for chain, item in items:
        count = item.attrs.get("sample_count")
        if count is None:
            finished = False
            if counts is None or chain >= len(counts):
                raise FormatError(
                    f"chain {chain} has no sample_count: its run did not finish (postprocess_save was not called), "
                    "and the file does not count the samples written so far",
                    file=name,
                    path=item.name,
                )
            count = counts[chain]
        datasets = {"": item} if isinstance(item, h5py.Dataset) else {}
        if isinstance(item, h5py.Group):
            item.visititems(functools.partial(_collect, datasets, h5py.Dataset))
        variables = {}
        for key, dataset in datasets.items():
            if following:
                dataset.refresh()
            variables[key.replace("/", ".")] = dataset[: int(count)]
        chains.append(variables)
        done.append(int(count))
    return FileDraws(chains, done, finished)


def _collect(datasets: dict[str, Any], kind: type, key: str, node: Any) -> None:
    if isinstance(node, kind):
        datasets[key] = node
