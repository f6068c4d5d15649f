"""One process of a ``jax.distributed`` run, started by the host-budget test:
``budget_worker.py PROCESS COUNT PORT FOLDER LIMIT_MIB``, two CPU devices per process, taken as an accelerator's.

It saves step 1 of 64 MiB split over every device of the run and 2 parameters of 8 MiB replicated on each (each
process writes half of each copy) within ``LIMIT_MIB`` (``default``: the default budget), deletes them once save
returns and makes the next step's in their place, as a training loop does, then restores the step. It prints one
JSON line: the host memory the save held beyond what was resident before it (``extra_mib``) and whether every shard
it restored is the one it saved (``same``).
"""

from __future__ import annotations

import json
import os
import sys
import time

process, count, port, folder, limit_mib = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:6]
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=count, process_id=process)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxstow  # noqa: E402
from jaxstow._write import encoded, host_budget  # noqa: E402

host_budget._HOST_PLATFORMS = frozenset()  # the CPU's arrays taken down an accelerator's path
host_budget._accelerators_present = lambda: True


class SlowStorage:
    """A file that takes its bytes at 64 MiB/s, as a network file system might: the next step's arrays are made
    while the save still writes."""

    def __init__(self, file):
        self._file = file

    def write(self, data):
        time.sleep(memoryview(data).nbytes / (64 << 20))
        return self._file.write(data)

    def __getattr__(self, name):
        return getattr(self._file, name)


encoded._counted = lambda sink, bar: SlowStorage(sink)

mesh = jax.make_mesh((len(jax.devices()),), ("x",))
split, copied = NamedSharding(mesh, P("x")), NamedSharding(mesh, P())


def made(value: float) -> dict[str, jax.Array]:
    """64 MiB split over the run's devices, and 2 parameters of 8 MiB copied on each device."""
    full = jax.jit(lambda v: jnp.full((4096, 1024), v, jnp.float32) + jnp.arange(1024.0), out_shardings=split)
    tree = {f"split{i}": full(value + i) for i in range(4)}
    whole = jax.jit(
        lambda v: jnp.full((2048, 1024), v, jnp.float32) + jnp.arange(2048.0)[:, None], out_shardings=copied
    )
    return jax.block_until_ready(tree | {f"copied{i}": whole(value - i) for i in range(2)})


def peak_kib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM"))


limit = None if limit_mib == "default" else int(limit_mib) << 20
with jaxstow.CheckpointManager(folder, host_memory_limit=limit) as manager:
    manager.save(0, made(-1))  # jax, its threads, the programs that cut pieces and the lock settle first
    manager.wait()
    tree = made(0)
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # the peak restarts from what is resident now, the tree included
    before = peak_kib()
    manager.save(1, tree)
    for array in tree.values():
        array.delete()  # the next step's arrays take the place of these
    del tree
    tree = made(100)
    manager.wait()
    extra = (peak_kib() - before) / 1024
    like = {
        name: jax.ShapeDtypeStruct(array.shape, array.dtype, sharding=array.sharding) for name, array in tree.items()
    }
    restored = manager.restore(1, like=like)
    expected = made(0)
    same = all(
        np.array_equal(np.asarray(got.data), np.asarray(want.data))
        for name in expected
        for got, want in zip(restored[name].addressable_shards, expected[name].addressable_shards, strict=True)
    )
print(json.dumps({"process": process, "extra_mib": extra, "same": same}), flush=True)
jax.distributed.shutdown()
