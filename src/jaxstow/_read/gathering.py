"""Bytes gathered among a group of the processes of a ``jax.distributed`` run by jax's own collectives.

Each process of the group gives a row of bytes (the same length in each); one jitted identity whose output is
replicated over a mesh of one device per process all-gathers them: gloo or MPI on CPU, NCCL on GPU, ICI on TPU. No
socket of jaxstow's own is opened, and the caller decides when every process is ready (a collective cannot time out,
so it is entered only after a bounded barrier). One compiled gather per group and row length, kept for later restores.

>>> import numpy as np
>>> from jaxstow._read.gathering import available, gather_rows
>>> available()  # a single process has no one to gather from
False
>>> gather_rows((0,), np.arange(4, dtype=np.uint8))
array([[0, 1, 2, 3]], dtype=uint8)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

__all__ = ["available", "gather_rows"]

#: The implementations of jax's CPU collectives that reach across processes.
_CPU_ACROSS = ("gloo", "mpi")


def available() -> bool:
    """Whether this process can take part in collectives across processes: several processes, and on CPU a
    cross-process implementation of them (``jax.config.update("jax_cpu_collectives_implementation", "gloo")``, the
    default of recent jax versions)."""
    if jax.process_count() < 2:
        return False
    if jax.local_devices()[0].platform != "cpu":
        return True
    return getattr(jax.config, "jax_cpu_collectives_implementation", None) in _CPU_ACROSS or bool(
        getattr(jax.config, "jax_cpu_enable_gloo_collectives", False)
    )


@functools.cache
def _gather(group: tuple[int, ...]) -> tuple[NamedSharding, jax.Device, Callable[[jax.Array], jax.Array]]:
    """The rows' sharding over a mesh of the first device of each process of ``group``, this process's device in
    it, and the jitted identity that replicates them on every device of the mesh."""
    first: dict[int, jax.Device] = {}
    for device in sorted(jax.devices(), key=lambda device: device.id):
        first.setdefault(int(device.process_index), device)
    mesh = Mesh(np.array([first[process] for process in group]), ("processes",))
    by_process, everywhere = _specs()
    return (
        NamedSharding(mesh, by_process),
        first[jax.process_index()],
        jax.jit(lambda rows: rows, out_shardings=NamedSharding(mesh, everywhere)),
    )


def _specs() -> tuple[jax.sharding.PartitionSpec, jax.sharding.PartitionSpec]:
    """Rows split over the mesh's one axis, and replicated."""
    spec: Any = jax.sharding.PartitionSpec  # untyped in some jax versions
    return spec("processes"), spec()


def gather_rows(group: tuple[int, ...], row: np.ndarray) -> np.ndarray:
    """Every row that the processes of ``group`` (sorted, this one among them) give, in their order: a
    ``(len(group), len(row))`` array of ``uint8``. Every process of the group calls it with a row as long, at the
    same point of the same sequence of gathers."""
    if len(group) == 1:
        return row.reshape(1, -1)
    rows, device, gather = _gather(group)
    local = jax.device_put(row.reshape(1, -1), device)
    whole = jax.make_array_from_single_device_arrays((len(group), row.size), rows, [local])
    return np.asarray(gather(whole).addressable_data(0))
