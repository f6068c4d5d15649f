"""One process of ``bench_distributed.py``: ``distributed_worker.py PROCESS COUNT DEVICES PORT FOLDER MIB``.

Builds a tree of float32 matrices (``MIB`` MiB in all) sharded over a global mesh of every process's devices, then
times, between barriers so that the slowest process sets the figure: jaxstow's save (durable: fsync), orbax's
save (``StandardCheckpointer``, then an fsync of its files), the raw limit (each process writes the bytes of its
replica-0 shards with ``tofile`` and fsyncs them), and the restores of both onto a mesh of another shape. Prints one
JSON line: seconds per method, bytes each process read and the bytes its devices hold.
"""

from __future__ import annotations

import json
import os
import sys
import time

process, count, devices, port, folder, mib = sys.argv[1:7]
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=int(count), process_id=int(process))

import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from jaxstow import CheckpointManager  # noqa: E402

SIDE = 2048  # 16 MiB per leaf
LEAVES = max(1, int(mib) // 16)


def fsync_tree(root: str) -> None:
    for where, _, files in os.walk(root):
        for name in files:
            descriptor = os.open(os.path.join(where, name), os.O_RDONLY)
            os.fsync(descriptor)
            os.close(descriptor)


def rchar() -> int:
    with open("/proc/self/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("rchar:"))


def timed(name: str, run) -> float:
    multihost_utils.sync_global_devices(f"before {name}")
    start = time.perf_counter()
    run()
    multihost_utils.sync_global_devices(f"after {name}")
    return time.perf_counter() - start


mesh = jax.make_mesh((2, len(jax.devices()) // 2), ("data", "model"))
saved = NamedSharding(mesh, P("data", "model"))
tree = {
    f"layer{i}": jax.make_array_from_callback(
        (SIDE, SIDE), saved, lambda index, i=i: np.full((SIDE, SIDE), i, np.float32)[index]
    )
    for i in range(LEAVES)
}
other = NamedSharding(jax.make_mesh((len(jax.devices()),), ("x",)), P(None, "x"))
abstract = {name: jax.ShapeDtypeStruct((SIDE, SIDE), np.float32, sharding=other) for name in tree}
me = int(process)
figures: dict[str, float] = {}


def jaxstow_save() -> None:
    with CheckpointManager(f"{folder}/jaxstow") as manager:
        manager.save(1, {"params": tree})


def orbax_save() -> None:
    import orbax.checkpoint as ocp

    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(f"{folder}/orbax", tree)
    checkpointer.wait_until_finished()
    fsync_tree(f"{folder}/orbax")


def raw_save() -> None:
    path = f"{folder}/raw.{me}"
    with open(path, "wb") as file:
        for array in tree.values():
            for shard in array.addressable_shards:
                if shard.replica_id == 0:
                    np.asarray(shard.data).tofile(file)
        file.flush()
        os.fsync(file.fileno())


def jaxstow_restore() -> None:
    with CheckpointManager(f"{folder}/jaxstow") as manager:
        jax.block_until_ready(manager.restore(like={"params": abstract}))


def orbax_restore() -> None:
    import orbax.checkpoint as ocp

    jax.block_until_ready(ocp.StandardCheckpointer().restore(f"{folder}/orbax", abstract))


for name, run in [("raw save", raw_save), ("jaxstow save", jaxstow_save), ("orbax save", orbax_save)]:
    figures[name] = timed(name, run)
held = sum(shard.data.nbytes for array in jax.tree.leaves(abstract and tree) for shard in array.addressable_shards)
for name, run in [("jaxstow restore", jaxstow_restore), ("orbax restore", orbax_restore)]:
    before = rchar()
    figures[name] = timed(name, run)
    figures[f"{name} bytes read"] = rchar() - before
needed = sum(np.prod(other.shard_shape((SIDE, SIDE))) * 4 * len(jax.local_devices()) for _ in tree)
print(json.dumps({"process": me, "figures": figures, "held": int(held), "needed": int(needed), "bytes": LEAVES * SIDE * SIDE * 4}))
jax.distributed.shutdown()
